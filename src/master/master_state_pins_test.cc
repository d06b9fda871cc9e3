// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// MasterState: soft pins, upserts, forced and bulk removal, tenants, and the operators' view of
// objects.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "master/master_state.h"
#include "master/master_state_test_fixture.h"

namespace larder::master {
namespace {

using std::chrono::milliseconds;

// ---- soft pins ----

PutOptions SoftPin(std::optional<milliseconds> ttl = std::nullopt) {
  PutOptions options;
  options.soft_pin_action = SoftPinAction::kEnable;
  options.soft_pin_ttl = ttl;
  return options;
}

PutOptions Upsert(PutOptions options = {}) {
  options.upsert = true;
  return options;
}

class SoftPinTest : public MasterStateTest {
 protected:
  explicit SoftPinTest(bool evict_soft_pinned = true)
      : MasterStateTest([evict_soft_pinned](MasterOptions& options) {
          options.eviction_slack = 0;
          options.default_soft_pin_ttl = milliseconds(10000);
          options.max_soft_pin_ttl = milliseconds(60000);
          options.evict_soft_pinned = evict_soft_pinned;
        }) {}
};

class NoSoftPinEvictionTest : public SoftPinTest {
 protected:
  NoSoftPinEvictionTest() : SoftPinTest(/*evict_soft_pinned=*/false) {}
};

TEST_F(SoftPinTest, ImpossibleSoftPinsAreRefusedForTheWholeBatch) {
  Mount("a", "seg-a", 1 << 20);
  PutOptions preserve_with_ttl;
  preserve_with_ttl.soft_pin_ttl = milliseconds(5);
  PutOptions disable_with_ttl = preserve_with_ttl;
  disable_with_ttl.soft_pin_action = SoftPinAction::kDisable;
  PutOptions unknown;
  unknown.soft_pin_action = static_cast<SoftPinAction>(7);
  const std::vector<PutStartItem> items = {{"x", 100}, {"y", 100}};
  for (const PutOptions& options :
       {preserve_with_ttl, disable_with_ttl, SoftPin(milliseconds(60001)), unknown}) {
    auto results = state_.BatchPutStart("a", items, options);
    ASSERT_TRUE(results.ok()) << results.status();
    for (const PutStartOutcome& outcome : *results) {
      EXPECT_EQ(outcome.status.code(), StatusCode::kInvalidArgument) << outcome.status;
    }
  }
  auto refused = state_.BatchPutStart("a", items, preserve_with_ttl);
  EXPECT_NE((*refused)[0].status.message().find("needs the action ENABLE"), std::string::npos)
      << (*refused)[0].status;
  MasterStats stats = state_.Stats();
  EXPECT_EQ(stats.objects, 0u);
  EXPECT_EQ(stats.put_refusals_invalid, 10u);
  // The longest TTL allowed pins; a TTL of 0 does not.
  EXPECT_TRUE(Put("a", "longest", 100, SoftPin(milliseconds(60000))).ok());
  EXPECT_EQ(SoftPinned(), 1u);
  EXPECT_TRUE(Put("a", "zero", 100, SoftPin(milliseconds(0))).ok());
  EXPECT_EQ(SoftPinned(), 1u);
}

TEST_F(SoftPinTest, APinStartsWhenItsPutEndsAndLastsItsTtl) {
  Mount("a", "seg-a", 1 << 20);
  ASSERT_TRUE(PutStart("a", "k", 100, SoftPin(milliseconds(2000))).status.ok());
  EXPECT_EQ(SoftPinned(), 0u);  // staged with the put
  Advance(milliseconds(1000));
  ASSERT_TRUE(PutEnd("a", "k").ok());
  EXPECT_EQ(SoftPinned(), 1u);
  Advance(milliseconds(1999));
  Sweep();
  EXPECT_EQ(SoftPinned(), 1u);
  Advance(milliseconds(1));
  Sweep();
  EXPECT_EQ(SoftPinned(), 0u);
  EXPECT_TRUE(Exist("a", "k").ok());  // unpinned, not removed
  // Without a TTL: the master's default.
  ASSERT_TRUE(Put("a", "default", 100, SoftPin()).ok());
  for (int i = 0; i < 9; ++i) {
    Advance(milliseconds(1000));
    Sweep();
  }
  Advance(milliseconds(999));
  Sweep();
  EXPECT_EQ(SoftPinned(), 1u);
  Advance(milliseconds(1));
  Sweep();
  EXPECT_EQ(SoftPinned(), 0u);
}

TEST_F(SoftPinTest, EvictionTakesUnpinnedObjectsFirstThenTheLeastRecentlyUsedSoftPinned) {
  Mount("a", "seg-a", 4 * 4096);
  ASSERT_TRUE(Put("a", "soft1", 4096, SoftPin()).ok());
  ASSERT_TRUE(Put("a", "soft2", 4096, SoftPin()).ok());
  ASSERT_TRUE(Put("a", "u1", 4096).ok());
  ASSERT_TRUE(Put("a", "u2", 4096).ok());
  // The soft-pinned objects are older, yet the unpinned ones go first.
  ASSERT_TRUE(Put("a", "n1", 4096).ok());
  EXPECT_EQ(Exist("a", "u1").code(), StatusCode::kNotFound);
  ASSERT_TRUE(Put("a", "n2", 4096).ok());
  EXPECT_EQ(Exist("a", "u2").code(), StatusCode::kNotFound);
  EXPECT_TRUE(Exist("a", "soft1").ok());
  EXPECT_TRUE(Exist("a", "soft2").ok());
  // With every unpinned object leased, the least recently used soft-pinned one goes.
  Lease("a", "n1");
  Lease("a", "n2");
  ASSERT_TRUE(Release("a", Lease("a", "soft1")).ok());  // a use: soft2 is now the oldest
  ASSERT_TRUE(Put("a", "n3", 4096).ok());
  EXPECT_EQ(Exist("a", "soft2").code(), StatusCode::kNotFound);
  EXPECT_TRUE(Exist("a", "soft1").ok());
  EXPECT_EQ(SoftPinned(), 1u);
  EXPECT_EQ(state_.Stats().evictions, 3u);
}

TEST_F(NoSoftPinEvictionTest, SoftPinnedObjectsStayUntilTheirPinRunsOut) {
  Mount("a", "seg-a", 2 * 4096);
  ASSERT_TRUE(Put("a", "s1", 4096, SoftPin(milliseconds(2000))).ok());
  ASSERT_TRUE(Put("a", "s2", 4096, SoftPin(milliseconds(2000))).ok());
  PutStartOutcome full = PutStart("a", "n", 4096);
  EXPECT_EQ(full.status.code(), StatusCode::kResourceExhausted) << full.status;
  // Past the deadline, before any sweep: the put's eviction ends the pins itself and takes the
  // least recently used object.
  Advance(milliseconds(2001));
  ASSERT_TRUE(Put("a", "n", 4096).ok());
  EXPECT_EQ(Exist("a", "s1").code(), StatusCode::kNotFound);
  EXPECT_TRUE(Exist("a", "s2").ok());
  EXPECT_EQ(SoftPinned(), 0u);
}

TEST_F(SoftPinTest, AnExpiredPinRejoinsTheLruListInItsPlace) {
  Mount("a", "seg-a", 3 * 4096);
  ASSERT_TRUE(Put("a", "soft", 4096, SoftPin(milliseconds(2000))).ok());
  ASSERT_TRUE(Put("a", "u1", 4096).ok());
  ASSERT_TRUE(Put("a", "u2", 4096).ok());
  Advance(milliseconds(2001));
  Sweep();
  EXPECT_EQ(SoftPinned(), 0u);
  // Unused since before u1 and u2 were stored: it is the least recently used.
  ASSERT_TRUE(Put("a", "n", 4096).ok());
  EXPECT_EQ(Exist("a", "soft").code(), StatusCode::kNotFound);
  EXPECT_TRUE(Exist("a", "u1").ok());
}

TEST_F(SoftPinTest, AHardPinWinsAndASoftPinDoesNotBlockRemove) {
  Mount("a", "seg-a", 1 << 20);
  PutOptions both = SoftPin();
  both.pin = true;
  ASSERT_TRUE(Put("a", "hard", 100, both).ok());
  EXPECT_EQ(SoftPinned(), 0u);
  ASSERT_TRUE(Put("a", "soft", 100, SoftPin()).ok());
  EXPECT_EQ(SoftPinned(), 1u);
  EXPECT_TRUE(Remove("a", "soft").ok());
  EXPECT_EQ(SoftPinned(), 0u);
  EXPECT_TRUE(Remove("a", "hard").ok());
  EXPECT_EQ(state_.Stats().bytes_used, 0u);
}

TEST_F(SoftPinTest, AnUpsertPreservesEnablesOrClearsTheSoftPin) {
  Mount("a", "seg-a", 1 << 20);
  ASSERT_TRUE(Put("a", "k", 100, SoftPin(milliseconds(4000))).ok());
  Advance(milliseconds(1000));
  ASSERT_TRUE(Put("a", "k", 200, Upsert()).ok());  // kPreserve: the old deadline
  EXPECT_EQ(Get("a", "k", nullptr, GetMode::kPeek).size, 200u);
  EXPECT_EQ(SoftPinned(), 1u);
  Advance(milliseconds(2999));
  Sweep();
  EXPECT_EQ(SoftPinned(), 1u);
  Advance(milliseconds(1));
  Sweep();
  EXPECT_EQ(SoftPinned(), 0u);
  ASSERT_TRUE(Put("a", "k", 100, Upsert(SoftPin(milliseconds(5000)))).ok());
  EXPECT_EQ(SoftPinned(), 1u);
  PutOptions disable;
  disable.soft_pin_action = SoftPinAction::kDisable;
  ASSERT_TRUE(Put("a", "k", 100, Upsert(disable)).ok());
  EXPECT_EQ(SoftPinned(), 0u);
  // A new key has no deadline to keep.
  ASSERT_TRUE(Put("a", "new", 100, Upsert()).ok());
  EXPECT_EQ(SoftPinned(), 0u);
  EXPECT_EQ(state_.Stats().objects, 2u);
}

// ---- upsert ----

TEST_F(MasterStateTest, AnUpsertReplacesAStoredObject) {
  Mount("a", "seg-a", 1 << 20);
  Mount("b", "seg-b", 1 << 20, 0x100000, "host-b");
  ASSERT_TRUE(Put("a", "k", 100).ok());
  PutStartOutcome start = PutStart("a", "k", 200, Upsert());
  ASSERT_TRUE(start.status.ok()) << start.status;
  EXPECT_FALSE(start.already_exists);
  ASSERT_EQ(start.replicas.size(), 1u);
  EXPECT_EQ(Get("a", "k").status.code(), StatusCode::kUnavailable);  // the new one is being written
  // Asked again by its writer: the same answer; by another client: retry later.
  PutStartOutcome again = PutStart("a", "k", 200, Upsert());
  ASSERT_TRUE(again.status.ok());
  ASSERT_EQ(again.replicas.size(), 1u);
  EXPECT_EQ(again.replicas[0].offset, start.replicas[0].offset);
  PutStartOutcome other = PutStart("b", "k", 300, Upsert());
  EXPECT_EQ(other.status.code(), StatusCode::kUnavailable) << other.status;
  EXPECT_NE(other.status.message().find("being written"), std::string::npos);
  EXPECT_TRUE(PutStart("b", "k", 300).already_exists);  // without upsert: as before
  ASSERT_TRUE(PutEnd("a", "k").ok());
  EXPECT_EQ(Get("a", "k").size, 200u);
  MasterStats stats = state_.Stats();
  EXPECT_EQ(stats.objects, 1u);
  EXPECT_EQ(stats.bytes_used, 256u);  // the old 128 bytes were freed at once
  EXPECT_TRUE(PutStart("a", "k", 999).already_exists);
}

TEST_F(MasterStateTest, AnUpsertOfALeasedObjectKeepsItsBytesUntilTheLeaseEnds) {
  Mount("a", "seg-a", 2 * 4096);
  ASSERT_TRUE(Put("a", "k", 4096).ok());
  const uint64_t old_offset = OffsetOf("k");
  uint64_t lease = Lease("a", "k");  // a reader copying the old value
  PutStartOutcome start = PutStart("a", "k", 4096, Upsert());
  ASSERT_TRUE(start.status.ok()) << start.status;
  EXPECT_NE(start.replicas[0].offset, old_offset);
  ASSERT_TRUE(PutEnd("a", "k").ok());
  EXPECT_EQ(state_.Stats().bytes_used, 2u * 4096);
  Advance(milliseconds(999));
  Sweep();
  EXPECT_EQ(state_.Stats().bytes_used, 2u * 4096);
  Advance(milliseconds(2));
  Sweep();
  EXPECT_EQ(state_.Stats().bytes_used, 4096u);
  EXPECT_TRUE(Release("a", lease).ok());  // late, and harmless
  ASSERT_TRUE(Put("a", "x", 4096).ok());
  EXPECT_EQ(OffsetOf("x"), old_offset);
  EXPECT_EQ(state_.Stats().evictions, 0u);
}

TEST_F(ExactEvictionTest, AnUpsertIntoAFullPoolReusesTheOldSpace) {
  Mount("a", "seg-a", 2 * 4096);
  ASSERT_TRUE(Put("a", "k", 4096).ok());
  ASSERT_TRUE(Put("a", "other", 4096).ok());
  const uint64_t old_offset = OffsetOf("k");
  PutStartOutcome start = PutStart("a", "k", 4096, Upsert());
  ASSERT_TRUE(start.status.ok()) << start.status;
  EXPECT_EQ(start.replicas[0].offset, old_offset);
  ASSERT_TRUE(PutEnd("a", "k").ok());
  EXPECT_EQ(state_.Stats().evictions, 0u);
  EXPECT_TRUE(Exist("a", "other").ok());
}

TEST_F(ExactEvictionTest, AnUpsertKeepsTheHardPinAndAnImpossibleValueKeepsTheOldObject) {
  Mount("a", "seg-a", 2 * 4096);
  PutOptions pin;
  pin.pin = true;
  ASSERT_TRUE(Put("a", "k", 4096, pin).ok());
  ASSERT_TRUE(Put("a", "k", 4096, Upsert()).ok());
  PutStartOutcome huge = PutStart("a", "k", 3 * 4096, Upsert());
  EXPECT_EQ(huge.status.code(), StatusCode::kInvalidArgument) << huge.status;
  EXPECT_TRUE(Exist("a", "k").ok());
  // k is still hard-pinned: puts evict around it.
  ASSERT_TRUE(Put("a", "x", 4096).ok());
  ASSERT_TRUE(Put("a", "y", 4096).ok());
  EXPECT_EQ(Exist("a", "x").code(), StatusCode::kNotFound);
  EXPECT_TRUE(Exist("a", "k").ok());
}

// ---- forced and bulk removal ----

TEST_F(MasterStateTest, AForcedRemoveTakesLeasedObjectsAndKeepsTheirBytesUntilTheLeaseEnds) {
  Mount("a", "seg-a", 1 << 20);
  ASSERT_TRUE(Put("a", "k", 4096).ok());
  Lease("a", "k");
  EXPECT_EQ(Remove("a", "k").code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Remove("a", "k", /*force=*/true).ok());
  EXPECT_EQ(Exist("a", "k").code(), StatusCode::kNotFound);
  MasterStats stats = state_.Stats();
  EXPECT_EQ(stats.objects, 0u);
  EXPECT_EQ(stats.bytes_used, 4096u);
  Advance(milliseconds(1001));
  Sweep();
  EXPECT_EQ(state_.Stats().bytes_used, 0u);
  // An object being written is not removed, forced or not.
  ASSERT_TRUE(PutStart("a", "w", 100).status.ok());
  EXPECT_EQ(Remove("a", "w", /*force=*/true).code(), StatusCode::kUnavailable);
  EXPECT_EQ(Remove("a", "missing", /*force=*/true).code(), StatusCode::kNotFound);
}

// Mooncake's batch_replica_clear with a segment name: one replica goes, the others stay readable.
TEST_F(MasterStateTest, RemovingTheReplicaOnOneSegmentKeepsTheOthers) {
  const PoolSegmentId a = Mount("a", "seg-a", 1 << 20);
  const PoolSegmentId b = Mount("b", "seg-b", 1 << 20, 0x100000, "host-b");
  PutOptions two;
  two.replica_num = 2;
  ASSERT_TRUE(Put("a", "k", 4096, two).ok());
  ASSERT_EQ(Get("a", "k").replicas.size(), 2u);
  EXPECT_EQ(state_.Stats().bytes_used, 2 * 4096u);
  auto remove_on = [&](std::string_view key, std::string_view segment, bool force = false) {
    return One(state_.BatchRemove("a", std::span(&key, 1), force, segment));
  };
  EXPECT_EQ(remove_on("k", "no-such-segment").code(), StatusCode::kNotFound);
  // Leased: refused without force, as a whole removal is.
  Advance(milliseconds(1001));
  Lease("b", "k");
  EXPECT_EQ(remove_on("k", "seg-a").code(), StatusCode::kUnavailable);
  Advance(milliseconds(1001));
  Sweep();
  ASSERT_TRUE(remove_on("k", "seg-a").ok());
  GetOutcome left = Get("b", "k");
  ASSERT_TRUE(left.status.ok()) << left.status;
  ASSERT_EQ(left.replicas.size(), 1u);
  EXPECT_EQ(left.replicas[0].segment_id, b);
  EXPECT_NE(left.replicas[0].segment_id, a);
  EXPECT_EQ(state_.Stats().objects, 1u);
  EXPECT_EQ(state_.Stats().bytes_used, 4096u);
  // No replica there any more: NotFound, and the object stays.
  EXPECT_EQ(remove_on("k", "seg-a").code(), StatusCode::kNotFound);
  EXPECT_TRUE(Exist("a", "k").ok());
  // Its last replica goes with the object.
  Advance(milliseconds(1001));
  Sweep();
  ASSERT_TRUE(remove_on("k", "seg-b").ok());
  EXPECT_EQ(Exist("a", "k").code(), StatusCode::kNotFound);
  EXPECT_EQ(state_.Stats().objects, 0u);
}

// Mooncake's batch_replica_clear skips objects in their KV lease, which every put and read
// renews: `unused_for` keeps what was put or read within that long, as the sweeps' tick samples
// tell it.
TEST_F(MasterStateTest, RemovingWhatWasNotUsedForAWhileKeepsRecentObjects) {
  Mount("a", "seg-a", 1 << 20);
  auto remove_unused = [&](std::string_view key, milliseconds unused_for) {
    return One(state_.BatchRemove("a", std::span(&key, 1), false, {}, unused_for));
  };
  ASSERT_TRUE(Put("a", "old", 4096).ok());
  ASSERT_TRUE(Put("a", "read", 4096).ok());
  Sweep();
  // A master with no sample that old (it started within the window) keeps everything.
  Status young = remove_unused("old", milliseconds(5000));
  EXPECT_EQ(young.code(), StatusCode::kUnavailable) << young;
  EXPECT_EQ(young.detail(), ErrorDetail::kLeased);
  for (int i = 0; i < 60; ++i) {  // 6 s of sweeps, every 100 ms
    Advance(milliseconds(100));
    if (i == 40) {
      uint64_t lease_id = 0;
      ASSERT_TRUE(Get("a", "read", &lease_id).status.ok());  // read 4.1 s after the puts
      ASSERT_TRUE(Release("a", lease_id).ok());
    }
    Sweep();
  }
  ASSERT_TRUE(Put("a", "new", 4096).ok());
  Status read = remove_unused("read", milliseconds(5000));
  EXPECT_EQ(read.code(), StatusCode::kUnavailable) << read;
  EXPECT_EQ(read.detail(), ErrorDetail::kLeased);
  EXPECT_EQ(remove_unused("new", milliseconds(5000)).code(), StatusCode::kUnavailable);
  // `force` ends a reader's lease, not this rule.
  std::string_view new_key = "new";
  EXPECT_EQ(
      One(state_.BatchRemove("a", std::span(&new_key, 1), true, {}, milliseconds(5000))).code(),
      StatusCode::kUnavailable);
  EXPECT_TRUE(remove_unused("old", milliseconds(5000)).ok());
  EXPECT_EQ(Exist("a", "old").code(), StatusCode::kNotFound);
  // A shorter window clears the one read 1.9 s ago; zero clears anything.
  EXPECT_TRUE(remove_unused("read", milliseconds(1500)).ok());
  EXPECT_TRUE(remove_unused("new", milliseconds(0)).ok());
  EXPECT_EQ(remove_unused("x", milliseconds(-1)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(One(state_.BatchRemove("a", std::span(&new_key, 1), false, {},
                                   MasterState::kMaxUnusedFor + milliseconds(1)))
                .code(),
            StatusCode::kInvalidArgument);
}

TEST(TenantTest, KeysBelongToOneTenant) {
  using namespace std::string_literals;
  EXPECT_EQ(KeyInTenant("\0t\0k"s, "t"), "k");
  EXPECT_EQ(KeyInTenant("\0t\0"s, "t"), "");
  EXPECT_EQ(KeyInTenant("k", ""), "k");
  // A default-tenant key that starts with NUL is stored behind an empty tenant prefix.
  EXPECT_EQ(KeyInTenant("\0\0\0x"s, ""), "\0x"s);
  EXPECT_EQ(KeyInTenant("\0\0\0x"s, "t"), std::nullopt);
  EXPECT_EQ(KeyInTenant("\0t\0k"s, ""), std::nullopt);
  EXPECT_EQ(KeyInTenant("k", "t"), std::nullopt);
  EXPECT_EQ(KeyInTenant("\0tt\0k"s, "t"), std::nullopt);
  EXPECT_EQ(KeyInTenant("\0t"s, "t"), std::nullopt);
  EXPECT_EQ(KeyInTenant("\0t\0k"s, "tt"), std::nullopt);
  EXPECT_TRUE(ValidateTenant("").ok());
  EXPECT_TRUE(ValidateTenant(std::string(kMaxTenantBytes, 't')).ok());
  EXPECT_EQ(ValidateTenant(std::string(kMaxTenantBytes + 1, 't')).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateTenant("a\0b"s).code(), StatusCode::kInvalidArgument);
}

TEST_F(MasterStateTest, RemoveAllActsInOneTenant) {
  using namespace std::string_literals;
  Mount("a", "seg-a", 1 << 20);
  const std::string t1 = "\0t1\0"s, t2 = "\0t2\0"s;
  for (const std::string& key : {"plain1"s, "plain2"s, t1 + "a", t1 + "b", t2 + "a"}) {
    ASSERT_TRUE(Put("a", key, 100).ok());
  }
  auto removed = state_.RemoveAll("a", "t1");
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(removed->removed, 2u);
  EXPECT_TRUE(Exist("a", "plain1").ok());
  EXPECT_TRUE(Exist("a", t2 + "a").ok());
  removed = state_.RemoveAll("a", "");
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(removed->removed, 2u);
  EXPECT_TRUE(Exist("a", t2 + "a").ok());
  // Leased: skipped, unless forced.
  Lease("a", t2 + "a");
  removed = state_.RemoveAll("a", "t2");
  EXPECT_EQ(removed->removed, 0u);
  EXPECT_EQ(removed->skipped_leased, 1u);
  removed = state_.RemoveAll("a", "t2", /*force=*/true);
  EXPECT_EQ(removed->removed, 1u);
  EXPECT_EQ(removed->skipped_leased, 0u);
  EXPECT_EQ(state_.Stats().objects, 0u);
  EXPECT_EQ(state_.Stats().bytes_used, 128u);  // until the lease ends
  Advance(milliseconds(1001));
  Sweep();
  EXPECT_EQ(state_.Stats().bytes_used, 0u);
  EXPECT_EQ(state_.RemoveAll("a", std::string(kMaxTenantBytes + 1, 't')).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(state_.RemoveAll("a", "a\0b"s).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(MasterStateTest, RemoveByRegexMatchesWholeKeysOfOneTenant) {
  using namespace std::string_literals;
  Mount("a", "seg-a", 1 << 20);
  for (const std::string& key : {"page/1"s, "page/2"s, "page/10"s, "other"s, "\0t\0page/1"s}) {
    ASSERT_TRUE(Put("a", key, 100).ok());
  }
  ASSERT_TRUE(PutStart("a", "page/3", 100).status.ok());  // being written: stays
  Lease("a", "page/2");
  auto removed = state_.RemoveByRegex("a", "", "page/\\d");
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(removed->removed, 1u);
  EXPECT_EQ(removed->skipped_leased, 1u);
  EXPECT_EQ(Exist("a", "page/1").code(), StatusCode::kNotFound);
  EXPECT_TRUE(Exist("a", "page/10").ok());  // a full match only
  EXPECT_TRUE(Exist("a", "\0t\0page/1"s).ok());
  removed = state_.RemoveByRegex("a", "", "page/\\d", /*force=*/true);
  EXPECT_EQ(removed->removed, 1u);
  removed = state_.RemoveByRegex("a", "t", "page/.*");
  EXPECT_EQ(removed->removed, 1u);
  ASSERT_TRUE(PutEnd("a", "page/3").ok());
  EXPECT_TRUE(Exist("a", "page/3").ok());
  EXPECT_TRUE(Exist("a", "other").ok());

  auto bad = state_.RemoveByRegex("a", "", "(");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("missing )"), std::string::npos) << bad.status();
  EXPECT_EQ(state_.RemoveByRegex("a", "", std::string(kMaxRegexBytes + 1, 'a')).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(state_.RemoveByRegex("a", "a\0b"s, ".*").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(state_.RemoveByRegex("ghost", "", ".*").status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(state_.Stats().objects, 3u);
}

TEST_F(MasterStateTest, DescribeKeysTakesNoLeaseAndNoUse) {
  Mount("a", "seg-a", 1 << 20);
  ASSERT_TRUE(Put("a", "k", 100).ok());
  ASSERT_TRUE(PutStart("a", "w", 100).status.ok());
  std::vector<std::string_view> keys = {"k", "w", "missing", ""};
  std::vector<GetOutcome> described = state_.DescribeKeys(keys);
  ASSERT_EQ(described.size(), 4u);
  ASSERT_TRUE(described[0].status.ok());
  EXPECT_EQ(described[0].size, 100u);
  EXPECT_EQ(described[0].replicas.size(), 1u);
  EXPECT_EQ(described[1].status.code(), StatusCode::kNotFound);
  EXPECT_EQ(described[2].status.code(), StatusCode::kNotFound);
  EXPECT_EQ(described[3].status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(state_.Stats().leases_active, 0u);
  EXPECT_TRUE(Remove("a", "k").ok());
}

}  // namespace
}  // namespace larder::master
