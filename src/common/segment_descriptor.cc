// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The JSON form of segment descriptors: what an engine publishes for each segment, what the master
// checks when a client mounts one (it must name the mounting client's own engine) and hands to
// readers and writers. In the ground floor, so that the master parses descriptors without the
// transfer engine.
#include <openssl/evp.h>

#include <nlohmann/json.hpp>

#include "larder/memory_region.h"
#include "larder/transfer_engine.h"

namespace larder {
namespace {

// Transport blobs are bytes; the JSON form carries them as base64.
std::string EncodeBlob(const std::string& blob) {
  std::string out(4 * ((blob.size() + 2) / 3), '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(blob.data()),
                          static_cast<int>(blob.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

Result<std::string> DecodeBlob(const std::string& text) {
  if (text.size() % 4 != 0) return InvalidArgumentError("transport blob is not base64");
  std::string out(3 * (text.size() / 4), '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(text.data()),
                          static_cast<int>(text.size()));
  if (n < 0) return InvalidArgumentError("transport blob is not base64");
  size_t padding = 0;
  if (!text.empty() && text.back() == '=') ++padding;
  if (text.size() >= 2 && text[text.size() - 2] == '=') ++padding;
  out.resize(static_cast<size_t>(n) - padding);
  return out;
}

}  // namespace

Status SegmentDescriptor::Validate() const {
  if (transports.size() > kMaxTransports) {
    return InvalidArgumentError("segment descriptor names " + std::to_string(transports.size()) +
                                " transports (at most " + std::to_string(kMaxTransports) + ")");
  }
  for (const auto& [transport, blob] : transports) {
    if (transport.empty() || transport.size() > RouteKind::kMaxNameBytes) {
      return InvalidArgumentError("segment descriptor has a malformed transport entry");
    }
    if (blob.size() > kMaxBlobBytes) {
      return InvalidArgumentError("segment descriptor's " + transport + " blob exceeds " +
                                  std::to_string(kMaxBlobBytes) + " bytes");
    }
  }
  if (page_size < 4096 || (page_size & (page_size - 1)) != 0) {
    return InvalidArgumentError("segment descriptor has page_size " + std::to_string(page_size) +
                                ", not a power of two >= 4096");
  }
  return Status::Ok();
}

std::string SegmentDescriptor::ToJson() const {
  nlohmann::json blobs = nlohmann::json::object();
  for (const auto& [transport, blob] : transports) blobs[transport] = EncodeBlob(blob);
  nlohmann::json j = {
      {"segment_id", segment_id},
      {"name", name},
      {"epoch", epoch},
      {"engine_id", engine_id},
      {"host_id", host_id},
      {"address", address},
      {"size", size},
      {"memory_kind", std::string(MemoryKindName(memory_kind))},
      {"page_size", page_size},
      {"transports", blobs},
  };
  return j.dump();
}

Result<SegmentDescriptor> SegmentDescriptor::FromJson(std::string_view json) {
  auto j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return InvalidArgumentError("segment descriptor is not a JSON object");
  SegmentDescriptor d;
  auto get_u64 = [&](const char* key, uint64_t* out) -> Status {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_unsigned()) {
      return InvalidArgumentError(std::string("segment descriptor lacks unsigned '") + key + "'");
    }
    *out = it->get<uint64_t>();
    return Status();
  };
  auto get_str = [&](const char* key, std::string* out) -> Status {
    auto it = j.find(key);
    if (it == j.end() || !it->is_string()) {
      return InvalidArgumentError(std::string("segment descriptor lacks string '") + key + "'");
    }
    *out = it->get<std::string>();
    return Status();
  };
  LARDER_RETURN_IF_ERROR(get_u64("segment_id", &d.segment_id));
  LARDER_RETURN_IF_ERROR(get_u64("epoch", &d.epoch));
  LARDER_RETURN_IF_ERROR(get_u64("size", &d.size));
  LARDER_RETURN_IF_ERROR(get_str("name", &d.name));
  LARDER_RETURN_IF_ERROR(get_str("engine_id", &d.engine_id));
  LARDER_RETURN_IF_ERROR(get_str("host_id", &d.host_id));
  LARDER_RETURN_IF_ERROR(get_str("address", &d.address));
  auto blobs = j.find("transports");
  if (blobs == j.end() || !blobs->is_object()) {
    return InvalidArgumentError("segment descriptor lacks object 'transports'");
  }
  // Bounded before any blob is decoded; Validate checks the decoded ones.
  if (blobs->size() > kMaxTransports) {
    return InvalidArgumentError("segment descriptor names " + std::to_string(blobs->size()) +
                                " transports (at most " + std::to_string(kMaxTransports) + ")");
  }
  for (auto it = blobs->begin(); it != blobs->end(); ++it) {
    if (!it.value().is_string()) {
      return InvalidArgumentError("segment descriptor has a malformed transport entry");
    }
    const std::string& text = it.value().get_ref<const std::string&>();
    if (text.size() > 4 * ((kMaxBlobBytes + 2) / 3)) {
      return InvalidArgumentError("segment descriptor's " + it.key() + " blob exceeds " +
                                  std::to_string(kMaxBlobBytes) + " bytes");
    }
    auto blob = DecodeBlob(text);
    if (!blob.ok()) return blob.status().WithContext("transport " + it.key());
    d.transports.emplace(it.key(), std::move(blob).value());
  }
  // Descriptors from engines that predate page sizes describe normal pages.
  if (j.contains("page_size")) LARDER_RETURN_IF_ERROR(get_u64("page_size", &d.page_size));
  std::string kind;
  LARDER_RETURN_IF_ERROR(get_str("memory_kind", &kind));
  LARDER_ASSIGN_OR_RETURN(d.memory_kind, ParseMemoryKind(kind));
  LARDER_RETURN_IF_ERROR(d.Validate());
  return d;
}

}  // namespace larder
