// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The ucx transport's blob in a segment descriptor (SegmentDescriptor::transports["ucx"]): what a
// peer needs to reach one exported segment through UCX. Only the ucx transport reads it, and it
// comes from other processes, so parsing bounds every length and rejects anything malformed.
//
// Layout, version 1, little-endian:
//
//   offset  size  field
//        0     4  magic "LUCX"
//        4     1  version (1)
//        5     1  flags: bit 0 = the owner's UCP context has an RDMA lane; other bits 0
//        6     2  reserved, 0
//        8     8  segment id (equals the descriptor's)
//       16     8  remote base address of the segment in the owner's process
//       24     8  size in bytes (at least the descriptor's size)
//       32     4  worker address length A (1..kMaxWorkerAddressBytes)
//       36     4  packed rkey length R (1..kMaxRkeyBytes)
//       40     A  the owner's UCP worker address (ucp_worker_get_address)
//     40+A     R  the segment's packed rkey (ucp_rkey_pack)
//
// Nothing follows: the blob is exactly 40 + A + R bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "larder/status.h"
#include "larder/transfer_engine.h"

namespace larder::transfer::ucx {

inline constexpr uint8_t kBlobVersion = 1;
inline constexpr size_t kBlobHeaderBytes = 40;
inline constexpr size_t kMaxWorkerAddressBytes = 8 * 1024;
inline constexpr size_t kMaxRkeyBytes = 8 * 1024;

struct UcxBlob {
  bool rdma = false;  // the owner has an RDMA lane
  SegmentId segment_id = 0;
  uint64_t remote_base = 0;
  uint64_t size = 0;
  std::string worker_address;
  std::string rkey;
};

// The blob's bytes. REQUIRES: worker_address and rkey within their limits (Export's own values).
std::string EncodeBlob(const UcxBlob& blob);

// Parses `bytes` and checks it against `descriptor` (segment id; a size at least the
// descriptor's; no overflow of base + size). InvalidArgument saying what is wrong otherwise.
Result<UcxBlob> ParseBlob(std::string_view bytes, const SegmentDescriptor& descriptor);

}  // namespace larder::transfer::ucx
