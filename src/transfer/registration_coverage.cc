// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/registration_coverage.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstdio>
#include <iterator>
#include <string>

#include "common/env.h"

namespace larder::transfer {
namespace {

std::string RangeString(uint64_t begin, uint64_t end) {
  // Appending (not `"[" + std::string`) sidesteps a GCC 12 -Wrestrict false positive at -O3.
  std::string out = "[";
  out += FormatHex(begin);
  out += ", ";
  out += FormatHex(end);
  out += ")";
  return out;
}

// The end of [address, address + length), or nullopt when length is 0 or the range wraps.
std::optional<uint64_t> RangeEnd(uint64_t address, uint64_t length) {
  if (length == 0 || length > UINT64_MAX - address) return std::nullopt;
  return address + length;
}

}  // namespace

uint64_t AlignDown(uint64_t value, uint64_t granularity) {
  assert(std::has_single_bit(granularity));
  return value & ~(granularity - 1);
}

uint64_t AlignUp(uint64_t value, uint64_t granularity) {
  assert(std::has_single_bit(granularity));
  if (value > UINT64_MAX - (granularity - 1)) return 0;
  return AlignDown(value + (granularity - 1), granularity);
}

std::vector<std::pair<uint64_t, uint64_t>> SplitAtBoundaries(uint64_t src, uint64_t dst,
                                                             uint64_t length,
                                                             uint64_t granularity) {
  assert(std::has_single_bit(granularity));
  std::vector<std::pair<uint64_t, uint64_t>> pieces;
  const uint64_t mask = granularity - 1;
  uint64_t offset = 0;
  while (offset < length) {
    // Distances to the next boundary on each side; unsigned wrap-around keeps them right even for
    // addresses near the top of the address space.
    uint64_t to_src_boundary = granularity - ((src + offset) & mask);
    uint64_t to_dst_boundary = granularity - ((dst + offset) & mask);
    uint64_t piece = std::min({to_src_boundary, to_dst_boundary, length - offset});
    pieces.emplace_back(offset, piece);
    offset += piece;
  }
  return pieces;
}

RegistrationCoverage::RegistrationCoverage(uint64_t granularity) : granularity_(granularity) {
  assert(std::has_single_bit(granularity));
}

Status RegistrationCoverage::Register(uint64_t address, uint64_t length,
                                      const NativeRegister& native) {
  std::optional<uint64_t> end = RangeEnd(address, length);
  if (!end) {
    return InvalidArgumentError("cannot register " + FormatHex(length) + " bytes at " +
                                FormatHex(address) +
                                ": empty or past the end of the address space");
  }
  const uint64_t aligned_begin = AlignDown(address, granularity_);
  const uint64_t aligned_end = AlignUp(*end, granularity_);
  if (aligned_end == 0) {
    return InvalidArgumentError("cannot register " + RangeString(address, *end) +
                                ": its last granule ends past the end of the address space");
  }

  WriterLock lock(mu_);
  if (logical_.contains(address)) {
    return AlreadyExistsError("a buffer starting at " + FormatHex(address) +
                              " is already registered");
  }

  // Walk the native ranges that meet [aligned_begin, aligned_end) in order and register the gaps
  // between them. Native ranges never overlap, so once `cursor` is past the range containing
  // aligned_begin, `next` is always the first range beginning at or after `cursor`.
  uint64_t cursor = aligned_begin;
  auto next = native_.upper_bound(cursor);
  if (next != native_.begin() && std::prev(next)->second > cursor) {
    cursor = std::prev(next)->second;
  }
  while (cursor < aligned_end) {
    const uint64_t gap_end =
        next == native_.end() ? aligned_end : std::min(aligned_end, next->first);
    if (gap_end > cursor) {
      ++native_calls_;
      Status status = native(cursor, gap_end - cursor);
      if (!status.ok()) {
        return status.WithContext("registering " + RangeString(cursor, gap_end) +
                                  " natively for buffer " + RangeString(address, *end));
      }
      // Recorded at once: the fabric now holds this range whether or not later gaps succeed.
      // Inserting before `next` leaves `next` valid.
      native_.emplace(cursor, gap_end);
      native_bytes_ += gap_end - cursor;
    }
    if (next == native_.end() || next->first >= aligned_end) break;
    cursor = next->second;
    ++next;
  }
  logical_.emplace(address, *end);
  longest_logical_ = std::max(longest_logical_, length);
  return Status();
}

Status RegistrationCoverage::Deregister(uint64_t address) {
  WriterLock lock(mu_);
  // Only the logical entry goes; native ranges are released with the transport handle.
  if (logical_.erase(address) == 0) {
    return NotFoundError("no buffer registered at " + FormatHex(address));
  }
  return Status();
}

std::optional<RegistrationCoverage::NativeRange> RegistrationCoverage::FindNative(
    uint64_t address) const {
  ReaderLock lock(mu_);
  auto it = native_.upper_bound(address);
  if (it == native_.begin()) return std::nullopt;
  --it;
  if (address >= it->second) return std::nullopt;
  return NativeRange{it->first, it->second};
}

bool RegistrationCoverage::Covers(uint64_t address, uint64_t length) const {
  std::optional<uint64_t> end = RangeEnd(address, length);
  if (!end) return false;
  ReaderLock lock(mu_);
  auto it = native_.upper_bound(address);
  if (it == native_.begin()) return false;
  --it;
  uint64_t covered_to = it->second;
  if (covered_to <= address) return false;
  // Follow adjacent native ranges until the end is reached or a gap appears.
  for (++it; covered_to < *end && it != native_.end() && it->first == covered_to; ++it) {
    covered_to = it->second;
  }
  return covered_to >= *end;
}

bool RegistrationCoverage::IsLogicallyRegistered(uint64_t address, uint64_t length) const {
  std::optional<uint64_t> end = RangeEnd(address, length);
  if (!end) return false;
  ReaderLock lock(mu_);
  // Logical registrations may overlap, so the containing one need not be the nearest start; but
  // none starting before *end - longest_logical_ can reach *end, which bounds the walk back.
  const uint64_t lowest_start = *end > longest_logical_ ? *end - longest_logical_ : 0;
  auto it = logical_.upper_bound(address);
  while (it != logical_.begin()) {
    --it;
    if (it->first < lowest_start) return false;
    if (it->second >= *end) return true;
  }
  return false;
}

uint64_t RegistrationCoverage::native_calls() const {
  ReaderLock lock(mu_);
  return native_calls_;
}

uint64_t RegistrationCoverage::native_bytes() const {
  ReaderLock lock(mu_);
  return native_bytes_;
}

size_t RegistrationCoverage::logical_registrations() const {
  ReaderLock lock(mu_);
  return logical_.size();
}

std::vector<RegistrationCoverage::NativeRange> RegistrationCoverage::NativeRanges() const {
  ReaderLock lock(mu_);
  std::vector<NativeRange> out;
  out.reserve(native_.size());
  for (const auto& [begin, end] : native_) out.push_back(NativeRange{begin, end});
  return out;
}

}  // namespace larder::transfer
