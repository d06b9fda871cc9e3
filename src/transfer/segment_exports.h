// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The segments an engine exports, looked up by id by every server (tcp data server, shm handoff)
// and by the local route. Thread-safe: readers run under a shared lock, so a segment cannot be
// unregistered while a copy into it is running.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <shared_mutex>
#include <string>
#include <vector>

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
  // Adds a segment described by `descriptor` (its id and epoch are assigned here).
  Result<SegmentId> Add(SegmentDescriptor descriptor, uint8_t* base,
                        std::shared_ptr<MemoryRegion> memory);
  // Waits for running accesses, then removes. NotFound for unknown ids.
  Status Remove(SegmentId id);
  std::vector<SegmentDescriptor> List() const;

  // Checks [offset, offset + length) against segment `id` and runs fn(base + offset) under the
  // shared lock, for CPU access. NotFound / OutOfRange (overflow included) otherwise, and
  // FailedPrecondition for device memory, which only the device route may touch.
  template <typename Fn>
  Status Access(SegmentId id, uint64_t offset, uint64_t length, Fn&& fn) const {
    std::shared_lock lock(mu_);
    auto it = segments_.find(id);
    if (it == segments_.end()) return UnknownSegment(id);
    if (it->second.descriptor.memory_kind == MemoryKind::kDevice) return DeviceSegment(id);
    LARDER_RETURN_IF_ERROR(CheckRange(it->second.descriptor, offset, length));
    fn(it->second.base + offset);
    return Status();
  }

  // A copy of the entry (memory reference included). NotFound for unknown ids.
  Result<ExportedSegment> Get(SegmentId id) const;

  // OutOfRange unless 0 < length and offset + length <= size (without overflow).
  static Status CheckRange(const SegmentDescriptor& descriptor, uint64_t offset, uint64_t length);

 private:
  static Status UnknownSegment(SegmentId id);
  static Status DeviceSegment(SegmentId id);

  mutable std::shared_mutex mu_;
  std::map<SegmentId, ExportedSegment> segments_;  // guarded by mu_
  SegmentId next_id_ = 1;                          // guarded by mu_
};

}  // namespace larder::transfer
