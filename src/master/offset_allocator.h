// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace larder::master {

// Hands out byte ranges of one segment. Allocate and Free are O(1): free ranges sit in
// segregated lists (two-level size classes found through two bitmaps, as in TLSF), and every range
// knows its physical neighbours, so a free coalesces without searching.
//
// Sizes and offsets are rounded to `alignment` (a power of two), so every range starts on an
// aligned offset. A successful Allocate never returns a range that overlaps another live one.
//
// Not thread-safe: the segment table's mutex guards it.
class OffsetAllocator {
 public:
  using Handle = uint32_t;
  static constexpr Handle kInvalidHandle = UINT32_MAX;

  struct Allocation {
    uint64_t offset = 0;  // from the start of the segment
    Handle handle = kInvalidHandle;
  };

  // REQUIRES: alignment is a power of two; capacity >= alignment.
  explicit OffsetAllocator(uint64_t capacity, uint64_t alignment = 64);

  // A range of at least `size` bytes, or nullopt when no free range is big enough.
  // REQUIRES: size > 0.
  std::optional<Allocation> Allocate(uint64_t size);

  // Takes exactly the range [offset, offset + size rounded up to the alignment), as Allocate would
  // have handed it out, when that range lies inside one free range; nullopt otherwise (size 0,
  // an offset that is not a multiple of the alignment, a range past the capacity, or one that
  // overlaps a live range). What is left of the free range on either side stays free.
  //
  // Cost: O(1) for each of a run of reserves in ascending offset order with nothing else in
  // between (the allocator remembers where the last reserve ended); otherwise a walk of the
  // ranges, free and live, that lie below `offset`.
  std::optional<Allocation> Reserve(uint64_t offset, uint64_t size);

  // Makes room in the bookkeeping for `ranges` more Reserve calls, so that a run of them (a
  // rebuild) does not grow it step by step. Costs nothing else.
  void ReserveBookkeeping(size_t ranges) { nodes_.reserve(nodes_.size() + 2 * ranges + 1); }

  // Returns the range of `handle` to the free pool. REQUIRES: handle came from Allocate or
  // Reserve and was not freed since.
  void Free(Handle handle);

  uint64_t capacity() const { return units_total_ * alignment_; }
  uint64_t free_bytes() const { return units_free_ * alignment_; }
  uint64_t used_bytes() const { return capacity() - free_bytes(); }
  size_t live_allocations() const { return live_; }

 private:
  static constexpr uint32_t kSubBits = 3;
  static constexpr uint32_t kSubLists = 1u << kSubBits;
  static constexpr uint32_t kClasses = 64 * kSubLists;
  static constexpr uint32_t kNone = UINT32_MAX;

  struct Node {
    uint64_t offset = 0;  // units
    uint64_t size = 0;    // units
    uint32_t prev_phys = kNone;
    uint32_t next_phys = kNone;
    uint32_t prev_free = kNone;
    uint32_t next_free = kNone;
    bool free = false;
    bool in_use = false;  // node slot holds a range (free or allocated)
  };

  static uint32_t ClassOf(uint64_t units);         // class of a size, rounded down
  static uint64_t RoundUpToClass(uint64_t units);  // smallest size whose floor class fits units
  uint32_t NewNode();
  void ReleaseNode(uint32_t index);
  void InsertFree(uint32_t index);
  void RemoveFree(uint32_t index);
  uint32_t FindFree(uint32_t min_class) const;
  // The node whose range holds unit `unit`. REQUIRES: unit < units_total_.
  uint32_t NodeHolding(uint64_t unit) const;
  // Splits the node: the first `units` stay with it, the rest becomes a new node (returned),
  // right after it in the physical chain, free and on its free list.
  uint32_t SplitOff(uint32_t index, uint64_t units);

  uint64_t alignment_;
  uint32_t alignment_shift_;
  uint64_t units_total_;
  uint64_t units_free_;
  size_t live_ = 0;
  std::vector<Node> nodes_;
  std::vector<uint32_t> spare_nodes_;
  uint64_t top_bitmap_ = 0;      // bit f: some list in first-level class f is non-empty
  uint8_t sub_bitmap_[64] = {};  // bit s of [f]: list f*8+s is non-empty
  uint32_t heads_[kClasses];
  // Where Reserve looks first: the node right after the range the last Reserve took (kNone: none
  // yet). Only a hint: checked before use, since frees and allocations change the nodes.
  uint32_t reserve_hint_ = kNone;
};

}  // namespace larder::master
