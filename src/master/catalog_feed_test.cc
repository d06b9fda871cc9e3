// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The catalog feed on its own: ranges held until their owner acknowledges the REMOVE that freed
// them, and a log that overflows its bound.
#include "master/catalog_feed.h"

#include <gtest/gtest.h>

#include <vector>

namespace larder::master {
namespace {

TEST(CatalogFeedTest, HeldRangesComeBackWhenTheOwnerAcknowledges) {
  CatalogFeed feed(4);
  feed.AddSegment(7, /*reset=*/false);
  ASSERT_TRUE(feed.Acknowledge(7, 0));  // the owner reads its catalog
  LoggedChange remove;
  remove.kind = CatalogChangeKind::kRemove;
  remove.key = "k";
  remove.size = 100;
  const uint64_t first = feed.Append(7, remove);
  const uint64_t second = feed.Append(7, remove);
  ASSERT_EQ(second, first + 1);
  EXPECT_TRUE(feed.Hold(StoredReplica{7, 0, 1}, 100, first));
  EXPECT_TRUE(feed.Hold(StoredReplica{7, 128, 2}, 100, second));
  EXPECT_FALSE(feed.Hold(StoredReplica{8, 0, 3}, 100, first)) << "no log: free at once";
  EXPECT_FALSE(feed.Hold(StoredReplica{7, 256, 4}, 100, 0)) << "no REMOVE: free at once";
  EXPECT_EQ(feed.held_bytes(), 200u);
  std::vector<StoredReplica> released;
  ASSERT_TRUE(feed.Acknowledge(7, first, false, &released));
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0].handle, 1u);
  EXPECT_EQ(feed.held_bytes(), 100u);
  EXPECT_FALSE(feed.Hold(StoredReplica{7, 512, 5}, 100, first)) << "acknowledged already";
  // An acknowledgement past what was logged frees nothing.
  released.clear();
  ASSERT_TRUE(feed.Acknowledge(7, second + 10, false, &released));
  EXPECT_TRUE(released.empty());
  // The segment goes: its held ranges go with it, unfreed (its allocator is gone).
  feed.RemoveSegment(7);
  EXPECT_EQ(feed.held_bytes(), 0u);
}

// A log that grows past its bound is cut short; the owner then gets the whole catalog.
TEST(CatalogFeedTest, OverflowResetsTheLog) {
  CatalogFeed feed(4);
  feed.AddSegment(7, /*reset=*/false);
  LoggedChange change;
  change.key = "k";
  // Never read, the log is cut at the smaller bound (an owner that predates catalogs).
  for (size_t i = 0; i <= kMaxPendingCatalogChangesUnread; ++i) feed.Append(7, change);
  EXPECT_EQ(feed.resets(), 1u);
  ASSERT_TRUE(feed.Acknowledge(7, 0));  // the first read: a reset, with nothing in it
  SegmentCatalogChanges read;
  while (feed.NextSnapshotShard(7, 0, 10).has_value()) {
  }
  feed.Read(7, 0, 10, 0, &read);
  EXPECT_TRUE(read.reset);
  EXPECT_TRUE(read.changes.empty());
  EXPECT_FALSE(read.more);
  // Read once, the log holds up to the larger bound.
  for (size_t i = 0; i < kMaxPendingCatalogChanges; ++i) {
    change.offset = i * 64;
    feed.Append(7, change);
  }
  EXPECT_EQ(feed.resets(), 1u);
  const uint64_t first = kMaxPendingCatalogChangesUnread + 1;  // the reset's first seq
  ASSERT_TRUE(feed.Acknowledge(7, first));
  feed.Read(7, first, 10, 0, &read);
  EXPECT_FALSE(read.reset);
  ASSERT_EQ(read.changes.size(), 10u);
  EXPECT_EQ(read.changes[0].seq, first + 1);
  EXPECT_TRUE(read.more);
  feed.Append(7, change);  // back at the bound
  EXPECT_EQ(feed.resets(), 1u);
  feed.Append(7, change);  // past it: the log is cut
  EXPECT_EQ(feed.resets(), 2u);
  // Nothing is logged until the owner asks; then a reset, with a snapshot shard by shard.
  feed.Append(7, change);
  ASSERT_TRUE(feed.Acknowledge(7, 5));
  feed.Read(7, 5, 10, 0, &read);
  EXPECT_TRUE(read.reset);
  EXPECT_TRUE(read.changes.empty());
  EXPECT_TRUE(read.more) << "shards are still to be scanned";
  for (size_t shard = 0; shard < 4; ++shard) {
    std::optional<size_t> next = feed.NextSnapshotShard(7, 5, 10);
    ASSERT_TRUE(next.has_value());
    EXPECT_EQ(*next, shard);
    change.offset = shard;
    feed.AppendSnapshot(7, change);
  }
  EXPECT_FALSE(feed.NextSnapshotShard(7, 5, 10).has_value());
  feed.Read(7, 5, 10, 0, &read);
  EXPECT_TRUE(read.reset);
  ASSERT_EQ(read.changes.size(), 4u);
  EXPECT_FALSE(read.more);
  // Acknowledged: no reset any more, nothing pending.
  const uint64_t last = read.changes.back().seq;
  ASSERT_TRUE(feed.Acknowledge(7, last));
  feed.Read(7, last, 10, 0, &read);
  EXPECT_FALSE(read.reset);
  EXPECT_TRUE(read.changes.empty());
  EXPECT_FALSE(read.more);
  // Touches never cut a log short: past half the bound they are dropped.
  TouchBatch touches;
  for (size_t i = 0; i < kMaxPendingCatalogChanges / 2 + 10; ++i) touches.Add(7, 0, i);
  feed.Append(touches);
  EXPECT_EQ(feed.resets(), 2u);
  feed.Read(7, last, kMaxPendingCatalogChanges, 0, &read);
  EXPECT_EQ(read.changes.size(), kMaxPendingCatalogChanges / 2);
  EXPECT_EQ(read.changes[0].kind, CatalogChangeKind::kTouch);
  feed.RemoveSegment(7);
  EXPECT_FALSE(feed.Acknowledge(7, 0));
}

}  // namespace
}  // namespace larder::master
