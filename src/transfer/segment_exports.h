// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The segments an engine exports, looked up by id by every server (the bootstrap service, the tcp
// data handlers, the shm handoff) and by the local route. Thread-safe: readers run under a shared
// lock, so a segment cannot be unregistered while a copy into it is running.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "larder/status.h"
#include "larder/transfer_engine.h"

namespace larder::transfer {

struct ExportedSegment {
  SegmentDescriptor descriptor;
  uint8_t* base = nullptr;
  std::shared_ptr<MemoryRegion> memory;  // null for caller-owned memory
};

class SegmentExports {
 public:
  // Assigns the id and epoch of a new segment named descriptor->name and holds that name, so that
  // transports can export the segment before anyone can see it. InvalidArgument for an empty
  // name; AlreadyExists when the name is taken or being registered.
  Status Reserve(SegmentDescriptor* descriptor);
  // Makes a reserved segment visible: listed, and accessible at [base, base + size).
  void Publish(SegmentDescriptor descriptor, uint8_t* base, std::shared_ptr<MemoryRegion> memory);
  // Drops a reservation that will not be published.
  void Abandon(const std::string& name);
  // Waits for running accesses, then removes. NotFound for unknown ids.
  Status Remove(SegmentId id);
  std::vector<SegmentDescriptor> List() const;

  // Checks [offset, offset + length) against segment `id` and runs fn(base + offset) under the
  // shared lock, for CPU access. NotFound / OutOfRange (overflow included) otherwise, and
  // FailedPrecondition for device memory, which only the device route may touch.
  template <typename Fn>
  Status Access(SegmentId id, uint64_t offset, uint64_t length, Fn&& fn) const {
    ReaderLock lock(mu_);
    auto it = segments_.find(id);
    if (it == segments_.end()) return UnknownSegment(id);
    if (it->second.descriptor.memory_kind == MemoryKind::kDevice) return DeviceSegment(id);
    LARDER_RETURN_IF_ERROR(CheckRange(it->second.descriptor, offset, length));
    fn(it->second.base + offset);
    return Status();
  }

  // As Access, for device segments only: fn(base + offset) gets a pointer that only the device
  // backend's copies may touch. FailedPrecondition for a segment that is not device memory.
  template <typename Fn>
  Status AccessDevice(SegmentId id, uint64_t offset, uint64_t length, Fn&& fn) const {
    ReaderLock lock(mu_);
    auto it = segments_.find(id);
    if (it == segments_.end()) return UnknownSegment(id);
    if (it->second.descriptor.memory_kind != MemoryKind::kDevice) {
      return FailedPreconditionError("segment " + std::to_string(id) + " is not device memory");
    }
    LARDER_RETURN_IF_ERROR(CheckRange(it->second.descriptor, offset, length));
    fn(it->second.base + offset);
    return Status();
  }
  // Whether segment `id` is device memory (false for unknown ids).
  bool IsDevice(SegmentId id) const {
    ReaderLock lock(mu_);
    auto it = segments_.find(id);
    return it != segments_.end() && it->second.descriptor.memory_kind == MemoryKind::kDevice;
  }

  // A copy of the entry (memory reference included). NotFound for unknown ids.
  Result<ExportedSegment> Get(SegmentId id) const;

  // OutOfRange unless 0 < length and offset + length <= size (without overflow).
  static Status CheckRange(const SegmentDescriptor& descriptor, uint64_t offset, uint64_t length);

 private:
  static Status UnknownSegment(SegmentId id);
  static Status DeviceSegment(SegmentId id);

  mutable SharedMutex mu_;
  std::map<SegmentId, ExportedSegment> segments_ LARDER_GUARDED_BY(mu_);
  std::set<std::string> reserved_ LARDER_GUARDED_BY(mu_);
  SegmentId next_id_ LARDER_GUARDED_BY(mu_) = 1;
};

}  // namespace larder::transfer
