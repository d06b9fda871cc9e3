// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/offset_allocator.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

namespace larder::master {
namespace {

TEST(OffsetAllocatorTest, WholeCapacityInOnePiece) {
  OffsetAllocator allocator(1 << 20);
  auto all = allocator.Allocate(1 << 20);
  ASSERT_TRUE(all.has_value());
  EXPECT_EQ(all->offset, 0u);
  EXPECT_EQ(allocator.free_bytes(), 0u);
  EXPECT_FALSE(allocator.Allocate(1).has_value());
  allocator.Free(all->handle);
  EXPECT_EQ(allocator.free_bytes(), 1u << 20);
}

TEST(OffsetAllocatorTest, RoundsToAlignment) {
  OffsetAllocator allocator(4096, 64);
  auto a = allocator.Allocate(1);
  auto b = allocator.Allocate(65);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->offset % 64, 0u);
  EXPECT_EQ(b->offset % 64, 0u);
  EXPECT_EQ(allocator.used_bytes(), 64u + 128u);
  EXPECT_FALSE(allocator.Allocate(0).has_value());
}

TEST(OffsetAllocatorTest, CoalescesNeighboursBothWays) {
  OffsetAllocator allocator(64 * 3, 64);
  auto a = allocator.Allocate(64);
  auto b = allocator.Allocate(64);
  auto c = allocator.Allocate(64);
  ASSERT_TRUE(a && b && c);
  allocator.Free(a->handle);
  allocator.Free(c->handle);
  EXPECT_FALSE(allocator.Allocate(128).has_value());  // two free holes, not adjacent
  allocator.Free(b->handle);                          // joins both
  auto all = allocator.Allocate(192);
  ASSERT_TRUE(all.has_value());
  EXPECT_EQ(all->offset, 0u);
}

// Random allocate/free against a model: no two live ranges overlap, every range lies inside the
// capacity, accounting matches, and freeing everything leaves one range as large as the capacity.
TEST(OffsetAllocatorTest, RandomWorkloadNeverOverlaps) {
  constexpr uint64_t kCapacity = 64ull << 20;
  OffsetAllocator allocator(kCapacity, 64);
  std::mt19937_64 rng(42);
  std::map<uint64_t, std::pair<uint64_t, OffsetAllocator::Handle>> live;  // offset -> size, handle
  uint64_t used = 0;
  for (int step = 0; step < 200000; ++step) {
    bool allocate = live.empty() || rng() % 100 < 55;
    if (allocate) {
      uint64_t size = 1 + rng() % ((rng() % 10 == 0) ? (4ull << 20) : 65536);
      auto got = allocator.Allocate(size);
      if (!got) continue;
      uint64_t rounded = (size + 63) / 64 * 64;
      ASSERT_LE(got->offset + rounded, kCapacity);
      auto next = live.lower_bound(got->offset);
      if (next != live.end()) {
        ASSERT_LE(got->offset + rounded, next->first);
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second.first, got->offset);
      }
      live[got->offset] = {rounded, got->handle};
      used += rounded;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      allocator.Free(it->second.second);
      used -= it->second.first;
      live.erase(it);
    }
    ASSERT_EQ(allocator.used_bytes(), used);
    ASSERT_EQ(allocator.live_allocations(), live.size());
  }
  for (auto& [offset, entry] : live) allocator.Free(entry.second);
  EXPECT_EQ(allocator.free_bytes(), kCapacity);
  EXPECT_TRUE(allocator.Allocate(kCapacity).has_value());
}

TEST(OffsetAllocatorTest, FillsWithEqualPagesExactly) {
  // A segment of N pages holds exactly N pages: equal sizes never fragment.
  OffsetAllocator allocator(100 * 65536, 64);
  std::vector<OffsetAllocator::Handle> handles;
  for (int i = 0; i < 100; ++i) {
    auto got = allocator.Allocate(65536);
    ASSERT_TRUE(got.has_value()) << i;
    handles.push_back(got->handle);
  }
  EXPECT_FALSE(allocator.Allocate(65536).has_value());
  allocator.Free(handles[37]);
  EXPECT_TRUE(allocator.Allocate(65536).has_value());
}

TEST(OffsetAllocatorReserveTest, TakesExactlyTheRangeAsked) {
  OffsetAllocator allocator(64 * 100, 64);
  auto middle = allocator.Reserve(64 * 10, 100);  // rounded up to 128 bytes
  ASSERT_TRUE(middle.has_value());
  EXPECT_EQ(middle->offset, 640u);
  EXPECT_EQ(allocator.used_bytes(), 128u);
  EXPECT_EQ(allocator.live_allocations(), 1u);
  // Both sides stay free: the 10 units below and the 88 above.
  EXPECT_TRUE(allocator.Reserve(0, 640).has_value());
  EXPECT_TRUE(allocator.Reserve(64 * 12, 64 * 88).has_value());
  EXPECT_EQ(allocator.free_bytes(), 0u);
  EXPECT_FALSE(allocator.Allocate(1).has_value());
}

TEST(OffsetAllocatorReserveTest, RefusesOverlapsUnalignedAndPastTheEnd) {
  OffsetAllocator allocator(64 * 100, 64);
  ASSERT_TRUE(allocator.Reserve(64 * 10, 64 * 4).has_value());   // units 10..13
  EXPECT_FALSE(allocator.Reserve(64 * 10, 64).has_value());      // the same start
  EXPECT_FALSE(allocator.Reserve(64 * 13, 64).has_value());      // its last unit
  EXPECT_FALSE(allocator.Reserve(64 * 8, 64 * 3).has_value());   // runs into it
  EXPECT_FALSE(allocator.Reserve(64 * 9, 64 * 10).has_value());  // covers it
  EXPECT_FALSE(allocator.Reserve(64 * 12, 1).has_value());       // inside it
  EXPECT_FALSE(allocator.Reserve(65, 64).has_value());           // unaligned
  EXPECT_FALSE(allocator.Reserve(0, 0).has_value());
  EXPECT_FALSE(allocator.Reserve(64 * 99, 65).has_value());  // one byte past the end, rounded
  EXPECT_FALSE(allocator.Reserve(64 * 100, 64).has_value());
  EXPECT_FALSE(allocator.Reserve(64 * 50, UINT64_MAX).has_value());
  EXPECT_FALSE(allocator.Reserve(UINT64_MAX - 63, 64).has_value());
  EXPECT_TRUE(allocator.Reserve(64 * 99, 64).has_value());  // the last unit
  EXPECT_TRUE(allocator.Reserve(64 * 14, 64).has_value());  // right after the first range
  EXPECT_TRUE(allocator.Reserve(64 * 9, 64).has_value());   // right before it
  EXPECT_EQ(allocator.used_bytes(), 64u * 7);
}

TEST(OffsetAllocatorReserveTest, InterleavesWithAllocateAndFreeAndCoalescesAfterwards) {
  constexpr uint64_t kUnits = 1000;
  OffsetAllocator allocator(64 * kUnits, 64);
  std::map<uint64_t, OffsetAllocator::Handle> live;  // by offset
  // Every other 4-unit range, in ascending order, as a rebuild reserves them.
  for (uint64_t unit = 0; unit < kUnits; unit += 8) {
    auto got = allocator.Reserve(unit * 64, 4 * 64);
    ASSERT_TRUE(got.has_value()) << unit;
    live[got->offset] = got->handle;
  }
  EXPECT_EQ(allocator.used_bytes(), 64u * 4 * 125);
  // Allocations fill the holes between them, and never overlap a reserved range.
  for (int i = 0; i < 125; ++i) {
    auto got = allocator.Allocate(4 * 64);
    ASSERT_TRUE(got.has_value()) << i;
    EXPECT_EQ(got->offset / 64 % 8, 4u) << got->offset;
    ASSERT_TRUE(live.emplace(got->offset, got->handle).second);
  }
  EXPECT_EQ(allocator.free_bytes(), 0u);
  // Out of order now (the hint is stale): reserves in a hole that a free opened.
  allocator.Free(live.at(64 * 24));  // units 24..27
  live.erase(64 * 24);
  EXPECT_FALSE(allocator.Reserve(64 * 23, 64).has_value());
  EXPECT_FALSE(allocator.Reserve(64 * 27, 128).has_value());
  for (auto [unit, units] : {std::pair<uint64_t, uint64_t>{25, 1}, {24, 1}, {26, 2}}) {
    auto got = allocator.Reserve(64 * unit, 64 * units);
    ASSERT_TRUE(got.has_value()) << unit;
    EXPECT_EQ(got->offset, 64 * unit);
    live[got->offset] = got->handle;
  }
  EXPECT_FALSE(allocator.Allocate(1).has_value());
  // Half of them go, an allocation reuses a hole, a reserve takes another.
  for (uint64_t unit = 0; unit < kUnits; unit += 16) {
    allocator.Free(live.at(64 * unit));
    live.erase(64 * unit);
  }
  auto reused = allocator.Allocate(4 * 64);
  ASSERT_TRUE(reused.has_value());
  EXPECT_EQ(reused->offset / 64 % 16, 0u);
  live[reused->offset] = reused->handle;
  const uint64_t hole = reused->offset == 0 ? 16 : 0;
  auto taken = allocator.Reserve(64 * hole + 64, 64);
  ASSERT_TRUE(taken.has_value());
  live[taken->offset] = taken->handle;
  // Freeing everything coalesces back into one range of the whole capacity.
  for (const auto& [offset, handle] : live) allocator.Free(handle);
  EXPECT_EQ(allocator.live_allocations(), 0u);
  EXPECT_EQ(allocator.free_bytes(), 64u * kUnits);
  auto whole = allocator.Allocate(64 * kUnits);
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(whole->offset, 0u);
}

// Random reserves, allocations and frees against a model: a reserve succeeds exactly when its
// rounded range is free in the model, and nothing ever overlaps.
TEST(OffsetAllocatorReserveTest, RandomReservesMatchAModel) {
  constexpr uint64_t kUnits = 4096;
  OffsetAllocator allocator(64 * kUnits, 64);
  std::vector<bool> used(kUnits, false);
  std::map<uint64_t, std::pair<uint64_t, OffsetAllocator::Handle>> live;  // unit -> units, handle
  std::mt19937_64 rng(7);
  auto range_free = [&](uint64_t unit, uint64_t units) {
    if (unit + units > kUnits) return false;
    for (uint64_t u = unit; u < unit + units; ++u) {
      if (used[u]) return false;
    }
    return true;
  };
  auto mark = [&](uint64_t unit, uint64_t units, bool value) {
    for (uint64_t u = unit; u < unit + units; ++u) used[u] = value;
  };
  for (int step = 0; step < 50000; ++step) {
    const int op = static_cast<int>(rng() % 10);
    const uint64_t units = 1 + rng() % 16;
    if (op < 4) {
      const uint64_t unit = rng() % kUnits;
      const bool expect = range_free(unit, units);
      auto got = allocator.Reserve(unit * 64, units * 64 - rng() % 64);
      ASSERT_EQ(got.has_value(), expect) << "step " << step << " unit " << unit;
      if (!got) continue;
      ASSERT_EQ(got->offset, unit * 64);
      mark(unit, units, true);
      live[unit] = {units, got->handle};
    } else if (op < 7) {
      auto got = allocator.Allocate(units * 64);
      if (!got) continue;
      const uint64_t unit = got->offset / 64;
      ASSERT_TRUE(range_free(unit, units)) << "step " << step;
      mark(unit, units, true);
      live[unit] = {units, got->handle};
    } else if (!live.empty()) {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      allocator.Free(it->second.second);
      mark(it->first, it->second.first, false);
      live.erase(it);
    }
    ASSERT_EQ(allocator.live_allocations(), live.size());
  }
  for (const auto& [unit, entry] : live) allocator.Free(entry.second);
  EXPECT_EQ(allocator.free_bytes(), 64u * kUnits);
  EXPECT_TRUE(allocator.Allocate(64 * kUnits).has_value());
}

// A rebuild reserves a segment's objects in ascending order: 200,000 of them take milliseconds
// (each starts where the last ended), where a walk from the start each time would take minutes.
TEST(OffsetAllocatorReserveTest, AscendingReservesDoNotWalk) {
  constexpr uint64_t kObjects = 200000;
  OffsetAllocator allocator(kObjects * 2 * 4096, 64);
  for (uint64_t i = 0; i < kObjects; ++i) {
    ASSERT_TRUE(allocator.Reserve(i * 2 * 4096, 4096).has_value()) << i;
  }
  EXPECT_EQ(allocator.used_bytes(), kObjects * 4096);
  EXPECT_EQ(allocator.live_allocations(), kObjects);
}

}  // namespace
}  // namespace larder::master
