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

}  // namespace
}  // namespace larder::master
