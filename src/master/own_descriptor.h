// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

#include <cstdint>
#include <string>

#include "common/segment_descriptor_proto.h"
#include "larder/transfer_engine.h"

namespace larder::master {

// The descriptor that engine `client_id` on `host_id` would publish for its segment `name` of
// `size` bytes, served at `address`: the only kind of descriptor MountSegments accepts from that
// client (service.cc, CheckOwnSegment). For callers of the master's gRPC service without an
// engine: tests and larder-bench master.
inline SegmentDescriptor OwnDescriptor(const std::string& client_id, const std::string& host_id,
                                       const std::string& name, uint64_t size,
                                       const std::string& address = "127.0.0.1:1") {
  SegmentDescriptor descriptor;
  descriptor.segment_id = 1;
  descriptor.name = name;
  descriptor.engine_id = client_id;
  descriptor.host_id = host_id;
  descriptor.address = address;
  descriptor.size = size;
  return descriptor;
}

// The same, in a mount's SegmentInfo.
inline void SetOwnDescriptor(proto::SegmentInfo* segment, const std::string& client_id,
                             const std::string& host_id, const std::string& name, uint64_t size) {
  ToProto(OwnDescriptor(client_id, host_id, name, size), segment->mutable_segment_descriptor());
}

}  // namespace larder::master
