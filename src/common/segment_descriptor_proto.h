// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// A SegmentDescriptor as the control plane carries it (proto::SegmentDescriptor, master.proto):
// typed fields, transport blobs as bytes. The master checks a mounted one with FromProto before
// anything reads it; clients read the ones the master hands out the same way.
#pragma once

#include "larder/status.h"
#include "larder/transfer_engine.h"
#include "master.pb.h"

namespace larder {

void ToProto(const SegmentDescriptor& descriptor, proto::SegmentDescriptor* out);

// Errors: InvalidArgument (an unknown memory kind, or what SegmentDescriptor::Validate refuses).
Result<SegmentDescriptor> FromProto(const proto::SegmentDescriptor& descriptor);

}  // namespace larder
