// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/ucx/ucx_blob.h"

#include <cstring>

namespace larder::transfer::ucx {
namespace {

constexpr char kMagic[4] = {'L', 'U', 'C', 'X'};

void PutLe(std::string* out, uint64_t value, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t GetLe(std::string_view in, size_t at, size_t bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < bytes; ++i) {
    value |= static_cast<uint64_t>(static_cast<uint8_t>(in[at + i])) << (8 * i);
  }
  return value;
}

}  // namespace

std::string EncodeBlob(const UcxBlob& blob) {
  std::string out(kMagic, sizeof(kMagic));
  out.push_back(static_cast<char>(kBlobVersion));
  out.push_back(static_cast<char>(blob.rdma ? 1 : 0));
  PutLe(&out, 0, 2);
  PutLe(&out, blob.segment_id, 8);
  PutLe(&out, blob.remote_base, 8);
  PutLe(&out, blob.size, 8);
  PutLe(&out, blob.worker_address.size(), 4);
  PutLe(&out, blob.rkey.size(), 4);
  out += blob.worker_address;
  out += blob.rkey;
  return out;
}

Result<UcxBlob> ParseBlob(std::string_view bytes, const SegmentDescriptor& descriptor) {
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("ucx blob of segment '" + descriptor.name + "' of engine " +
                                descriptor.engine_id + " " + why);
  };
  if (bytes.size() < kBlobHeaderBytes) {
    return bad("is truncated (" + std::to_string(bytes.size()) + " bytes)");
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) return bad("has a wrong magic");
  if (static_cast<uint8_t>(bytes[4]) != kBlobVersion) {
    return bad("has version " + std::to_string(static_cast<uint8_t>(bytes[4])) +
               " (this build reads " + std::to_string(kBlobVersion) + ")");
  }
  uint8_t flags = static_cast<uint8_t>(bytes[5]);
  if ((flags & ~1u) != 0 || GetLe(bytes, 6, 2) != 0) return bad("sets unknown flags");
  UcxBlob blob;
  blob.rdma = (flags & 1u) != 0;
  blob.segment_id = GetLe(bytes, 8, 8);
  blob.remote_base = GetLe(bytes, 16, 8);
  blob.size = GetLe(bytes, 24, 8);
  uint64_t address_bytes = GetLe(bytes, 32, 4);
  uint64_t rkey_bytes = GetLe(bytes, 36, 4);
  if (address_bytes == 0 || address_bytes > kMaxWorkerAddressBytes) {
    return bad("has a worker address of " + std::to_string(address_bytes) + " bytes");
  }
  if (rkey_bytes == 0 || rkey_bytes > kMaxRkeyBytes) {
    return bad("has an rkey of " + std::to_string(rkey_bytes) + " bytes");
  }
  if (bytes.size() != kBlobHeaderBytes + address_bytes + rkey_bytes) {
    return bad("is " + std::to_string(bytes.size()) + " bytes, its lengths say " +
               std::to_string(kBlobHeaderBytes + address_bytes + rkey_bytes));
  }
  if (blob.segment_id != descriptor.segment_id) return bad("names another segment id");
  if (blob.remote_base == 0 || blob.size < descriptor.size || blob.size == 0 ||
      blob.remote_base > UINT64_MAX - blob.size) {
    return bad("describes an impossible range");
  }
  blob.worker_address = std::string(bytes.substr(kBlobHeaderBytes, address_bytes));
  blob.rkey = std::string(bytes.substr(kBlobHeaderBytes + address_bytes, rkey_bytes));
  return blob;
}

}  // namespace larder::transfer::ucx
