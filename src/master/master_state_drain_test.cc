// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// An operator's drain of a segment: no new placements there, its objects listed most used first,
// moved by upserts, and the rest removed.
#include <gtest/gtest.h>

#include "master/master_state_test_fixture.h"

namespace larder::master {
namespace {

class DrainTest : public MasterStateTest {
 protected:
  void SetUp() override {
    seg_a_ = Mount("a", "seg-a", 1 << 20, 0x100000);
    seg_b_ = Mount("b", "seg-b", 1 << 20, 0x200000, "host-b");
    on_a_.preferred_segments = {"seg-a"};
  }
  PoolSegmentId SegmentOf(std::string_view key) {
    GetOutcome got = Get("a", key, nullptr, GetMode::kPeek);
    EXPECT_TRUE(got.status.ok()) << got.status;
    return got.replicas.empty() ? 0 : got.replicas[0].segment_id;
  }
  std::vector<std::string> Listed(size_t limit, bool* truncated = nullptr) {
    auto listing = state_.ListSegmentObjects("seg-a", limit);
    EXPECT_TRUE(listing.ok()) << listing.status();
    std::vector<std::string> keys;
    if (!listing.ok()) return keys;
    for (const SegmentObject& object : listing->objects) keys.push_back(object.key);
    if (truncated != nullptr) *truncated = listing->truncated;
    return keys;
  }

  PoolSegmentId seg_a_ = 0, seg_b_ = 0;
  PutOptions on_a_;
};

TEST_F(DrainTest, ADrainingSegmentTakesNoNewReplicasUntilTheDrainEnds) {
  ASSERT_TRUE(Put("a", "before", 4096, on_a_).ok());
  ASSERT_EQ(SegmentOf("before"), seg_a_);

  auto drained = state_.SetDraining("seg-a", true);
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_TRUE(drained->draining);
  EXPECT_EQ(drained->objects, 1u);
  ASSERT_TRUE(Put("a", "during", 4096, on_a_).ok());
  EXPECT_EQ(SegmentOf("during"), seg_b_);  // preferred, but draining
  EXPECT_EQ(SegmentOf("before"), seg_a_);  // still readable where it is
  EXPECT_TRUE(state_.ListSegments({})[0].draining);

  ASSERT_TRUE(state_.SetDraining("seg-a", false).ok());
  ASSERT_TRUE(Put("a", "after", 4096, on_a_).ok());
  EXPECT_EQ(SegmentOf("after"), seg_a_);

  EXPECT_EQ(state_.SetDraining("seg-nope", true).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(state_.ListSegmentObjects("seg-nope", 10).status().code(), StatusCode::kNotFound);
}

TEST_F(DrainTest, EverySegmentDrainingLeavesNoRoomForAPut) {
  ASSERT_TRUE(state_.SetDraining("seg-a", true).ok());
  ASSERT_TRUE(state_.SetDraining("seg-b", true).ok());
  PutStartOutcome refused = PutStart("a", "nowhere", 4096);
  EXPECT_FALSE(refused.status.ok());
  EXPECT_EQ(Exist("a", "nowhere").code(), StatusCode::kNotFound);
}

TEST_F(DrainTest, ObjectsAreListedMostRecentlyUsedFirst) {
  for (const char* key : {"k1", "k2", "k3", "k4"}) ASSERT_TRUE(Put("a", key, 4096, on_a_).ok());
  Get("a", "k2");  // used last
  bool truncated = true;
  std::vector<std::string> all = Listed(100, &truncated);
  EXPECT_FALSE(truncated);
  EXPECT_EQ(all, (std::vector<std::string>{"k2", "k4", "k3", "k1"}));

  EXPECT_EQ(Listed(2, &truncated), (std::vector<std::string>{"k2", "k4"}));
  EXPECT_TRUE(truncated);
}

TEST_F(DrainTest, AnUpsertMovesAnObjectOffADrainingSegmentAndKeepsItsPin) {
  PutOptions pinned = on_a_;
  pinned.pin = true;
  ASSERT_TRUE(Put("a", "hot", 4096, pinned).ok());
  ASSERT_TRUE(state_.SetDraining("seg-a", true).ok());

  PutOptions upsert;
  upsert.upsert = true;
  ASSERT_TRUE(Put("a", "hot", 4096, upsert).ok());
  EXPECT_EQ(SegmentOf("hot"), seg_b_);
  EXPECT_TRUE(Listed(10).empty());
  auto listing = state_.ListSegments({});
  ASSERT_EQ(listing.size(), 2u);
  EXPECT_EQ(listing[0].objects, 0u);  // seg-a: the old replica is freed
  // The pin came along: removal by the segment's end leaves it alone, as it is not there.
  auto dropped = state_.RemoveOnSegment("seg-a", false);
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_EQ(dropped->removed, 0u);
  EXPECT_TRUE(Exist("a", "hot").ok());
}

TEST_F(DrainTest, RemoveOnSegmentNeedsADrainAndTouchesOnlyThatSegment) {
  ASSERT_TRUE(Put("a", "on-a-1", 4096, on_a_).ok());
  ASSERT_TRUE(Put("a", "on-a-2", 4096, on_a_).ok());
  PutOptions on_b;
  on_b.preferred_segments = {"seg-b"};
  ASSERT_TRUE(Put("a", "on-b", 4096, on_b).ok());

  EXPECT_EQ(state_.RemoveOnSegment("seg-a", false).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(state_.RemoveOnSegment("seg-nope", false).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(state_.SetDraining("seg-a", true).ok());

  Lease("b", "on-a-2");  // a reader holds it
  auto dropped = state_.RemoveOnSegment("seg-a", false);
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_EQ(dropped->removed, 1u);
  EXPECT_EQ(dropped->skipped_leased, 1u);
  EXPECT_EQ(Exist("a", "on-a-1").code(), StatusCode::kNotFound);
  EXPECT_TRUE(Exist("a", "on-a-2").ok());
  EXPECT_TRUE(Exist("a", "on-b").ok());

  dropped = state_.RemoveOnSegment("seg-a", true);
  ASSERT_TRUE(dropped.ok());
  EXPECT_EQ(dropped->removed, 1u);
  EXPECT_EQ(Exist("a", "on-a-2").code(), StatusCode::kNotFound);
  EXPECT_TRUE(Exist("a", "on-b").ok());
}

}  // namespace
}  // namespace larder::master
