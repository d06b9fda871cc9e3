// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "disk/record_format.h"

#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace larder::disk {

uint64_t SummaryHash(const std::byte* summary, uint64_t bytes) {
  BatchHeader header;
  std::memcpy(&header, summary, sizeof(header));
  header.summary_hash = 0;
  return XXH3_64bits_withSeed(summary + sizeof(header), bytes - sizeof(header),
                              XXH3_64bits(&header, sizeof(header)));
}

std::optional<std::vector<ParsedRecord>> ParseSummary(const std::byte* summary, uint64_t bytes,
                                                      uint64_t room, uint64_t* need) {
  BatchHeader header;
  if (bytes < sizeof(header)) return std::nullopt;
  std::memcpy(&header, summary, sizeof(header));
  if (header.magic != kMagic || header.format != kFormat || header.count == 0 ||
      header.summary_bytes < sizeof(header) + header.count * SummaryBytes(1) ||
      header.summary_bytes > room || header.values_bytes > room ||
      AlignUp(header.summary_bytes) + header.values_bytes > room) {
    return std::nullopt;
  }
  if (header.summary_bytes > bytes) {
    *need = AlignUp(header.summary_bytes);
    return std::nullopt;
  }
  if (SummaryHash(summary, header.summary_bytes) != header.summary_hash) return std::nullopt;
  std::vector<ParsedRecord> records;
  records.reserve(header.count);
  uint64_t at = sizeof(header);
  uint64_t value_at = AlignUp(header.summary_bytes);
  for (uint32_t i = 0; i < header.count; ++i) {
    ParsedRecord record;
    if (at + sizeof(RecordHeader) > header.summary_bytes) return std::nullopt;
    std::memcpy(&record.header, summary + at, sizeof(RecordHeader));
    at += sizeof(RecordHeader);
    const RecordHeader& r = record.header;
    if (r.key_len == 0 || r.key_len > kMaxKeyBytes || at + r.key_len > header.summary_bytes ||
        (r.flags & ~kTombstone) != 0 || ((r.flags & kTombstone) && r.value_len != 0) ||
        r.value_len > room) {
      return std::nullopt;
    }
    record.key.assign(reinterpret_cast<const char*>(summary + at), r.key_len);
    at += r.key_len;
    record.value_offset = value_at;
    value_at += AlignUp(r.value_len);
    records.push_back(std::move(record));
  }
  if (at != header.summary_bytes ||
      value_at != AlignUp(header.summary_bytes) + header.values_bytes) {
    return std::nullopt;
  }
  return records;
}

}  // namespace larder::disk
