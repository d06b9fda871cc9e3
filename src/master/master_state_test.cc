// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/master_state.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>

namespace larder::master {
namespace {

using std::chrono::milliseconds;

class MasterStateTest : public ::testing::Test {
 protected:
  MasterStateTest() : state_(MakeOptions()) {}

  MasterOptions MakeOptions() {
    MasterOptions options;
    options.clock = [this] { return now_; };
    options.lease_ttl = milliseconds(1000);
    options.client_ttl = milliseconds(5000);
    options.put_timeout = milliseconds(3000);
    options.max_key_size = 64;
    options.shards = 8;
    return options;
  }

  void Advance(milliseconds d) { now_ += d; }

  SegmentId Mount(const std::string& client, const std::string& name, uint64_t size,
                  uint64_t base = 0x100000, const std::string& host = "host-a") {
    SegmentMount mount{name, base, size, "{}"};
    auto results = state_.MountSegments(client, host, std::span(&mount, 1));
    EXPECT_TRUE(results[0].ok()) << results[0].status();
    return results[0].ok() ? *results[0] : 0;
  }

  PutStartOutcome PutStart(const std::string& client, const std::string& key, uint64_t size,
                           PutOptions options = {}) {
    PutStartItem item{key, size};
    auto results = state_.BatchPutStart(client, std::span(&item, 1), options);
    EXPECT_TRUE(results.ok()) << results.status();
    if (!results.ok()) {
      PutStartOutcome failed;
      failed.status = results.status();
      return failed;
    }
    return (*results)[0];
  }

  Status One(const Result<std::vector<Status>>& results) {
    if (!results.ok()) return results.status();
    return results->at(0);
  }
  Status PutEnd(const std::string& client, std::string_view key) {
    return One(state_.BatchPutEnd(client, std::span(&key, 1)));
  }
  Status Put(const std::string& client, const std::string& key, uint64_t size,
             PutOptions options = {}) {
    PutStartOutcome start = PutStart(client, key, size, options);
    if (!start.status.ok() || start.already_exists) return start.status;
    return PutEnd(client, key);
  }
  GetOutcome Get(const std::string& client, std::string_view key) {
    auto results = state_.BatchGetReplicas(client, std::span(&key, 1));
    if (!results.ok()) {
      GetOutcome failed;
      failed.status = results.status();
      return failed;
    }
    return (*results)[0];
  }
  Status Exist(const std::string& client, std::string_view key) {
    return One(state_.BatchExist(client, std::span(&key, 1)));
  }
  Status Remove(const std::string& client, std::string_view key) {
    return One(state_.BatchRemove(client, std::span(&key, 1)));
  }

  Clock::time_point now_ = Clock::time_point(std::chrono::hours(1));
  MasterState state_;
};

TEST_F(MasterStateTest, PutThenGetReturnsTheSameReplica) {
  SegmentId segment = Mount("a", "seg-a", 1 << 20);
  PutStartOutcome start = PutStart("a", "k1", 4096);
  ASSERT_TRUE(start.status.ok()) << start.status;
  ASSERT_EQ(start.replicas.size(), 1u);
  EXPECT_EQ(start.replicas[0].segment_id, segment);
  EXPECT_LE(start.replicas[0].offset + 4096, 1u << 20);
  EXPECT_EQ(Exist("a", "k1").code(), StatusCode::kNotFound);  // not readable before PutEnd
  EXPECT_EQ(Get("a", "k1").status.code(), StatusCode::kUnavailable);
  ASSERT_TRUE(PutEnd("a", "k1").ok());
  GetOutcome got = Get("a", "k1");
  ASSERT_TRUE(got.status.ok()) << got.status;
  EXPECT_EQ(got.size, 4096u);
  ASSERT_EQ(got.replicas.size(), 1u);
  EXPECT_EQ(got.replicas[0].offset, start.replicas[0].offset);
  EXPECT_EQ(got.lease, milliseconds(1000));
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
      {"zero", 0x900000, 0, "{}"},
      {"overlap", 0x180000, 1 << 20, "{}"},
      {"seg-a", 0x900000, 1 << 20, "{}"},
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
  SegmentId a = Mount("a", "seg-a", 1 << 20);
  SegmentId b = Mount("b", "seg-b", 1 << 20);
  SegmentId c = Mount("c", "seg-c", 1 << 20);
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
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(Put("a", "k" + std::to_string(i), 4096).ok());
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

TEST_F(MasterStateTest, MaintenanceEvictsFromTheHighWatermark) {
  Mount("a", "seg-a", 100 * 4096);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(Put("a", "k" + std::to_string(i), 4096).ok());
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
  SegmentId a = Mount("a", "seg-a", 1 << 20);
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
  SegmentId a = Mount("a", "seg-a", 1 << 20);
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

// Threads put, get, remove and evict at once; the allocator and shards must stay consistent
// (ASan/UBSan catch misuse) and no two live objects may share bytes.
TEST(MasterStateConcurrencyTest, ParallelClientsKeepRangesDisjoint) {
  MasterOptions options;
  options.shards = 4;
  MasterState state(options);
  SegmentMount mount{"seg", 0, 256 * 4096, "{}"};
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
        if (i % 7 == 0) state.BatchRemove("c", std::span(&key, 1)).status().IgnoreError();
        if (i % 50 == 0) state.Evict(8 * 4096);
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
  for (const GetOutcome& outcome : *got) {
    ASSERT_TRUE(outcome.status.ok());
    EXPECT_TRUE(offsets.insert(outcome.replicas[0].offset).second);
  }
  EXPECT_EQ(state.Stats().bytes_used, keys.size() * 4096);
}

}  // namespace
}  // namespace larder::master
