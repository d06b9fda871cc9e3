// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/segment_exports.h"

#include "common/env.h"

namespace larder::transfer {

Status SegmentExports::Reserve(SegmentDescriptor* descriptor) {
  if (descriptor->name.empty()) return InvalidArgumentError("segment name must not be empty");
  WriterLock lock(mu_);
  if (reserved_.count(descriptor->name) != 0) {
    return AlreadyExistsError("segment '" + descriptor->name + "' is being registered");
  }
  for (const auto& [id, segment] : segments_) {
    if (segment.descriptor.name == descriptor->name) {
      return AlreadyExistsError("segment '" + descriptor->name + "' is already registered (id " +
                                std::to_string(id) + ")");
    }
  }
  descriptor->segment_id = next_id_++;
  descriptor->epoch = RandomU64();
  reserved_.insert(descriptor->name);
  return Status();
}

void SegmentExports::Publish(SegmentDescriptor descriptor, uint8_t* base,
                             std::shared_ptr<MemoryRegion> memory) {
  WriterLock lock(mu_);
  reserved_.erase(descriptor.name);
  SegmentId id = descriptor.segment_id;
  segments_.emplace(id, ExportedSegment{std::move(descriptor), base, std::move(memory)});
}

void SegmentExports::Abandon(const std::string& name) {
  WriterLock lock(mu_);
  reserved_.erase(name);
}

Status SegmentExports::Remove(SegmentId id) {
  WriterLock lock(mu_);
  if (segments_.erase(id) == 0) return UnknownSegment(id);
  return Status();
}

std::vector<SegmentDescriptor> SegmentExports::List() const {
  ReaderLock lock(mu_);
  std::vector<SegmentDescriptor> out;
  out.reserve(segments_.size());
  for (const auto& [id, segment] : segments_) out.push_back(segment.descriptor);
  return out;
}

Result<ExportedSegment> SegmentExports::Get(SegmentId id) const {
  ReaderLock lock(mu_);
  auto it = segments_.find(id);
  if (it == segments_.end()) return UnknownSegment(id);
  return it->second;
}

Status SegmentExports::CheckRange(const SegmentDescriptor& descriptor, uint64_t offset,
                                  uint64_t length) {
  if (length == 0) {
    return InvalidArgumentError("zero-length access to segment '" + descriptor.name + "'");
  }
  if (offset > descriptor.size || length > descriptor.size - offset) {
    return OutOfRangeError("range [" + std::to_string(offset) + ", +" + std::to_string(length) +
                           ") is outside segment '" + descriptor.name + "' of " +
                           std::to_string(descriptor.size) + " bytes");
  }
  return Status();
}

Status SegmentExports::DeviceSegment(SegmentId id) {
  return FailedPreconditionError("segment " + std::to_string(id) +
                                 " is device memory: only the device route reaches it");
}

Status SegmentExports::UnknownSegment(SegmentId id) {
  return NotFoundError("no segment with id " + std::to_string(id) + " is registered");
}

}  // namespace larder::transfer
