// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Native registration coverage for fabrics that register memory at a fixed granularity.
//
// A device fabric registers memory in whole granules (2 MiB pages on the device) and rejects a
// registration that overlaps an earlier one. Logical buffers that do not overlap can still
// overlap once aligned to granules:
//
//   buffer A [0x200000, 0x500000) aligns to [0x200000, 0x600000)
//   buffer B [0x500000, 0x800000) aligns to [0x400000, 0x800000)   <- overlaps A's granules
//
// RegistrationCoverage keeps, for one transport handle, the logical registrations the user made
// and the native ranges registered with the fabric, and registers natively only the granules no
// earlier native registration covers. Native registrations live as long as the transport handle:
// neither a partial failure nor a logical Deregister removes one (the fabric's native memory
// regions are released with the handle, not one by one).
//
// SplitAtBoundaries() is the copy-side half: it cuts a copy so that no piece crosses a granule
// boundary of its source or destination, so that each native copy lies within one native
// registration on both sides (adjacent native registrations are distinct native handles).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "larder/status.h"

namespace larder::transfer {

// Rounds `value` down to a multiple of `granularity`.
// REQUIRES: granularity is a power of two.
uint64_t AlignDown(uint64_t value, uint64_t granularity);

// Rounds `value` up to a multiple of `granularity`. Returns 0 when the result does not fit in 64
// bits; since AlignUp(0) is also 0, callers tell the two apart by checking value != 0.
// REQUIRES: granularity is a power of two.
uint64_t AlignUp(uint64_t value, uint64_t granularity);

// Cuts a copy of `length` bytes from address `src` to address `dst` into (offset, length) pieces
// such that no piece crosses a multiple of `granularity` in the source range
// [src + offset, src + offset + piece) nor in the destination range. Pieces are in ascending
// order, contiguous, and cover [0, length) exactly; each piece is as long as both constraints
// allow, so equally aligned src and dst give granule-sized pieces. Empty when length is 0.
// REQUIRES: granularity is a power of two.
std::vector<std::pair<uint64_t, uint64_t>> SplitAtBoundaries(uint64_t src, uint64_t dst,
                                                             uint64_t length, uint64_t granularity);

// Tracks logical and native registrations of one transport handle (see the file comment).
//
// Thread safety: thread-safe. One internal mutex guards all state; Register holds it exclusively
// for its whole duration, native calls included, so that two threads never register the same
// granule natively. Queries take it shared and therefore wait for a Register in progress.
class RegistrationCoverage {
 public:
  // Registers [begin, begin + length) with the native layer and says whether it did. Called with
  // begin and length multiples of the granularity, length > 0, ranges in ascending order within
  // one Register. Runs under the internal mutex: it must not call back into this object.
  using NativeRegister = std::function<Status(uint64_t begin, uint64_t length)>;

  // One native registration, [begin, end).
  struct NativeRange {
    uint64_t begin = 0;
    uint64_t end = 0;
    bool operator==(const NativeRange&) const = default;
  };

  // REQUIRES: granularity is a power of two (2 MiB for the device fabric).
  explicit RegistrationCoverage(uint64_t granularity);

  RegistrationCoverage(const RegistrationCoverage&) = delete;
  RegistrationCoverage& operator=(const RegistrationCoverage&) = delete;

  uint64_t granularity() const { return granularity_; }

  // Records the logical registration [address, address + length) after making sure its aligned
  // range [AlignDown(address), AlignUp(address + length)) is natively registered: `native` is
  // called once per maximal gap of that range not covered by earlier native registrations, in
  // ascending order, and not at all when the range is already covered. Each gap that `native`
  // accepts is recorded as a native registration at once and kept whatever happens next.
  // Adjacent native registrations stay distinct entries.
  //
  // Success: the logical registration is recorded and every byte of the aligned range is covered.
  // Failure:
  //   InvalidArgument  length is 0, or address + length or its aligned end overflows 64 bits;
  //                    nothing is called or recorded.
  //   AlreadyExists    a logical registration already starts at `address`; nothing is called.
  //   any code         `native` failed on a gap: its status is returned, prefixed with the gap
  //                    and the buffer. The logical registration is not recorded; gaps registered
  //                    before the failing one stay, so a retry registers only the remainder.
  // Logical registrations with different starts may overlap each other.
  Status Register(uint64_t address, uint64_t length, const NativeRegister& native);

  // Removes the logical registration that starts at `address`. Native registrations stay: their
  // lifetime is the transport handle's, and a later Register of the same memory reuses them.
  // NotFound when no logical registration starts at `address`.
  Status Deregister(uint64_t address);

  // The native registration that contains `address`, if any. O(log n).
  std::optional<NativeRange> FindNative(uint64_t address) const;

  // True when every byte of [address, address + length) lies in native registrations (one or
  // several adjacent ones). False for length 0 and for ranges that overflow 64 bits.
  bool Covers(uint64_t address, uint64_t length) const;

  // True when [address, address + length) lies inside a single logical registration. False for
  // length 0 and for ranges that overflow 64 bits. O(log n + k), k the number of logical
  // registrations that start within the longest one ever registered before address + length.
  bool IsLogicallyRegistered(uint64_t address, uint64_t length) const;

  // Times `native` was called, failed calls included.
  uint64_t native_calls() const;
  // Bytes natively registered: the sum of the native ranges' lengths (they never overlap).
  uint64_t native_bytes() const;
  // Logical registrations currently recorded.
  size_t logical_registrations() const;
  // Every native registration, ordered by begin; pairwise disjoint.
  std::vector<NativeRange> NativeRanges() const;

 private:
  const uint64_t granularity_;

  mutable SharedMutex mu_;
  std::map<uint64_t, uint64_t> logical_ LARDER_GUARDED_BY(mu_);  // begin -> end
  std::map<uint64_t, uint64_t> native_ LARDER_GUARDED_BY(mu_);   // begin -> end, disjoint
  uint64_t native_calls_ LARDER_GUARDED_BY(mu_) = 0;
  uint64_t native_bytes_ LARDER_GUARDED_BY(mu_) = 0;
  // The longest logical length ever recorded.
  uint64_t longest_logical_ LARDER_GUARDED_BY(mu_) = 0;
};

}  // namespace larder::transfer
