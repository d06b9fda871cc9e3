// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The on-disk layout of a DiskStore region (disk_store.h): batches of records, each a summary (a
// BatchHeader, then a RecordHeader and the key per record, padded to a block) followed by the
// values, each padded to a block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "disk/disk_io.h"

namespace larder::disk {

inline constexpr uint32_t kMagic = 0x3252444c;  // "LDR2"
inline constexpr uint16_t kFormat = 2;
inline constexpr uint16_t kTombstone = 1;
inline constexpr uint32_t kMaxKeyBytes = 64 * 1024;

// A batch's summary starts with this, and then has one RecordHeader and its key per record.
struct BatchHeader {
  uint32_t magic;
  uint16_t format;
  uint16_t reserved16;
  uint32_t count;  // records
  uint32_t reserved32;
  uint64_t summary_bytes;  // this header, the record headers and keys, before padding
  uint64_t values_bytes;   // the values after the padded summary, each padded
  uint64_t summary_hash;   // XXH3 of the summary, this field zero
  uint8_t zero[24];
};
static_assert(sizeof(BatchHeader) == 64);

struct RecordHeader {
  uint32_t key_len;
  uint16_t flags;
  uint16_t reserved;
  uint64_t value_len;
  uint64_t generation;
  uint64_t value_hash;
};
static_assert(sizeof(RecordHeader) == 32);

// What a record adds to its batch's summary.
inline uint64_t SummaryBytes(uint64_t key_len) { return sizeof(RecordHeader) + key_len; }
// The space a batch of one record takes: the most any record may need.
inline uint64_t LoneRecordBytes(uint64_t key_len, uint64_t value_len) {
  return AlignUp(sizeof(BatchHeader) + SummaryBytes(key_len)) + AlignUp(value_len);
}

// XXH3 of a summary of `bytes` bytes, its hash field taken as zero.
uint64_t SummaryHash(const std::byte* summary, uint64_t bytes);

struct ParsedRecord {
  std::string key;
  RecordHeader header;
  uint64_t value_offset;  // from the batch's start
};

// The records of the batch summary at `summary` (`bytes` read), when it is whole and consistent:
// its hash, every length, and values that fit in `room` bytes from the batch's start. nullopt
// otherwise; a summary longer than `bytes` sets *need to its padded length (read that much).
std::optional<std::vector<ParsedRecord>> ParseSummary(const std::byte* summary, uint64_t bytes,
                                                      uint64_t room, uint64_t* need);

}  // namespace larder::disk
