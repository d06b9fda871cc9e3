// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// A restarted client takes its segment name back from its own previous process: at once when it
// shows that process gone, or once the holder has been silent for a heartbeat interval; never
// from a holder that keeps heartbeating.
#include <gtest/gtest.h>

#include "master/master_state.h"
#include "master/master_state_test_fixture.h"

namespace larder::master {
namespace {

using std::chrono::milliseconds;

class TakeoverTest : public MasterStateTest {
 protected:
  MountOutcome MountAs(const std::string& client, const std::string& host, uint32_t pid,
                       uint32_t take_over_pid = 0, const std::string& name = "seg",
                       std::vector<CatalogEntry> catalog = {}) {
    SegmentMount mount{name, 0x100000, 1 << 20, {}};
    mount.catalog = std::move(catalog);
    mount.catalog_incarnation = 1;
    MountCaller caller{client, host, pid, take_over_pid};
    std::vector<MountOutcome> outcomes = state_.MountSegments(caller, std::span(&mount, 1));
    EXPECT_EQ(outcomes.size(), 1u);
    return outcomes.at(0);
  }
};

TEST_F(TakeoverTest, ARefusalNamesTheHolder) {
  MountOutcome old = MountAs("old", "host-a", 100);
  ASSERT_TRUE(old.status.ok()) << old.status;
  MountOutcome refused = MountAs("new", "host-a", 200);
  EXPECT_EQ(refused.status.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(refused.holder_host_id, "host-a");
  EXPECT_EQ(refused.holder_pid, 100u);
  EXPECT_EQ(refused.segment_id, 0u);
  // The holder itself mounting its name again (a retry whose reply was lost) is refused as
  // before, without holder fields, and even its own pid as take_over_pid changes nothing.
  MountOutcome again = MountAs("old", "host-a", 100, 100);
  EXPECT_EQ(again.status.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(again.holder_pid, 0u);
  EXPECT_EQ(state_.Stats().segments, 1u);
}

TEST_F(TakeoverTest, AProcessShownGoneLosesItsSegmentAtOnce) {
  ASSERT_TRUE(MountAs("old", "host-a", 100).status.ok());
  ASSERT_TRUE(Put("old", "k", 100).ok());
  const uint64_t used = state_.Stats().bytes_used;
  ASSERT_GT(used, 0u);
  // The wrong pid, or the right one from another host, proves nothing.
  EXPECT_EQ(MountAs("new", "host-a", 200, 101).status.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(MountAs("other", "host-b", 200, 100).status.code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(Exist("old", "k").ok());
  // The holder's pid from its host: taken over, its objects dropped, a fresh allocator, and the
  // new mount's own catalog rebuilt.
  MountOutcome taken =
      MountAs("new", "host-a", 200, 100, "seg", {CatalogEntry{"mine", 4096, 100, false, 0, 1}});
  ASSERT_TRUE(taken.status.ok()) << taken.status;
  EXPECT_EQ(taken.recovery.restored, 1u);
  EXPECT_EQ(Exist("new", "k").code(), StatusCode::kNotFound);
  EXPECT_TRUE(Exist("new", "mine").ok());
  EXPECT_EQ(state_.Stats().bytes_used, 128u);
  EXPECT_EQ(state_.Stats().segments, 1u);
  std::vector<SegmentView> views = state_.ListSegments({});
  ASSERT_EQ(views.size(), 1u);
  EXPECT_EQ(views[0].client_id, "new");
  EXPECT_EQ(views[0].segment_id, taken.segment_id);
  // The old client is still registered (it may have other segments) but holds nothing.
  EXPECT_FALSE(state_.Heartbeat("old").remount_required);
}

TEST_F(TakeoverTest, ASilentHolderIsTakenOverAfterAHeartbeatInterval) {
  ASSERT_TRUE(MountAs("old", "host-a", 100).status.ok());
  ASSERT_TRUE(Put("old", "k", 100).ok());
  // The first refusal starts the clock; the holder says nothing from then on.
  EXPECT_EQ(MountAs("new", "host-a", 200).status.code(), StatusCode::kAlreadyExists);
  Advance(milliseconds(1000));
  EXPECT_EQ(MountAs("new", "host-a", 200).status.code(), StatusCode::kAlreadyExists);
  Advance(milliseconds(666));  // 1666 ms: just under client_ttl / 3 (1666.67 ms)
  EXPECT_EQ(MountAs("new", "host-a", 200).status.code(), StatusCode::kAlreadyExists);
  Advance(milliseconds(1));
  MountOutcome taken = MountAs("new", "host-a", 200);
  ASSERT_TRUE(taken.status.ok()) << taken.status;
  EXPECT_EQ(Exist("new", "k").code(), StatusCode::kNotFound);
  EXPECT_EQ(state_.Stats().bytes_used, 0u);
}

TEST_F(TakeoverTest, AHolderThatKeepsHeartbeatingIsNeverTakenOver) {
  ASSERT_TRUE(MountAs("old", "host-a", 100).status.ok());
  ASSERT_TRUE(Put("old", "k", 100).ok());
  // The holder heartbeats every second; the newcomer asks every 300 ms for 30 s.
  for (int step = 0; step < 100; ++step) {
    if (step % 3 == 0) {
      ASSERT_FALSE(state_.Heartbeat("old").remount_required);
    }
    MountOutcome refused = MountAs("new", "host-a", 200);
    ASSERT_EQ(refused.status.code(), StatusCode::kAlreadyExists) << "step " << step;
    EXPECT_EQ(refused.holder_pid, 100u);
    Advance(milliseconds(300));
    state_.RunMaintenance();
  }
  EXPECT_TRUE(Exist("old", "k").ok());
  // Once it stops, the newcomer gets the name a heartbeat interval after its next refusal.
  EXPECT_EQ(MountAs("new", "host-a", 200).status.code(), StatusCode::kAlreadyExists);
  Advance(milliseconds(1700));
  EXPECT_TRUE(MountAs("new", "host-a", 200).status.ok());
}

TEST_F(TakeoverTest, AHolderWhoSpeaksAfterTheFirstRefusalRestartsTheClock) {
  ASSERT_TRUE(MountAs("old", "host-a", 100).status.ok());
  EXPECT_EQ(MountAs("new", "host-a", 200).status.code(), StatusCode::kAlreadyExists);
  Advance(milliseconds(1000));
  state_.Heartbeat("old");  // alive after the first refusal
  Advance(milliseconds(1000));
  // 2 s since the first refusal, but the holder spoke 1 s ago: refused, and the clock restarts.
  EXPECT_EQ(MountAs("new", "host-a", 200).status.code(), StatusCode::kAlreadyExists);
  Advance(milliseconds(1600));
  EXPECT_EQ(MountAs("new", "host-a", 200).status.code(), StatusCode::kAlreadyExists);
  Advance(milliseconds(100));
  EXPECT_TRUE(MountAs("new", "host-a", 200).status.ok());
}

}  // namespace
}  // namespace larder::master
