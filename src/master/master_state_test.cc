// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/master_state.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "master/master_state_test_fixture.h"

namespace larder::master {
namespace {

using std::chrono::milliseconds;

TEST_F(MasterStateTest, PutThenGetReturnsTheSameReplica) {
  PoolSegmentId segment = Mount("a", "seg-a", 1 << 20);
  PutStartOutcome start = PutStart("a", "k1", 4096);
  ASSERT_TRUE(start.status.ok()) << start.status;
  ASSERT_EQ(start.replicas.size(), 1u);
  EXPECT_EQ(start.replicas[0].segment_id, segment);
  EXPECT_LE(start.replicas[0].offset + 4096, 1u << 20);
  EXPECT_EQ(Exist("a", "k1").code(), StatusCode::kNotFound);  // not readable before PutEnd
  // Being written: a retryable refusal that says so (Mooncake's REPLICA_IS_NOT_READY).
  const Status writing = Get("a", "k1").status;
  EXPECT_EQ(writing.code(), StatusCode::kUnavailable);
  EXPECT_EQ(writing.detail(), ErrorDetail::kBeingWritten) << writing;
  ASSERT_TRUE(PutEnd("a", "k1").ok());
  std::string_view key = "k1";
  auto batch = state_.BatchGetReplicas("a", std::span(&key, 1));
  ASSERT_TRUE(batch.ok()) << batch.status();
  const GetOutcome& got = batch->items[0];
  ASSERT_TRUE(got.status.ok()) << got.status;
  EXPECT_EQ(got.size, 4096u);
  ASSERT_EQ(got.replicas.size(), 1u);
  EXPECT_EQ(got.replicas[0].offset, start.replicas[0].offset);
  EXPECT_NE(batch->lease_id, 0u);
  EXPECT_EQ(batch->lease_ttl, milliseconds(1000));
  EXPECT_TRUE(Exist("a", "k1").ok());
}

TEST_F(MasterStateTest, ObjectsAreImmutable) {
  Mount("a", "seg-a", 1 << 20);
  ASSERT_TRUE(Put("a", "k", 100).ok());
  PutStartOutcome again = PutStart("a", "k", 999);
  EXPECT_TRUE(again.status.ok());
  EXPECT_TRUE(again.already_exists);
  EXPECT_TRUE(again.replicas.empty());
  EXPECT_EQ(Get("a", "k").size, 100u);
}

TEST_F(MasterStateTest, BadInputGetsClearErrors) {
  Mount("a", "seg-a", 1 << 20);
  EXPECT_EQ(PutStart("a", "", 10).status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PutStart("a", std::string(65, 'x'), 10).status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PutStart("a", "zero", 0).status.code(), StatusCode::kInvalidArgument);
  PutStartOutcome huge = PutStart("a", "huge", 2 << 20);
  EXPECT_EQ(huge.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(huge.status.message().find("larger than every mounted segment"), std::string::npos);
  PutOptions three;
  three.replica_num = 3;
  EXPECT_EQ(PutStart("a", "r3", 10, three).status.code(), StatusCode::kInvalidArgument);
  PutOptions too_many;
  too_many.replica_num = kMaxReplicas + 1;
  PutStartOutcome refused = PutStart("a", "r65", 10, too_many);
  EXPECT_EQ(refused.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status.message().find("at most 64"), std::string::npos) << refused.status;
  EXPECT_EQ(Get("a", "missing").status.code(), StatusCode::kNotFound);
  EXPECT_EQ(Remove("a", "missing").code(), StatusCode::kNotFound);
  EXPECT_EQ(PutEnd("a", "missing").code(), StatusCode::kNotFound);

  std::vector<PutStartItem> dup = {{"d", 10}, {"d", 10}};
  auto results = state_.BatchPutStart("a", dup, {});
  ASSERT_TRUE(results.ok());
  EXPECT_TRUE((*results)[0].status.ok());
  EXPECT_EQ((*results)[1].status.code(), StatusCode::kInvalidArgument);

  // An unknown (or expired) client is refused for the whole call.
  EXPECT_EQ(state_.BatchPutStart("ghost", dup, {}).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(Get("ghost", "d").status.code(), StatusCode::kFailedPrecondition);
  // Another client's put cannot be ended by us.
  Mount("b", "seg-b", 1 << 20, 0x100000);
  EXPECT_EQ(PutEnd("b", "d").code(), StatusCode::kFailedPrecondition);
  // Still serving.
  EXPECT_TRUE(PutEnd("a", "d").ok());
  EXPECT_TRUE(Exist("b", "d").ok());
}

TEST_F(MasterStateTest, MountRejectsZeroSizeOverlapAndDuplicateNames) {
  Mount("a", "seg-a", 1 << 20, 0x100000);
  std::vector<SegmentMount> bad = {
      {"zero", 0x900000, 0, {}},
      {"overlap", 0x180000, 1 << 20, {}},
      {"seg-a", 0x900000, 1 << 20, {}},
  };
  auto results = state_.MountSegments("a", "host-a", bad);
  EXPECT_EQ(results[0].status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(results[1].status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(results[2].status().code(), StatusCode::kAlreadyExists);
  // The same range in another process is fine: addresses are per process.
  Mount("b", "seg-b", 1 << 20, 0x100000);
  EXPECT_EQ(state_.Stats().segments, 2u);
}

TEST_F(MasterStateTest, ReplicasGoToDistinctSegmentsAndPreferredFirst) {
  PoolSegmentId a = Mount("a", "seg-a", 1 << 20);
  PoolSegmentId b = Mount("b", "seg-b", 1 << 20);
  PoolSegmentId c = Mount("c", "seg-c", 1 << 20);
  PutOptions options;
  options.replica_num = 2;
  options.preferred_segments = {"seg-c"};
  PutStartOutcome start = PutStart("a", "k", 1000, options);
  ASSERT_TRUE(start.status.ok());
  ASSERT_EQ(start.replicas.size(), 2u);
  EXPECT_EQ(start.replicas[0].segment_id, c);
  EXPECT_NE(start.replicas[1].segment_id, c);
  // Local host first: the writer's own segment is next.
  EXPECT_EQ(start.replicas[1].segment_id, a);
  (void)b;
}

TEST_F(MasterStateTest, LeasedObjectsCannotBeRemovedUntilTheLeaseEnds) {
  Mount("a", "seg-a", 1 << 20);
  ASSERT_TRUE(Put("a", "k", 100).ok());
  ASSERT_TRUE(Get("a", "k").status.ok());
  EXPECT_EQ(Remove("a", "k").code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Exist("a", "k").ok());  // exist does not extend the lease
  Advance(milliseconds(1001));
  EXPECT_TRUE(Remove("a", "k").ok());
  EXPECT_EQ(Get("a", "k").status.code(), StatusCode::kNotFound);
  EXPECT_EQ(state_.Stats().bytes_used, 0u);
}

TEST_F(MasterStateTest, PutEvictsLeastRecentlyUsedWhenFull) {
  Mount("a", "seg-a", 10 * 4096);
  ASSERT_TRUE(PutPages(0, 10).ok());
  Advance(milliseconds(2000));  // no leases left
  // Touch k0 and k1: k2 becomes the oldest.
  ASSERT_TRUE(Get("a", "k0").status.ok());
  ASSERT_TRUE(Get("a", "k1").status.ok());
  Advance(milliseconds(2000));
  ASSERT_TRUE(Put("a", "new", 4096).ok());
  EXPECT_EQ(Exist("a", "k2").code(), StatusCode::kNotFound);
  EXPECT_TRUE(Exist("a", "k0").ok());
  EXPECT_TRUE(Exist("a", "k1").ok());
  EXPECT_TRUE(Exist("a", "new").ok());
  EXPECT_GE(state_.Stats().evictions, 1u);
}

TEST_F(MasterStateTest, EvictionNeverTouchesLeasedOrPinnedObjects) {
  Mount("a", "seg-a", 4 * 4096);
  PutOptions pin;
  pin.pin = true;
  ASSERT_TRUE(Put("a", "pinned", 4096, pin).ok());
  ASSERT_TRUE(Put("a", "leased1", 4096).ok());
  ASSERT_TRUE(Put("a", "leased2", 4096).ok());
  ASSERT_TRUE(Put("a", "free", 4096).ok());
  ASSERT_TRUE(Get("a", "leased1").status.ok());
  ASSERT_TRUE(Get("a", "leased2").status.ok());
  ASSERT_TRUE(Put("a", "next", 4096).ok());  // only "free" may go
  ASSERT_TRUE(Get("a", "next").status.ok());
  EXPECT_EQ(Exist("a", "free").code(), StatusCode::kNotFound);
  PutStartOutcome full = PutStart("a", "more", 4096);
  EXPECT_EQ(full.status.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.status.message().find("nothing is evictable"), std::string::npos);
  for (const char* key : {"pinned", "leased1", "leased2", "next"}) {
    EXPECT_TRUE(Exist("a", key).ok()) << key;
  }
}

TEST_F(MasterStateTest, NoBackgroundEvictionByDefault) {
  Mount("a", "seg-a", 100 * 4096);
  ASSERT_TRUE(PutPages(0, 100).ok());
  Advance(milliseconds(2000));
  state_.RunMaintenance();
  EXPECT_EQ(state_.Stats().objects, 100u);  // a full pool is what the operator sized it for
}

class WatermarkTest : public MasterStateTest {
 protected:
  WatermarkTest()
      : MasterStateTest([](MasterOptions& options) { options.eviction_high_watermark = 0.95; }) {}
};

TEST_F(WatermarkTest, MaintenanceEvictsFromTheHighWatermark) {
  Mount("a", "seg-a", 100 * 4096);
  ASSERT_TRUE(PutPages(0, 100).ok());
  Advance(milliseconds(2000));
  state_.RunMaintenance();
  MasterStats stats = state_.Stats();
  EXPECT_LE(stats.bytes_used, 90u * 4096);
  EXPECT_EQ(stats.objects, 90u);
  // The oldest went first.
  EXPECT_EQ(Exist("a", "k0").code(), StatusCode::kNotFound);
  EXPECT_EQ(Exist("a", "k9").code(), StatusCode::kNotFound);
  EXPECT_TRUE(Exist("a", "k10").ok());
}

TEST_F(MasterStateTest, SilentClientIsExpiredAndItsReplicasDropped) {
  Mount("a", "seg-a", 1 << 20);
  Mount("b", "seg-b", 1 << 20);
  PutOptions on_a;
  on_a.preferred_segments = {"seg-a"};
  PutOptions both;
  both.replica_num = 2;
  ASSERT_TRUE(Put("b", "only-on-a", 100, on_a).ok());
  ASSERT_TRUE(Put("b", "on-both", 100, both).ok());
  ASSERT_TRUE(PutStart("a", "a-writing", 100).status.ok());
  for (int i = 0; i < 6; ++i) {
    Advance(milliseconds(1000));
    EXPECT_FALSE(state_.Heartbeat("b").remount_required);
    state_.RunMaintenance();
  }
  MasterStats stats = state_.Stats();
  EXPECT_EQ(stats.clients, 1u);
  EXPECT_EQ(stats.segments, 1u);
  // The operator still sees it, not alive, with how long it has been silent.
  std::vector<ClientView> listed = state_.ListClients();
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].client_id, "a");
  EXPECT_FALSE(listed[0].alive);
  EXPECT_GE(listed[0].since_last_seen_ms, 3000);
  EXPECT_EQ(listed[1].client_id, "b");
  EXPECT_TRUE(listed[1].alive);
  EXPECT_EQ(Exist("b", "only-on-a").code(), StatusCode::kNotFound);
  GetOutcome survivor = Get("b", "on-both");
  ASSERT_TRUE(survivor.status.ok());
  EXPECT_EQ(survivor.replicas.size(), 1u);
  EXPECT_EQ(Get("b", "a-writing").status.code(), StatusCode::kNotFound);
  // The expired client is told to remount, and refused until it does.
  EXPECT_TRUE(state_.Heartbeat("a").remount_required);
  PutStartItem item{"x", 10};
  EXPECT_EQ(state_.BatchPutStart("a", std::span(&item, 1), {}).status().code(),
            StatusCode::kFailedPrecondition);
  Mount("a", "seg-a", 1 << 20);
  EXPECT_TRUE(Put("a", "x", 10).ok());
  // Mounted again: listed once, alive.
  listed = state_.ListClients();
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].client_id, "a");
  EXPECT_TRUE(listed[0].alive);
}

TEST_F(MasterStateTest, ExpiredClientsAreListedForAWhileThenForgotten) {
  Mount("a", "seg-a", 1 << 20);
  for (int i = 0; i < 6; ++i) {  // past the client TTL (5 s)
    Advance(milliseconds(1000));
    state_.RunMaintenance();
  }
  ASSERT_EQ(state_.ListClients().size(), 1u);
  EXPECT_FALSE(state_.ListClients()[0].alive);
  Advance(kExpiredClientsKept + milliseconds(1));
  EXPECT_TRUE(state_.ListClients().empty());  // past the time it is kept, even before a sweep
  state_.RunMaintenance();
  EXPECT_TRUE(state_.ListClients().empty());
  // At most kMaxExpiredClientsShown are kept, the most recent ones.
  for (size_t i = 0; i < kMaxExpiredClientsShown + 5; ++i) {
    Mount("c" + std::to_string(1000 + i), "seg-c" + std::to_string(i), 1 << 20);
  }
  for (int i = 0; i < 6; ++i) {  // past the client TTL (5 s)
    Advance(milliseconds(1000));
    state_.RunMaintenance();
  }
  std::vector<ClientView> listed = state_.ListClients();
  ASSERT_EQ(listed.size(), kMaxExpiredClientsShown);
  for (const ClientView& client : listed) EXPECT_FALSE(client.alive) << client.client_id;
}

TEST_F(MasterStateTest, SegmentsTheWriterCannotReachArePlacedLast) {
  PoolSegmentId dead = Mount("a", "seg-a", 1 << 20);
  PoolSegmentId alive = Mount("b", "seg-b", 1 << 20);
  PutOptions avoid;
  avoid.avoid_segments = {dead};
  avoid.preferred_segments = {"seg-a"};  // even a preferred segment goes last
  PutStartOutcome placed = PutStart("a", "k", 4096, avoid);
  ASSERT_TRUE(placed.status.ok()) << placed.status;
  ASSERT_EQ(placed.replicas.size(), 1u);
  EXPECT_EQ(placed.replicas[0].segment_id, alive);
  // Even when the reachable segment is full: the put evicts there instead.
  for (int i = 0; i < 300; ++i) {
    ASSERT_TRUE(PutStart("b", "fill" + std::to_string(i), 4096).status.ok());
    ASSERT_TRUE(PutEnd("b", "fill" + std::to_string(i)).ok());
  }
  PutStartOutcome evicting = PutStart("a", "k3", 4096, avoid);
  ASSERT_TRUE(evicting.status.ok()) << evicting.status;
  EXPECT_EQ(evicting.replicas[0].segment_id, alive);
  // With nowhere else to go, an avoided segment is still used.
  PutOptions two = avoid;
  two.replica_num = 2;
  PutStartOutcome both = PutStart("a", "k2", 4096, two);
  ASSERT_TRUE(both.status.ok()) << both.status;
  ASSERT_EQ(both.replicas.size(), 2u);
  EXPECT_EQ(both.replicas[0].segment_id, alive);
  EXPECT_EQ(both.replicas[1].segment_id, dead);
}

TEST_F(MasterStateTest, SegmentsVersionChangesWhenASegmentGoes) {
  Mount("a", "seg-a", 1 << 20);
  Mount("b", "seg-b", 1 << 20);
  const uint64_t start = state_.Heartbeat("b").segments_version;
  EXPECT_EQ(state_.Heartbeat("a").segments_version, start);
  // Unmounted by its owner.
  ASSERT_TRUE(state_.UnmountSegments("a", {}, /*unregister=*/true).ok());
  const uint64_t after_leave = state_.Heartbeat("b").segments_version;
  EXPECT_NE(after_leave, start);
  // Lost with an owner that went silent.
  Mount("c", "seg-c", 1 << 20);
  EXPECT_EQ(state_.Heartbeat("b").segments_version, after_leave) << "a mount needs no action";
  for (int i = 0; i < 6; ++i) {
    Advance(milliseconds(1000));
    state_.Heartbeat("b");
    state_.RunMaintenance();
  }
  EXPECT_NE(state_.Heartbeat("b").segments_version, after_leave);
}

TEST_F(MasterStateTest, AbandonedPutIsRevokedAndItsSpaceReclaimedAfterGrace) {
  Mount("a", "seg-a", 1 << 20);
  ASSERT_TRUE(PutStart("a", "zombie", 8192).status.ok());
  Advance(milliseconds(3001));
  EXPECT_TRUE(state_.Heartbeat("a").remount_required == false);
  state_.RunMaintenance();
  EXPECT_EQ(PutEnd("a", "zombie").code(), StatusCode::kNotFound);
  EXPECT_EQ(state_.Stats().objects, 0u);
  // The writer might still be copying into the range: it stays out of use for a grace period.
  EXPECT_EQ(state_.Stats().bytes_used, 8192u);
  Advance(milliseconds(3001));
  state_.Heartbeat("a");
  state_.RunMaintenance();
  EXPECT_EQ(state_.Stats().bytes_used, 0u);
  // The key can be put again.
  EXPECT_TRUE(Put("a", "zombie", 8192).ok());
}

TEST_F(MasterStateTest, RevokeByTheWriterFreesAtOnce) {
  Mount("a", "seg-a", 1 << 20);
  ASSERT_TRUE(PutStart("a", "k", 8192).status.ok());
  std::string_view key = "k";
  EXPECT_TRUE(One(state_.BatchPutRevoke("a", std::span(&key, 1))).ok());
  EXPECT_EQ(state_.Stats().bytes_used, 0u);
}

TEST_F(MasterStateTest, UnmountDropsObjectsAndRemoveAllSkipsLeased) {
  PoolSegmentId a = Mount("a", "seg-a", 1 << 20);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(Put("a", "p/" + std::to_string(i), 100).ok());
  ASSERT_TRUE(Put("a", "q/0", 100).ok());
  auto keys = state_.ListKeys("p/", 3);
  ASSERT_EQ(keys.size(), 3u);
  EXPECT_EQ(keys[0].first, "p/0");
  ASSERT_TRUE(Get("a", "p/0").status.ok());
  auto removed = state_.RemoveAll("a");
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(removed->removed, 5u);
  EXPECT_EQ(removed->skipped_leased, 1u);
  auto unmounted = state_.UnmountSegments("a", std::span(&a, 1));
  ASSERT_TRUE(unmounted.ok());
  EXPECT_TRUE((*unmounted)[0].ok());
  EXPECT_EQ(state_.Stats().objects, 0u);
}

TEST_F(MasterStateTest, LeavingClientIsForgottenWithItsSegmentsAndPuts) {
  PoolSegmentId a = Mount("a", "seg-a", 1 << 20);
  Mount("b", "seg-b", 1 << 20);
  PutOptions on_a;
  on_a.preferred_segments = {"seg-a"};
  ASSERT_TRUE(Put("b", "on-a", 100, on_a).ok());
  ASSERT_TRUE(PutStart("a", "unfinished", 100).status.ok());
  auto left = state_.UnmountSegments("a", std::span(&a, 1), /*unregister=*/true);
  ASSERT_TRUE(left.ok());
  MasterStats stats = state_.Stats();
  EXPECT_EQ(stats.clients, 1u);
  EXPECT_EQ(stats.segments, 1u);
  EXPECT_EQ(stats.objects, 0u);
  EXPECT_TRUE(state_.Heartbeat("a").remount_required);
}

// ---- leases ----

TEST_F(MasterStateTest, ReleasedLeaseFreesTheObjectAtOnce) {
  Mount("a", "seg-a", 1 << 20);
  ASSERT_TRUE(Put("a", "k", 100).ok());
  uint64_t lease = Lease("a", "k");
  EXPECT_EQ(Remove("a", "k").code(), StatusCode::kUnavailable);
  EXPECT_EQ(state_.Stats().leases_active, 1u);
  Advance(milliseconds(3));
  EXPECT_TRUE(Release("a", lease).ok());
  EXPECT_TRUE(Remove("a", "k").ok());  // long before the TTL
  MasterStats stats = state_.Stats();
  EXPECT_EQ(stats.lease_releases, 1u);
  EXPECT_EQ(stats.leases_active, 0u);
  LatencyHistogram::Snapshot held = state_.LeaseHoldTimes();
  EXPECT_EQ(held.count, 1u);
  EXPECT_EQ(held.sum_ns, 3'000'000);
}

TEST_F(MasterStateTest, EveryReaderMustReleaseBeforeTheObjectIsFree) {
  Mount("a", "seg-a", 1 << 20);
  Mount("b", "seg-b", 1 << 20);
  ASSERT_TRUE(Put("a", "k", 100).ok());
  uint64_t first = Lease("a", "k");
  uint64_t second = Lease("a", "k");  // the same client reading twice at once
  uint64_t third = Lease("b", "k");
  EXPECT_NE(first, second);
  EXPECT_TRUE(Release("a", first).ok());
  EXPECT_EQ(Remove("a", "k").code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Release("b", third).ok());
  EXPECT_EQ(Remove("a", "k").code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Release("a", second).ok());
  EXPECT_TRUE(Remove("a", "k").ok());
}

TEST_F(MasterStateTest, ReleaseIsIdempotentAndHarmlessWhenThereIsNothingToRelease) {
  Mount("a", "seg-a", 1 << 20);
  ASSERT_TRUE(Put("a", "k", 100).ok());
  ASSERT_TRUE(Put("a", "other", 100).ok());
  uint64_t lease = Lease("a", "k");
  EXPECT_TRUE(Release("a", lease).ok());
  EXPECT_TRUE(Release("a", lease).ok());  // twice
  EXPECT_TRUE(Release("a", 12345).ok());  // never granted
  EXPECT_TRUE(Release("a", 0).ok());
  // A second release must not free a lease another get holds.
  uint64_t held = Lease("a", "k");
  EXPECT_TRUE(Release("a", lease).ok());
  EXPECT_EQ(Remove("a", "k").code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Release("a", held).ok());
  // An empty batch and an unknown client.
  EXPECT_TRUE(state_.ReleaseLeases("a", {}).ok());
  EXPECT_EQ(state_.ReleaseLeases("ghost", std::span(&held, 1)).status().code(),
            StatusCode::kFailedPrecondition);
  MasterStats stats = state_.Stats();
  EXPECT_EQ(stats.lease_releases, 2u);
  EXPECT_EQ(stats.lease_releases_unknown, 4u);
  EXPECT_TRUE(Exist("a", "other").ok());
}

TEST_F(MasterStateTest, OnlyTheReaderThatTookALeaseCanReleaseIt) {
  Mount("a", "seg-a", 1 << 20);
  Mount("b", "seg-b", 1 << 20);
  ASSERT_TRUE(Put("a", "k", 100).ok());
  uint64_t lease = Lease("a", "k");
  Status refused = Release("b", lease);
  EXPECT_EQ(refused.code(), StatusCode::kPermissionDenied) << refused;
  EXPECT_EQ(state_.Stats().lease_releases_refused, 1u);
  EXPECT_EQ(Remove("b", "k").code(), StatusCode::kUnavailable);  // still leased
  EXPECT_TRUE(Release("a", lease).ok());
  EXPECT_TRUE(Remove("b", "k").ok());
}

TEST_F(MasterStateTest, UnreleasedLeaseEndsAtItsTtl) {
  Mount("a", "seg-a", 1 << 20);
  ASSERT_TRUE(Put("a", "k", 100).ok());
  uint64_t lease = Lease("a", "k");  // a reader that dies before it releases
  Advance(milliseconds(999));
  state_.RunMaintenance();
  EXPECT_EQ(Remove("a", "k").code(), StatusCode::kUnavailable);
  Advance(milliseconds(2));
  state_.RunMaintenance();
  MasterStats stats = state_.Stats();
  EXPECT_EQ(stats.lease_expiries, 1u);
  EXPECT_EQ(stats.leases_active, 0u);
  EXPECT_EQ(state_.LeaseHoldTimes().count, 1u);  // counted as held for the whole TTL
  EXPECT_TRUE(Release("a", lease).ok());         // a late release is harmless
  EXPECT_EQ(state_.Stats().lease_releases_unknown, 1u);
  EXPECT_TRUE(Remove("a", "k").ok());
}

TEST_F(MasterStateTest, ReleaseAfterTheObjectWentIsHarmless) {
  PoolSegmentId segment = Mount("a", "seg-a", 1 << 20);
  Mount("b", "seg-b", 1 << 20);
  PutOptions on_a;
  on_a.preferred_segments = {"seg-a"};
  ASSERT_TRUE(Put("a", "expired", 100).ok());
  ASSERT_TRUE(Put("a", "dropped", 100, on_a).ok());
  uint64_t expired = Lease("b", "expired");
  uint64_t dropped = Lease("b", "dropped");
  // Its lease ran out (the sweeper has not run yet), then it was removed.
  Advance(milliseconds(1001));
  state_.Heartbeat("b");
  EXPECT_TRUE(Remove("a", "expired").ok());
  // Its segment left while a reader held it.
  ASSERT_TRUE(state_.UnmountSegments("a", std::span(&segment, 1)).ok());
  EXPECT_EQ(Exist("b", "dropped").code(), StatusCode::kNotFound);
  EXPECT_TRUE(Release("b", expired).ok());
  EXPECT_TRUE(Release("b", dropped).ok());
  EXPECT_EQ(state_.Stats().lease_releases, 2u);
  // The key can be stored again; the old lease has no hold on the new object.
  ASSERT_TRUE(Put("b", "expired", 100).ok());
  EXPECT_TRUE(Release("b", expired).ok());
  EXPECT_TRUE(Remove("b", "expired").ok());
}

TEST_F(MasterStateTest, LeaseFromAnEarlierMasterIsUnknownToANewOne) {
  Mount("a", "seg-a", 1 << 20);
  ASSERT_TRUE(Put("a", "k", 100).ok());
  uint64_t lease = Lease("a", "k");
  MasterState restarted(MakeOptions([](MasterOptions&) {}));
  SegmentMount mount{"seg-a", 0x100000, 1 << 20, {}};
  ASSERT_TRUE(restarted.MountSegments("a", "host-a", std::span(&mount, 1))[0].ok());
  auto released = restarted.ReleaseLeases("a", std::span(&lease, 1));
  ASSERT_TRUE(released.ok());
  EXPECT_TRUE((*released)[0].ok());
  EXPECT_EQ(restarted.Stats().lease_releases_unknown, 1u);
}

TEST_F(MasterStateTest, SizeAndExistTakeNoLease) {
  Mount("a", "seg-a", 1 << 20);
  ASSERT_TRUE(Put("a", "k", 100).ok());
  uint64_t lease = 1;
  GetOutcome peek = Get("a", "k", &lease, GetMode::kPeek);
  ASSERT_TRUE(peek.status.ok());
  EXPECT_EQ(peek.size, 100u);
  EXPECT_EQ(lease, 0u);
  EXPECT_TRUE(Exist("a", "k").ok());
  EXPECT_EQ(state_.Stats().leases_active, 0u);
  EXPECT_EQ(state_.Stats().gets, 0u);
  EXPECT_TRUE(Remove("a", "k").ok());
}

TEST_F(MasterStateTest, BatchGetTakesOneLeaseForEveryObjectFound) {
  Mount("a", "seg-a", 1 << 20);
  ASSERT_TRUE(Put("a", "x", 100).ok());
  ASSERT_TRUE(Put("a", "y", 100).ok());
  std::vector<std::string_view> keys = {"x", "missing", "y", "x"};
  auto batch = state_.BatchGetReplicas("a", keys);
  ASSERT_TRUE(batch.ok());
  EXPECT_EQ(batch->items[1].status.code(), StatusCode::kNotFound);
  EXPECT_EQ(state_.Stats().leases_active, 1u);
  EXPECT_EQ(Remove("a", "x").code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Release("a", batch->lease_id).ok());
  EXPECT_TRUE(Remove("a", "x").ok());
  EXPECT_TRUE(Remove("a", "y").ok());
  // Nothing found: nothing leased.
  std::string_view none = "missing";
  auto empty = state_.BatchGetReplicas("a", std::span(&none, 1));
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->lease_id, 0u);
}

// ---- eviction keeps the pool full ----

TEST_F(ExactEvictionTest, APutEvictsOnlyWhatItNeeds) {
  Mount("a", "seg-a", 200 * 4096);
  ASSERT_TRUE(PutPages(0, 200).ok());
  for (int i = 200; i < 260; ++i) {
    ASSERT_TRUE(PutPages(i, i + 1).ok());
    ASSERT_EQ(state_.Stats().objects, 200u) << "after put " << i;
  }
  // Exactly the 60 oldest went, in LRU order.
  for (int i = 0; i < 60; ++i) EXPECT_FALSE(Exist("a", "k" + std::to_string(i)).ok()) << i;
  for (int i = 60; i < 260; ++i) EXPECT_TRUE(Exist("a", "k" + std::to_string(i)).ok()) << i;
  EXPECT_EQ(state_.Stats().evictions, 60u);
  EXPECT_EQ(state_.Stats().bytes_used, 200u * 4096);
}

TEST_F(ExactEvictionTest, LeastRecentlyUsedAcrossShardsWithMixedSizes) {
  Mount("a", "seg-a", 64 * 8192);
  // Alternate sizes so that bytes, not counts, decide; read every third key to reorder.
  uint64_t used = 0;
  int stored = 0;
  while (used + 8192 <= 64 * 8192) {
    uint64_t size = stored % 2 == 0 ? 4096 : 8192;
    ASSERT_TRUE(Put("a", "k" + std::to_string(stored), size).ok());
    used += size;
    ++stored;
  }
  std::vector<uint64_t> leases;
  for (int i = 0; i < stored; i += 3) leases.push_back(Lease("a", "k" + std::to_string(i)));
  ASSERT_TRUE(state_.ReleaseLeases("a", leases).ok());
  ASSERT_LT(64 * 8192 - used, 8192u);
  ASSERT_TRUE(Put("a", "new", 8192).ok());
  // The least recently used object is k1 (k0 was read since), and its 8 KiB are what the put
  // needs: it alone goes.
  for (int i = 0; i < stored; ++i) {
    EXPECT_EQ(Exist("a", "k" + std::to_string(i)).ok(), i != 1) << i;
  }
  EXPECT_EQ(state_.Stats().evictions, 1u);
  // Next come k2 and k4: 4 KiB each, 8 KiB together but not adjacent, so the put evicts again,
  // and takes the place of k5 (8 KiB). k7, the next unread one, stays.
  ASSERT_TRUE(Put("a", "newer", 8192).ok());
  for (const char* gone : {"k2", "k4", "k5"}) EXPECT_FALSE(Exist("a", gone).ok()) << gone;
  for (const char* kept : {"k0", "k3", "k7", "k8", "new", "newer"}) {
    EXPECT_TRUE(Exist("a", kept).ok()) << kept;
  }
  EXPECT_EQ(state_.Stats().evictions, 4u);
}

TEST_F(ExactEvictionTest, ABatchPutIntoAFullPoolEvictsOnceForTheBatch) {
  Mount("a", "seg-a", 100 * 4096);
  ASSERT_TRUE(PutPages(0, 100).ok());
  uint64_t runs = state_.Stats().eviction_runs;
  std::vector<std::string> names;
  for (int i = 0; i < 10; ++i) names.push_back("new" + std::to_string(i));
  names.push_back("k99");  // already stored: needs no space
  std::vector<PutStartItem> items;
  for (const std::string& name : names) items.push_back(PutStartItem{name, 4096});
  auto started = state_.BatchPutStart("a", items, {});
  ASSERT_TRUE(started.ok());
  for (const PutStartOutcome& outcome : *started) ASSERT_TRUE(outcome.status.ok());
  EXPECT_TRUE((*started)[10].already_exists);
  EXPECT_EQ(state_.Stats().eviction_runs, runs + 1);
  EXPECT_EQ(state_.Stats().evictions, 10u);
  EXPECT_TRUE(Exist("a", "k10").ok());
  EXPECT_FALSE(Exist("a", "k9").ok());
}

TEST_F(ExactEvictionTest, AnOversizeItemInABatchEvictsNothingForItself) {
  Mount("a", "seg-a", 100 * 4096);
  ASSERT_TRUE(PutPages(0, 100).ok());
  std::vector<PutStartItem> items = {
      {"huge", uint64_t{1} << 63}, {"x", 4096}, {"wraps", UINT64_MAX / 2 + 2}, {"y", 4096}};
  auto started = state_.BatchPutStart("a", items, {});
  ASSERT_TRUE(started.ok());
  EXPECT_EQ((*started)[0].status.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE((*started)[1].status.ok());
  EXPECT_EQ((*started)[2].status.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE((*started)[3].status.ok());
  EXPECT_EQ(state_.Stats().evictions, 2u);  // for x and y only
  EXPECT_EQ(state_.Stats().put_refusals_invalid, 2u);
}

TEST_F(MasterStateTest, ThePoolStaysFullWithTheDefaultSlack) {
  Mount("a", "seg-a", 2000 * 4096);
  ASSERT_TRUE(PutPages(0, 3000).ok());
  MasterStats stats = state_.Stats();
  // 0.1% of 2000 pages is 2 pages: each eviction frees the page needed and 2 more.
  EXPECT_GE(stats.objects, 1997u);
  EXPECT_LE(stats.objects, 2000u);
  EXPECT_EQ(stats.put_refusals_no_space, 0u);
  EXPECT_LT(stats.eviction_runs, 1000u);  // the slack spares most puts a run of their own
  EXPECT_TRUE(Exist("a", "k2999").ok());
  EXPECT_FALSE(Exist("a", "k999").ok());
}

TEST_F(MasterStateTest, RefusedPutsAreCountedByReason) {
  Mount("a", "seg-a", 2 * 4096);
  ASSERT_TRUE(Put("a", "x", 4096).ok());
  ASSERT_TRUE(Put("a", "y", 4096).ok());
  Lease("a", "x");
  Lease("a", "y");
  EXPECT_EQ(PutStart("a", "z", 4096).status.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(PutStart("a", "", 4096).status.code(), StatusCode::kInvalidArgument);
  MasterStats stats = state_.Stats();
  EXPECT_EQ(stats.put_refusals_no_space, 1u);
  EXPECT_EQ(stats.put_refusals_invalid, 1u);
}

TEST(LatencyHistogramTest, QuantilesInterpolateInsideBuckets) {
  LatencyHistogram histogram;
  EXPECT_EQ(histogram.Read().Quantile(0.5), 0);
  for (int i = 0; i < 90; ++i) histogram.Observe(150'000);    // (100 us, 250 us]
  for (int i = 0; i < 10; ++i) histogram.Observe(4'000'000);  // (2.5 ms, 5 ms]
  LatencyHistogram::Snapshot snapshot = histogram.Read();
  EXPECT_EQ(snapshot.count, 100u);
  double p50 = snapshot.Quantile(0.5);
  EXPECT_GT(p50, 100'000);
  EXPECT_LE(p50, 250'000);
  double p99 = snapshot.Quantile(0.99);
  EXPECT_GT(p99, 2'500'000);
  EXPECT_LE(p99, 5'000'000);
  histogram.Observe(int64_t{1} << 50, 3);  // past the last bound
  EXPECT_EQ(histogram.Read().Quantile(1.0), LatencyHistogram::kBounds.back());
}

// Threads put, get, remove and evict at once; the allocator and shards must stay consistent
// (ASan/UBSan catch misuse) and no two live objects may share bytes.
TEST(MasterStateConcurrencyTest, ParallelClientsKeepRangesDisjoint) {
  MasterOptions options;
  options.shards = 4;
  MasterState state(options);
  SegmentMount mount{"seg", 0, 256 * 4096, {}};
  ASSERT_TRUE(state.MountSegments("c", "h", std::span(&mount, 1))[0].ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&state, t] {
      for (int i = 0; i < 2000; ++i) {
        std::string name = "t" + std::to_string(t) + "/" + std::to_string(i % 300);
        std::string_view key = name;
        PutStartItem item{key, 4096};
        auto start = state.BatchPutStart("c", std::span(&item, 1), {});
        if (start.ok() && (*start)[0].status.ok() && !(*start)[0].already_exists) {
          state.BatchPutEnd("c", std::span(&key, 1)).status().IgnoreError();
        }
        auto got = state.BatchGetReplicas("c", std::span(&key, 1));
        // Most leases are released at once, some only when they expire.
        if (got.ok() && got->lease_id != 0 && i % 3 != 0) {
          state.ReleaseLeases("c", std::span(&got->lease_id, 1)).status().IgnoreError();
        }
        if (i % 7 == 0) state.BatchRemove("c", std::span(&key, 1)).status().IgnoreError();
        if (i % 50 == 0) state.Evict(8 * 4096);
        if (i % 100 == 0) state.RunMaintenance();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  std::set<uint64_t> offsets;
  auto keys = state.ListKeys("", 1 << 20);
  std::vector<std::string_view> names;
  for (auto& [key, size] : keys) names.push_back(key);
  auto got = state.BatchGetReplicas("c", names);
  ASSERT_TRUE(got.ok());
  for (const GetOutcome& outcome : got->items) {
    ASSERT_TRUE(outcome.status.ok());
    EXPECT_TRUE(offsets.insert(outcome.replicas[0].offset).second);
  }
  EXPECT_EQ(state.Stats().bytes_used, keys.size() * 4096);
}

}  // namespace
}  // namespace larder::master
