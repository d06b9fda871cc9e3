// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "common/segment_descriptor_proto.h"

#include <string>

#include "larder/memory_region.h"

namespace larder {

void ToProto(const SegmentDescriptor& descriptor, proto::SegmentDescriptor* out) {
  out->set_segment_id(descriptor.segment_id);
  out->set_name(descriptor.name);
  out->set_epoch(descriptor.epoch);
  out->set_engine_id(descriptor.engine_id);
  out->set_host_id(descriptor.host_id);
  out->set_address(descriptor.address);
  out->set_size(descriptor.size);
  out->set_memory_kind(std::string(MemoryKindName(descriptor.memory_kind)));
  out->set_page_size(descriptor.page_size);
  auto& transports = *out->mutable_transports();
  for (const auto& [transport, blob] : descriptor.transports) transports[transport] = blob;
}

Result<SegmentDescriptor> FromProto(const proto::SegmentDescriptor& descriptor) {
  SegmentDescriptor d;
  d.segment_id = descriptor.segment_id();
  d.name = descriptor.name();
  d.epoch = descriptor.epoch();
  d.engine_id = descriptor.engine_id();
  d.host_id = descriptor.host_id();
  d.address = descriptor.address();
  d.size = descriptor.size();
  LARDER_ASSIGN_OR_RETURN(d.memory_kind, ParseMemoryKind(descriptor.memory_kind()));
  if (descriptor.page_size() != 0) d.page_size = descriptor.page_size();
  for (const auto& [transport, blob] : descriptor.transports())
    d.transports.emplace(transport, blob);
  // The message is in memory already (gRPC bounds its size): checked once copied.
  LARDER_RETURN_IF_ERROR(d.Validate());
  return d;
}

}  // namespace larder
