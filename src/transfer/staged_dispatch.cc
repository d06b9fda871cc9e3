// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/staged_dispatch.h"

#include <vector>

#include "common/thread_pool.h"
#include "transfer/device/device_staging.h"

namespace larder::transfer {

// A slice moved by a CPU route through a pinned staging buffer: the route reports to it, and it
// to the engine once the bytes are where they belong.
struct StagedDispatch::StagedSlice final : SliceCallback {
  StagedSlice(StagedDispatch* d, Transport* t, RemoteSegment* r, Slice* s)
      : dispatch(d), transport(t), remote(r), slice(s), device(s->local) {}

  // A read's bytes go to the device on the thread that received them, while they are in its
  // cache.
  void OnSliceDone(Slice* done, Status status) override {
    if (status.ok() && done->op == TransferOp::kRead) {
      status = dispatch->staging_->ToDevice(device, buffer.data(), slice->length);
    }
    dispatch->End(this, std::move(status));
  }

  // Hands the slice, now pointing at the buffer, to its route.
  void Submit() {
    slice->local = buffer.data();
    Slice* one[1] = {slice};
    transport->Submit(*remote, one, this);
  }

  StagedDispatch* dispatch;
  Transport* transport;
  RemoteSegment* remote;  // kept alive by the slice's batch
  Slice* slice;
  uint8_t* device;  // the slice's own local buffer
  DeviceStaging::Buffer buffer;
};

void StagedDispatch::Dispatch(Transport* transport, RemoteSegment& remote,
                              std::span<Slice* const> slices) {
  size_t staged = 0;
  if (transport != device_transport_) {
    for (Slice* s : slices) staged += s->local_device ? 1 : 0;
  }
  if (staged == 0) {
    transport->Submit(remote, slices, engine_);
    return;
  }
  std::vector<Slice*> direct;
  direct.reserve(slices.size() - staged);
  for (Slice* s : slices) {
    if (s->local_device) {
      Stage(transport, remote, s);
    } else {
      direct.push_back(s);
    }
  }
  if (!direct.empty()) transport->Submit(remote, direct, engine_);
}

void StagedDispatch::Stage(Transport* transport, RemoteSegment& remote, Slice* slice) {
  auto* staged = new StagedSlice(this, transport, &remote, slice);
  staging_->AcquireAsync(
      DeviceStaging::Pool::kInitiate, copy_pool_,
      [this, staged](Result<DeviceStaging::Buffer> buffer) {
        if (!buffer.ok()) return End(staged, buffer.status());
        if (Clock::now() >= staged->slice->deadline) {
          return End(staged, DeadlineExceededError("the request's deadline passed while it "
                                                   "waited for a pinned staging buffer"));
        }
        staged->buffer = std::move(buffer).value();
        if (staged->slice->op == TransferOp::kRead) return staged->Submit();
        copy_pool_->Schedule([this, staged] {
          Status copied =
              staging_->ToHost(staged->buffer.data(), staged->device, staged->slice->length);
          if (!copied.ok()) return End(staged, copied);
          staged->Submit();
        });
      });
}

void StagedDispatch::End(StagedSlice* staged, Status status) {
  Slice* slice = staged->slice;
  slice->local = staged->device;
  delete staged;  // its buffer goes back to the pool
  engine_->OnSliceDone(slice, std::move(status));
}

}  // namespace larder::transfer
