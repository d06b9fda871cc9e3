// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// How the engine hands slices to a transport when it has a device transport: slices whose local
// buffer is device memory go to the CPU's routes through a pinned staging buffer
// (device/device_staging.h), the others as they are. Reads land in the buffer and are copied to
// the device on the thread that received them; writes are copied to the buffer on a copy thread
// first, so that one slice's device copy runs beside another's network transfer. A pool with no
// free buffer queues the slice (back-pressure). Each slice is reported to the engine exactly
// once, with its own local pointer back in place. Thread-safe.
#pragma once

#include <span>

#include "transfer/transport.h"

namespace larder {
class ThreadPool;
}

namespace larder::transfer {

class StagedDispatch {
 public:
  // `device_transport` moves device memory natively (it is never staged for); every pointer
  // outlives this object.
  StagedDispatch(DeviceStaging* staging, Transport* device_transport, ThreadPool* copy_pool,
                 SliceCallback* engine)
      : staging_(staging),
        device_transport_(device_transport),
        copy_pool_(copy_pool),
        engine_(engine) {}

  // Hands `slices` of one segment, opened on `transport` as `remote`, to that transport.
  void Dispatch(Transport* transport, RemoteSegment& remote, std::span<Slice* const> slices);

 private:
  struct StagedSlice;
  void Stage(Transport* transport, RemoteSegment& remote, Slice* slice);
  // The staged slice is over: its buffer goes back, its local pointer is its own again.
  void End(StagedSlice* staged, Status status);

  DeviceStaging* const staging_;
  Transport* const device_transport_;
  ThreadPool* const copy_pool_;
  SliceCallback* const engine_;
};

}  // namespace larder::transfer
