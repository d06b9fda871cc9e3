// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Catalogs: the feed that keeps each segment owner's catalog (ADD, REMOVE, TOUCH, resets, acks),
// the rebuild of a master's objects from the catalogs clients bring when they mount again, the
// recovery window, and the sweep that does not blame clients for the master's own stall.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "master/master_state.h"
#include "master/master_state_test_fixture.h"

namespace larder::master {
namespace {

using std::chrono::milliseconds;

// What a client keeps of one segment: its catalog, applied from SyncCatalog as the protocol says.
struct ClientCatalog {
  PoolSegmentId segment = 0;
  uint64_t ack = 0;
  std::map<uint64_t, CatalogEntry> by_offset = {};
  bool full = false;  // ask for the whole catalog at the next sync
  int resets = 0;
  int touches = 0;

  // As larder's client does: a reset drops everything first; otherwise each change must be the
  // one after the last applied; last_seq is what to acknowledge next.
  void Apply(const SegmentCatalogChanges& changes) {
    if (changes.reset) {
      by_offset.clear();
      full = false;
      ++resets;
    }
    uint64_t expected =
        changes.reset && !changes.changes.empty() ? changes.changes[0].seq : ack + 1;
    for (const CatalogChange& change : changes.changes) {
      EXPECT_EQ(change.seq, expected) << "changes come in seq order, none missing";
      ++expected;
      auto it = by_offset.find(change.entry.offset);
      switch (change.kind) {
        case CatalogChangeKind::kAdd:
          by_offset[change.entry.offset] = change.entry;
          break;
        case CatalogChangeKind::kRemove:
          if (it != by_offset.end() && it->second.key == change.entry.key) by_offset.erase(it);
          break;
        case CatalogChangeKind::kTouch:
          ++touches;
          EXPECT_TRUE(change.entry.key.empty()) << "a TOUCH names its object by offset only";
          if (it != by_offset.end()) {
            it->second.last_access = std::max(it->second.last_access, change.entry.last_access);
          }
          break;
      }
    }
    if (!changes.changes.empty()) {
      EXPECT_EQ(changes.last_seq, changes.changes.back().seq);
    } else if (!changes.reset) {
      EXPECT_EQ(changes.last_seq, ack);
    }
    ack = changes.last_seq;
  }
  std::vector<CatalogEntry> Entries() const {
    std::vector<CatalogEntry> entries;
    for (const auto& [offset, entry] : by_offset) entries.push_back(entry);
    return entries;
  }
  bool Holds(const std::string& key) const {
    for (const auto& [offset, entry] : by_offset) {
      if (entry.key == key) return true;
    }
    return false;
  }
};

CatalogEntry Entry(std::string key, uint64_t offset, uint64_t size, uint64_t last_access = 1) {
  CatalogEntry entry;
  entry.key = std::move(key);
  entry.offset = offset;
  entry.size = size;
  entry.last_access = last_access;
  return entry;
}

class CatalogTest : public MasterStateTest {
 protected:
  CatalogTest() = default;
  explicit CatalogTest(const std::function<void(MasterOptions&)>& tweak) : MasterStateTest(tweak) {}

  // One SyncCatalog for `catalog`'s segment; the reply for it.
  SegmentCatalogChanges SyncOnce(MasterState& state, const std::string& client,
                                 ClientCatalog* catalog) {
    CatalogAck ack{catalog->segment, catalog->ack, catalog->full};
    auto replies = state.SyncCatalog(client, std::span(&ack, 1));
    EXPECT_TRUE(replies.ok()) << replies.status();
    if (!replies.ok()) return {};
    for (const SegmentCatalogChanges& reply : *replies) {
      if (reply.segment_id == catalog->segment) {
        catalog->Apply(reply);
        return reply;
      }
    }
    ADD_FAILURE() << "no reply for segment " << catalog->segment;
    return {};
  }
  // SyncCatalog until nothing more waits; the changes applied.
  std::vector<CatalogChange> Sync(ClientCatalog* catalog, const std::string& client = "a") {
    return Sync(state_, client, catalog);
  }
  std::vector<CatalogChange> Sync(MasterState& state, const std::string& client,
                                  ClientCatalog* catalog) {
    std::vector<CatalogChange> all;
    for (int calls = 0; calls < 1000; ++calls) {
      SegmentCatalogChanges reply = SyncOnce(state, client, catalog);
      all.insert(all.end(), reply.changes.begin(), reply.changes.end());
      if (!reply.more) return all;
    }
    ADD_FAILURE() << "more never ends";
    return all;
  }

  // Puts `count` objects "<prefix><i>" of `size` bytes as client "a", in batches.
  void PutMany(const std::string& prefix, int first, int count, uint64_t size) {
    std::vector<std::string> keys;
    for (int i = first; i < first + count; ++i) keys.push_back(prefix + std::to_string(i));
    for (size_t from = 0; from < keys.size(); from += 4096) {
      std::vector<PutStartItem> items;
      std::vector<std::string_view> views;
      for (size_t i = from; i < std::min(keys.size(), from + 4096); ++i) {
        items.push_back(PutStartItem{keys[i], size});
        views.push_back(keys[i]);
      }
      auto started = state_.BatchPutStart("a", items, {});
      ASSERT_TRUE(started.ok());
      for (const PutStartOutcome& outcome : *started) ASSERT_TRUE(outcome.status.ok());
      ASSERT_TRUE(state_.BatchPutEnd("a", views).ok());
    }
  }

  std::unique_ptr<MasterState> Restarted(const std::function<void(MasterOptions&)>& tweak =
                                             [](MasterOptions&) {}) {
    return std::make_unique<MasterState>(MakeOptions(tweak));
  }
  MountOutcome MountCatalog(MasterState& state, const std::string& client, const std::string& name,
                            uint64_t size, std::vector<CatalogEntry> catalog,
                            uint64_t incarnation = 1, uint64_t base = 0x100000) {
    SegmentMount mount{name, base, size, {}};
    mount.catalog = std::move(catalog);
    mount.catalog_incarnation = incarnation;
    std::vector<MountOutcome> outcomes =
        state.MountSegments(MountCaller{client, "host-" + client}, std::span(&mount, 1));
    EXPECT_EQ(outcomes.size(), 1u);
    return outcomes.at(0);
  }
  static GetOutcome GetFrom(MasterState& state, const std::string& client, std::string_view key,
                            GetMode mode = GetMode::kLease) {
    auto batch = state.BatchGetReplicas(client, std::span(&key, 1), mode);
    if (!batch.ok()) {
      GetOutcome failed;
      failed.status = batch.status();
      return failed;
    }
    return batch->items[0];
  }
  static Status ExistIn(MasterState& state, const std::string& client, std::string_view key) {
    auto results = state.BatchExist(client, std::span(&key, 1));
    return results.ok() ? results->at(0) : results.status();
  }

  // Two owners that disagree on a key's size: neither copy survives, whichever came first, and
  // a third catalog with the key is refused too until the window ends.
  void CheckSizeConflict(bool larger_first) {
    std::unique_ptr<MasterState> next = Restarted();
    const uint64_t first_size = larger_first ? 200 : 100;
    const uint64_t second_size = larger_first ? 100 : 200;
    MountOutcome a = MountCatalog(*next, "a", "seg-a", 1 << 20,
                                  {Entry("k", 0, first_size), Entry("a-only", 4096, 64)});
    ASSERT_TRUE(a.status.ok());
    EXPECT_EQ(a.recovery.restored, 2u);
    MountOutcome b = MountCatalog(*next, "b", "seg-b", 1 << 20, {Entry("k", 0, second_size)});
    ASSERT_TRUE(b.status.ok());
    EXPECT_EQ(b.recovery.restored, 0u);
    EXPECT_EQ(b.recovery.dropped, 1u);
    EXPECT_EQ(ExistIn(*next, "a", "k").code(), StatusCode::kNotFound);
    EXPECT_TRUE(ExistIn(*next, "a", "a-only").ok());
    EXPECT_GT(next->Stats().bytes_used, 64u) << "k's ranges wait for their owners' catalogs";
    // a's and b's catalogs hear that k is gone; once both have applied it, k's ranges are free.
    ClientCatalog on_a{a.segment_id};
    on_a.by_offset[0] = Entry("k", 0, first_size);
    Sync(*next, "a", &on_a);
    EXPECT_FALSE(on_a.Holds("k"));
    ClientCatalog on_b{b.segment_id};
    on_b.by_offset[0] = Entry("k", 0, second_size);
    Sync(*next, "b", &on_b);
    EXPECT_FALSE(on_b.Holds("k"));
    SyncOnce(*next, "a", &on_a);
    SyncOnce(*next, "b", &on_b);
    EXPECT_EQ(next->Stats().bytes_used, 64u) << "both ranges of k are free";
    // A third catalog agreeing with either size is refused as well.
    MountOutcome c = MountCatalog(*next, "c", "seg-c", 1 << 20, {Entry("k", 0, first_size)});
    ASSERT_TRUE(c.status.ok());
    EXPECT_EQ(c.recovery.dropped, 1u);
    EXPECT_EQ(ExistIn(*next, "a", "k").code(), StatusCode::kNotFound);
    // Once the window is over, the key is an ordinary key again: a put stores it (and a catalog
    // that comes now is ignored, whatever it holds).
    Advance(milliseconds(5001));
    next->Heartbeat("a");
    next->RunMaintenance();
    MountOutcome d = MountCatalog(*next, "d", "seg-d", 1 << 20, {Entry("k", 0, 300)});
    ASSERT_TRUE(d.status.ok());
    EXPECT_EQ(d.recovery.restored, 0u);
    EXPECT_EQ(d.recovery.dropped, 1u);
    PutStartItem item{"k", 300};
    std::string_view key = "k";
    ASSERT_TRUE(next->BatchPutStart("a", std::span(&item, 1), {}).ok());
    ASSERT_TRUE(next->BatchPutEnd("a", std::span(&key, 1)).ok());
    EXPECT_TRUE(ExistIn(*next, "a", "k").ok());
  }
};

// ---- the feed ----

TEST_F(CatalogTest, PutEndAddsTheObjectWithItsPins) {
  ClientCatalog catalog{Mount("a", "seg-a", 1 << 20)};
  ASSERT_TRUE(PutStart("a", "k", 100).status.ok());
  EXPECT_TRUE(Sync(&catalog).empty()) << "nothing is committed before PutEnd";
  ASSERT_TRUE(PutEnd("a", "k").ok());
  PutOptions pinned;
  pinned.pin = true;
  ASSERT_TRUE(Put("a", "p", 200, pinned).ok());
  PutOptions soft;
  soft.soft_pin_action = SoftPinAction::kEnable;
  soft.soft_pin_ttl = milliseconds(5000);
  ASSERT_TRUE(Put("a", "s", 300, soft).ok());
  Advance(milliseconds(1000));
  std::vector<CatalogChange> changes = Sync(&catalog);
  ASSERT_EQ(changes.size(), 3u);
  for (const CatalogChange& change : changes) EXPECT_EQ(change.kind, CatalogChangeKind::kAdd);
  EXPECT_EQ(changes[0].entry.key, "k");
  EXPECT_EQ(changes[0].entry.size, 100u);
  EXPECT_EQ(changes[0].entry.offset, OffsetOf("k"));
  EXPECT_FALSE(changes[0].entry.pinned);
  EXPECT_EQ(changes[0].entry.soft_pin_remaining_ms, 0u);
  EXPECT_TRUE(changes[1].entry.pinned);
  EXPECT_EQ(changes[2].entry.soft_pin_remaining_ms, 4000u) << "the time left when read";
  EXPECT_LT(changes[0].entry.last_access, changes[2].entry.last_access);
  EXPECT_EQ(changes[0].seq + 2, changes[2].seq);
  // A retried PutEnd logs nothing more.
  ASSERT_TRUE(PutEnd("a", "k").ok());
  EXPECT_TRUE(Sync(&catalog).empty());
}

TEST_F(CatalogTest, EveryWayOutOfTheIndexRemoves) {
  ClientCatalog catalog{Mount("a", "seg-a", 64 * 4096)};
  ASSERT_TRUE(PutPages(0, 8).ok());
  Sync(&catalog);
  ASSERT_EQ(catalog.by_offset.size(), 8u);
  // Removed, and forced out under a lease.
  ASSERT_TRUE(Remove("a", "k0").ok());
  Lease("a", "k1");
  ASSERT_TRUE(Remove("a", "k1", /*force=*/true).ok());
  // Replaced by an upsert: the old one goes, the new one comes.
  PutOptions upsert;
  upsert.upsert = true;
  ASSERT_TRUE(Put("a", "k2", 8192, upsert).ok());
  // Bulk removals.
  ASSERT_TRUE(state_.RemoveByRegex("a", "", "k3").ok());
  std::vector<CatalogChange> changes = Sync(&catalog);
  ASSERT_EQ(changes.size(), 5u);
  EXPECT_EQ(changes[0].kind, CatalogChangeKind::kRemove);
  EXPECT_EQ(changes[0].entry.key, "k0");
  EXPECT_EQ(changes[1].entry.key, "k1");
  EXPECT_EQ(changes[2].kind, CatalogChangeKind::kRemove);
  EXPECT_EQ(changes[2].entry.key, "k2");
  EXPECT_EQ(changes[3].kind, CatalogChangeKind::kAdd);
  EXPECT_EQ(changes[3].entry.size, 8192u);
  EXPECT_EQ(changes[4].entry.key, "k3");
  EXPECT_FALSE(catalog.Holds("k0") || catalog.Holds("k1") || catalog.Holds("k3"));
  EXPECT_TRUE(catalog.Holds("k2"));
  // Eviction: the pool is full; new pages evict the oldest. The owner keeps its catalog up to
  // date meanwhile (the evicted ranges come back once it has applied their REMOVEs).
  {
    std::atomic<bool> done{false};
    std::thread owner([&] {
      while (!done.load()) {
        SyncOnce(state_, "a", &catalog);
        std::this_thread::yield();
      }
    });
    EXPECT_TRUE(PutPages(100, 160).ok());
    done = true;
    owner.join();
  }
  ASSERT_TRUE(state_.RemoveAll("a").ok());
  Sync(&catalog);
  EXPECT_TRUE(catalog.by_offset.empty()) << catalog.by_offset.size() << " left";
  EXPECT_GT(state_.Stats().evictions, 0u);
}

// Until the owner's catalog drops a removed object, the object's range keeps its bytes: a master
// that rebuilt from that catalog (this one having died) would otherwise serve another object's
// bytes as the removed one's value.
TEST_F(CatalogTest, ARemovedRangeIsReusedOnlyOnceItsOwnerAppliedTheRemove) {
  ClientCatalog catalog{Mount("a", "seg-a", 4096)};  // one page
  ASSERT_TRUE(Put("a", "old", 4096).ok());
  Sync(&catalog);
  ASSERT_TRUE(catalog.Holds("old"));
  ASSERT_TRUE(Remove("a", "old").ok());
  EXPECT_EQ(state_.Stats().bytes_used, 4096u) << "held for the owner";
  PutStartOutcome refused = PutStart("a", "new", 4096);
  EXPECT_EQ(refused.status.code(), StatusCode::kResourceExhausted) << refused.status;
  EXPECT_NE(refused.status.message().find("to apply them to their catalogs"), std::string::npos)
      << refused.status;
  // The owner applies the REMOVE; its next sync says so, and the range is free.
  Sync(&catalog);
  EXPECT_FALSE(catalog.Holds("old"));
  EXPECT_EQ(state_.Stats().bytes_used, 4096u) << "applied, not yet acknowledged";
  SyncOnce(state_, "a", &catalog);
  EXPECT_EQ(state_.Stats().bytes_used, 0u);
  PutStartOutcome placed = PutStart("a", "new", 4096);
  ASSERT_TRUE(placed.status.ok()) << placed.status;
  ASSERT_EQ(placed.replicas.size(), 1u);
  EXPECT_EQ(placed.replicas[0].offset, 0u);
}

// An owner that checks its catalog against its memory (verifies_catalog) recorded the identity of
// an object's bytes when it applied the object's ADD, and drops the entry itself should the range
// hold anything else by the time it reports: once that ADD is acknowledged, a removed object's
// range is free at once. An object removed before its owner applied its ADD is held as before.
TEST_F(CatalogTest, AVerifyingOwnersRangesAreFreeOnceItAppliedTheAdd) {
  SegmentMount mount{"seg-a", 0x100000, 4096, {}};
  mount.verifies_catalog = true;
  auto mounted = state_.MountSegments("a", "host-a", std::span(&mount, 1));
  ASSERT_TRUE(mounted[0].ok()) << mounted[0].status();
  ClientCatalog catalog{*mounted[0]};
  // Removed before the owner applied its ADD: held until the REMOVE is acknowledged.
  Sync(&catalog);
  ASSERT_TRUE(Put("a", "unseen", 4096).ok());
  ASSERT_TRUE(Remove("a", "unseen").ok());
  EXPECT_EQ(state_.Stats().bytes_used, 4096u) << "held: the owner never read these bytes";
  Sync(&catalog);
  SyncOnce(state_, "a", &catalog);
  EXPECT_EQ(state_.Stats().bytes_used, 0u);
  // Applied and acknowledged: free the moment it is removed, and a put takes the range at once.
  ASSERT_TRUE(Put("a", "seen", 4096).ok());
  Sync(&catalog);
  SyncOnce(state_, "a", &catalog);
  ASSERT_TRUE(catalog.Holds("seen"));
  ASSERT_TRUE(Remove("a", "seen").ok());
  EXPECT_EQ(state_.Stats().bytes_used, 0u);
  ASSERT_TRUE(Put("a", "next", 4096).ok());
  // A reset's snapshot ADDs the object again: until the owner acknowledges that, it is held.
  Sync(&catalog);
  SyncOnce(state_, "a", &catalog);
  catalog.full = true;
  SegmentCatalogChanges snapshot = SyncOnce(state_, "a", &catalog);
  ASSERT_TRUE(snapshot.reset);
  ASSERT_TRUE(catalog.Holds("next"));
  ASSERT_TRUE(Remove("a", "next").ok());
  EXPECT_EQ(state_.Stats().bytes_used, 4096u) << "the snapshot's ADD is not acknowledged yet";
  Sync(&catalog);
  SyncOnce(state_, "a", &catalog);
  EXPECT_EQ(state_.Stats().bytes_used, 0u);
}

// A put that finds the pool full of held ranges waits for the owner rather than failing.
TEST_F(CatalogTest, APutWaitsForTheOwnerToFreeHeldRanges) {
  ClientCatalog catalog{Mount("a", "seg-a", 4096)};
  ASSERT_TRUE(Put("a", "old", 4096).ok());
  Sync(&catalog);
  std::atomic<bool> done{false};
  std::thread owner([&] {
    while (!done.load()) {
      SyncOnce(state_, "a", &catalog);
      std::this_thread::yield();
    }
  });
  // "old" is evicted for "new"; its range comes back with the owner's next sync.
  Status put = Put("a", "new", 4096);
  done = true;
  owner.join();
  EXPECT_TRUE(put.ok()) << put;
  EXPECT_EQ(state_.Stats().evictions, 1u);
}

// An owner that mounted without a catalog and has not read one holds nothing stale: ranges go back
// at once, and its first read is a snapshot, in which no removed object is.
TEST_F(CatalogTest, AnOwnerWithoutACatalogGetsRangesBackAtOnceAndASnapshot) {
  ClientCatalog catalog{Mount("a", "seg-a", 4096)};
  ASSERT_TRUE(Put("a", "old", 4096).ok());
  ASSERT_TRUE(Remove("a", "old").ok());
  EXPECT_EQ(state_.Stats().bytes_used, 0u);
  ASSERT_TRUE(Put("a", "new", 4096).ok());
  std::vector<CatalogChange> changes = Sync(&catalog);
  EXPECT_TRUE(catalog.Holds("new"));
  EXPECT_FALSE(catalog.Holds("old"));
  for (const CatalogChange& change : changes) EXPECT_NE(change.entry.key, "old");
}

TEST_F(CatalogTest, RevokedAndTimedOutPutsLogNothing) {
  ClientCatalog catalog{Mount("a", "seg-a", 1 << 20)};
  ASSERT_TRUE(PutStart("a", "revoked", 100).status.ok());
  std::string_view key = "revoked";
  ASSERT_TRUE(One(state_.BatchPutRevoke("a", std::span(&key, 1))).ok());
  ASSERT_TRUE(PutStart("a", "zombie", 100).status.ok());
  Advance(milliseconds(3001));
  Sweep();
  EXPECT_TRUE(Sync(&catalog).empty());
}

TEST_F(CatalogTest, AReplicaElsewhereKeepsItsCatalogEntryWhenOneSegmentGoes) {
  ClientCatalog on_a{Mount("a", "seg-a", 1 << 20)};
  ClientCatalog on_b{Mount("b", "seg-b", 1 << 20, 0x900000, "host-b")};
  PutOptions both;
  both.replica_num = 2;
  ASSERT_TRUE(Put("b", "both", 100, both).ok());
  Sync(&on_a, "a");
  Sync(&on_b, "b");
  EXPECT_TRUE(on_a.Holds("both"));
  EXPECT_TRUE(on_b.Holds("both"));
  // a goes silent and expires; the object keeps its replica on b, and b's catalog its entry.
  for (int i = 0; i < 6; ++i) {
    Advance(milliseconds(1000));
    state_.Heartbeat("b");
    state_.RunMaintenance();
  }
  EXPECT_TRUE(Sync(&on_b, "b").empty());
  EXPECT_TRUE(on_b.Holds("both"));
  CatalogAck ack{on_a.segment, on_a.ack};
  EXPECT_EQ(state_.SyncCatalog("a", std::span(&ack, 1)).status().code(),
            StatusCode::kFailedPrecondition);
  // Once the object goes, b's catalog hears of it.
  ASSERT_TRUE(Remove("b", "both").ok());
  std::vector<CatalogChange> changes = Sync(&on_b, "b");
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].kind, CatalogChangeKind::kRemove);
}

TEST_F(CatalogTest, GetsTouchOnlyObjectsUnusedForLong) {
  ClientCatalog catalog{Mount("a", "seg-a", 1 << 20)};
  ASSERT_TRUE(Put("a", "hot", 100).ok());
  ASSERT_TRUE(Put("a", "cold", 100).ok());
  Sync(&catalog);
  // Used right after its put: no TOUCH.
  Get("a", "hot");
  EXPECT_TRUE(Sync(&catalog).empty());
  // 10,000 gets of the hot key in one batch (ticks 4..10003): one TOUCH per epoch of 4096 ticks
  // it enters, at ticks 4096 and 8192; none for the 9,998 others.
  std::vector<std::string_view> keys(10000, "hot");
  ASSERT_TRUE(state_.BatchGetReplicas("a", keys).ok());
  std::vector<CatalogChange> changes = Sync(&catalog);
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0].entry.last_access, 4096u);
  EXPECT_EQ(changes[1].entry.last_access, 8192u);
  for (const CatalogChange& change : changes) {
    EXPECT_EQ(change.kind, CatalogChangeKind::kTouch);
    EXPECT_EQ(change.entry.offset, OffsetOf("hot"));
  }
  // The cold key's last use is over 4096 ticks old: its get is reported, with its new tick.
  const uint64_t before = catalog.by_offset.at(OffsetOf("cold")).last_access;
  Get("a", "cold");
  changes = Sync(&catalog);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].kind, CatalogChangeKind::kTouch);
  EXPECT_EQ(changes[0].entry.offset, OffsetOf("cold"));
  EXPECT_GT(catalog.by_offset.at(OffsetOf("cold")).last_access, before + 10000);
  // Peeks are no use: nothing.
  Get("a", "hot", nullptr, GetMode::kPeek);
  EXPECT_TRUE(Sync(&catalog).empty());
}

TEST_F(CatalogTest, AcknowledgedChangesAreForgotten) {
  ClientCatalog catalog{Mount("a", "seg-a", 1 << 20)};
  ASSERT_TRUE(Put("a", "x", 100).ok());
  ASSERT_TRUE(Put("a", "y", 100).ok());
  // Not acknowledged: the same changes again.
  CatalogAck none{catalog.segment, 0};
  auto first = state_.SyncCatalog("a", std::span(&none, 1));
  auto again = state_.SyncCatalog("a", std::span(&none, 1));
  ASSERT_TRUE(first.ok() && again.ok());
  ASSERT_EQ(first->at(0).changes.size(), 2u);
  ASSERT_EQ(again->at(0).changes.size(), 2u);
  EXPECT_FALSE(again->at(0).reset);
  // Acknowledging the first leaves the second.
  CatalogAck one{catalog.segment, first->at(0).changes[0].seq};
  auto rest = state_.SyncCatalog("a", std::span(&one, 1));
  ASSERT_TRUE(rest.ok());
  ASSERT_EQ(rest->at(0).changes.size(), 1u);
  EXPECT_EQ(rest->at(0).changes[0].entry.key, "y");
  // The first is gone now: asking from before it is a point the log cannot continue from, so
  // the whole catalog comes again, as a reset.
  auto reset = state_.SyncCatalog("a", std::span(&none, 1));
  ASSERT_TRUE(reset.ok());
  EXPECT_TRUE(reset->at(0).reset);
  ClientCatalog fresh{catalog.segment};
  Sync(&fresh);
  EXPECT_TRUE(fresh.Holds("x"));
  EXPECT_TRUE(fresh.Holds("y"));
  EXPECT_EQ(fresh.by_offset.size(), 2u);
  EXPECT_EQ(fresh.resets, 1);
  EXPECT_FALSE(SyncOnce(state_, "a", &fresh).reset) << "acknowledged: the reset is over";
  // An ack past the log's end also resets.
  ClientCatalog ahead{catalog.segment, fresh.ack + 100};
  Sync(&ahead);
  EXPECT_EQ(ahead.resets, 1);
  EXPECT_EQ(ahead.by_offset.size(), 2u);
  EXPECT_GE(state_.Stats().catalog_resets, 2u);
}

// A reset's snapshot of 80,000 objects comes in pages, shard by shard; changes made between the
// pages (in shards already sent and in shards not yet scanned) end up right in the catalog.
TEST_F(CatalogTest, AResetSnapshotInterleavesWithChangesAndConverges) {
  ClientCatalog catalog{Mount("a", "seg-a", 1ull << 32)};
  Sync(&catalog);  // read once: the log may grow past kMaxPendingCatalogChangesUnread
  constexpr int kObjects = 80000;
  PutMany("k", 0, kObjects, 64);
  Sync(&catalog);
  catalog.ack += 1'000'000;  // an ack the log cannot continue from: the next sync resets
  SegmentCatalogChanges first = SyncOnce(state_, "a", &catalog);
  EXPECT_TRUE(first.reset);
  EXPECT_TRUE(first.more);
  EXPECT_GE(first.changes.size(), kMaxCatalogChangesPerSegment / 2);
  EXPECT_LT(catalog.by_offset.size(), static_cast<size_t>(kObjects)) << "not all shards yet";
  for (int i = 0; i < kObjects; i += 101) ASSERT_TRUE(Remove("a", "k" + std::to_string(i)).ok());
  PutMany("n", 0, 500, 64);
  Sync(&catalog);
  EXPECT_EQ(catalog.resets, 1);
  EXPECT_EQ(catalog.by_offset.size(), state_.Stats().objects);
  std::set<std::string> held;
  for (const auto& [offset, entry] : catalog.by_offset) held.insert(entry.key);
  for (int i = 0; i < kObjects; i += 7) {
    const std::string key = "k" + std::to_string(i);
    EXPECT_EQ(held.contains(key), i % 101 != 0) << key;
  }
  for (int i = 0; i < 500; ++i) {
    const std::string key = "n" + std::to_string(i);
    ASSERT_TRUE(catalog.by_offset.contains(OffsetOf(key))) << key;
    EXPECT_EQ(catalog.by_offset.at(OffsetOf(key)).key, key);
  }
}

TEST_F(CatalogTest, LongLogsComeInPages) {
  ClientCatalog catalog{Mount("a", "seg-a", 1ull << 32)};
  Sync(&catalog);  // read once: the log may grow past kMaxPendingCatalogChangesUnread
  constexpr int kObjects = static_cast<int>(kMaxCatalogChangesPerSegment) + 100;
  PutMany("p", 0, kObjects, 64);
  SegmentCatalogChanges page = SyncOnce(state_, "a", &catalog);
  EXPECT_FALSE(page.reset);
  EXPECT_EQ(page.changes.size(), kMaxCatalogChangesPerSegment);
  EXPECT_TRUE(page.more);
  page = SyncOnce(state_, "a", &catalog);
  EXPECT_EQ(page.changes.size(), 100u);
  EXPECT_FALSE(page.more);
  EXPECT_EQ(catalog.by_offset.size(), static_cast<size_t>(kObjects));
}

TEST_F(CatalogTest, AnOwnerThatNeverReadsCostsABoundedLog) {
  ClientCatalog catalog{Mount("a", "seg-a", 1ull << 32)};
  PutMany("u", 0, static_cast<int>(kMaxPendingCatalogChangesUnread) + 1, 64);
  EXPECT_EQ(state_.Stats().catalog_resets, 1u);
  // Its first read is a reset that brings the whole catalog.
  Sync(&catalog);
  EXPECT_EQ(catalog.resets, 1);
  EXPECT_EQ(catalog.by_offset.size(), kMaxPendingCatalogChangesUnread + 1);
}

TEST_F(CatalogTest, SyncOfAnUnknownClientAsksForAMount) {
  Mount("a", "seg-a", 1 << 20);
  EXPECT_EQ(state_.SyncCatalog("ghost", {}).status().code(), StatusCode::kFailedPrecondition);
  std::vector<CatalogAck> acks(kMaxSegmentsPerMount + 1);
  EXPECT_EQ(state_.SyncCatalog("a", acks).status().code(), StatusCode::kInvalidArgument);
  // Without acks: every segment from its start; a segment of another client is not listed.
  Mount("b", "seg-b", 1 << 20, 0x900000);
  auto replies = state_.SyncCatalog("a", {});
  ASSERT_TRUE(replies.ok());
  ASSERT_EQ(replies->size(), 1u);
  // An unmounted segment's log is gone with it.
  const PoolSegmentId segment = replies->at(0).segment_id;
  ASSERT_TRUE(state_.UnmountSegments("a", std::span(&segment, 1)).ok());
  replies = state_.SyncCatalog("a", {});
  ASSERT_TRUE(replies.ok());
  EXPECT_TRUE(replies->empty());
}

// ---- rebuilds ----

TEST_F(CatalogTest, ARestartedMasterRebuildsFromTheCatalog) {
  ClientCatalog catalog{Mount("a", "seg-a", 1 << 20)};
  PutOptions pinned;
  pinned.pin = true;
  ASSERT_TRUE(Put("a", "pinned", 1000, pinned).ok());
  ASSERT_TRUE(Put("a", "plain", 5000).ok());
  ASSERT_TRUE(Put("a", "gone", 100).ok());
  ASSERT_TRUE(Remove("a", "gone").ok());
  Sync(&catalog);
  ASSERT_EQ(catalog.by_offset.size(), 2u);
  const uint64_t plain_at = OffsetOf("plain");

  std::unique_ptr<MasterState> next = Restarted();
  ASSERT_NE(next->incarnation(), state_.incarnation());
  MountOutcome mounted =
      MountCatalog(*next, "a", "seg-a", 1 << 20, catalog.Entries(), state_.incarnation());
  ASSERT_TRUE(mounted.status.ok()) << mounted.status;
  EXPECT_EQ(mounted.recovery.restored, 2u);
  EXPECT_EQ(mounted.recovery.dropped, 0u);
  GetOutcome got = GetFrom(*next, "a", "plain");
  ASSERT_TRUE(got.status.ok()) << got.status;
  EXPECT_EQ(got.size, 5000u);
  ASSERT_EQ(got.replicas.size(), 1u);
  EXPECT_EQ(got.replicas[0].segment_id, mounted.segment_id);
  EXPECT_EQ(got.replicas[0].offset, plain_at);
  EXPECT_EQ(next->Stats().objects, 2u);
  EXPECT_EQ(next->Stats().recovered_objects, 2u);
  EXPECT_EQ(next->Stats().bytes_used, 1024u + 5056u) << "the ranges are taken, rounded";
  // New puts never land on a restored range.
  for (int i = 0; i < 50; ++i) {
    const std::string key = "new" + std::to_string(i);  // the item views it
    PutStartItem item{key, 7000};
    auto placed = next->BatchPutStart("a", std::span(&item, 1), {});
    ASSERT_TRUE(placed.ok());
    const ReplicaLocation& at = (*placed)[0].replicas.at(0);
    for (const auto& [offset, entry] : catalog.by_offset) {
      EXPECT_TRUE(at.offset >= offset + entry.size || at.offset + 7000 <= offset) << at.offset;
    }
  }
  // The restored catalog goes on: a removal on the new master reaches it.
  ClientCatalog continued{mounted.segment_id};
  continued.by_offset = catalog.by_offset;
  std::string_view key = "plain";
  ASSERT_TRUE(One(next->BatchRemove("a", std::span(&key, 1), /*force=*/true)).ok());
  Sync(*next, "a", &continued);
  EXPECT_FALSE(continued.Holds("plain"));
  EXPECT_TRUE(continued.Holds("pinned"));
}

TEST_F(CatalogTest, BadEntriesAreDroppedAndTheirRangesStayFree) {
  std::unique_ptr<MasterState> next = Restarted();
  constexpr uint64_t kSize = 64 * 1024;
  std::vector<CatalogEntry> catalog = {
      Entry("good", 0, 100),
      Entry("", 1024, 64),                    // empty key
      Entry(std::string(65, 'x'), 2048, 64),  // longer than max_key_size (64)
      Entry("zero", 3072, 0),                 // size 0
      Entry("unaligned", 4100, 64),           // not a multiple of 64
      Entry("past-end", kSize - 64, 65),      // runs one byte past the end
      Entry("far", kSize, 64),                // starts at the end
      Entry("huge", 8192, UINT64_MAX),        // wraps
      Entry("chain-1", 10240, 200),           // [10240, 10496) overlaps chain-2
      Entry("chain-2", 10432, 200),           // [10432, 10688) overlaps both
      Entry("chain-3", 10624, 64),            // [10624, 10688)
      Entry("twice", 20480, 64),              // a key twice in one catalog
      Entry("twice", 24576, 64),
      Entry("last", kSize - 64, 64),  // the last range: fine
  };
  MountOutcome mounted = MountCatalog(*next, "a", "seg-a", kSize, catalog);
  ASSERT_TRUE(mounted.status.ok()) << mounted.status;
  EXPECT_EQ(mounted.recovery.restored, 2u);
  EXPECT_EQ(mounted.recovery.dropped, 12u);
  EXPECT_EQ(next->Stats().catalog_entries_dropped, 12u);
  EXPECT_TRUE(ExistIn(*next, "a", "good").ok());
  EXPECT_TRUE(ExistIn(*next, "a", "last").ok());
  for (const char* gone :
       {"zero", "unaligned", "past-end", "far", "huge", "chain-1", "chain-2", "chain-3", "twice"}) {
    EXPECT_EQ(ExistIn(*next, "a", gone).code(), StatusCode::kNotFound) << gone;
  }
  EXPECT_EQ(next->Stats().bytes_used, 128u + 64u);
  // The owner is told to forget every dropped entry, before anything else happens there.
  ClientCatalog held{mounted.segment_id};
  for (const CatalogEntry& entry : catalog) held.by_offset[entry.offset] = entry;
  std::vector<CatalogChange> changes = Sync(*next, "a", &held);
  ASSERT_EQ(changes.size(), 12u);
  for (const CatalogChange& change : changes) EXPECT_EQ(change.kind, CatalogChangeKind::kRemove);
  EXPECT_TRUE(held.Holds("good"));
  EXPECT_TRUE(held.Holds("last"));
  EXPECT_FALSE(held.Holds("chain-2"));
  EXPECT_FALSE(held.Holds("twice"));
  // Asked for the whole catalog (as a client does after such a mount): the kept entries only.
  ClientCatalog whole{mounted.segment_id};
  for (const CatalogEntry& entry : catalog) whole.by_offset[entry.offset] = entry;
  whole.full = true;
  Sync(*next, "a", &whole);
  EXPECT_EQ(whole.resets, 1);
  ASSERT_EQ(whole.by_offset.size(), 2u);
  EXPECT_EQ(whole.by_offset.at(0).key, "good");
  EXPECT_EQ(whole.by_offset.at(kSize - 64).key, "last");
  EXPECT_EQ(whole.by_offset.at(0).size, 100u);
  // A full sync is not repeated for an ack that continues it, and the log goes on from there.
  ASSERT_TRUE(One(next->BatchRemove("a", std::vector<std::string_view>{"good"})).ok());
  std::vector<CatalogChange> after = Sync(*next, "a", &whole);
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].kind, CatalogChangeKind::kRemove);
  EXPECT_EQ(whole.resets, 1);
  EXPECT_EQ(whole.by_offset.size(), 1u);
  // The dropped ranges are free: the segment takes what is left of it.
  PutStartItem fill{"fill", kSize - 64 - 128 - 64};
  auto placed = next->BatchPutStart("a", std::span(&fill, 1), {});
  ASSERT_TRUE(placed.ok());
  EXPECT_TRUE((*placed)[0].status.ok()) << (*placed)[0].status;
}

TEST_F(CatalogTest, ACatalogOfThisMasterIsIgnored) {
  MountOutcome mounted =
      MountCatalog(state_, "a", "seg-a", 1 << 20, {Entry("k", 0, 100), Entry("j", 4096, 100)},
                   state_.incarnation());
  ASSERT_TRUE(mounted.status.ok()) << mounted.status;
  EXPECT_EQ(mounted.recovery.restored, 0u);
  EXPECT_EQ(mounted.recovery.dropped, 2u);
  EXPECT_EQ(Exist("a", "k").code(), StatusCode::kNotFound);
  EXPECT_EQ(state_.Stats().bytes_used, 0u);
  EXPECT_EQ(Get("a", "k").status.code(), StatusCode::kNotFound) << "no recovery window";
  // The owner is told to drop what it holds.
  ClientCatalog held{mounted.segment_id};
  held.by_offset[0] = Entry("k", 0, 100);
  ASSERT_TRUE(Put("a", "after", 100).ok());
  Sync(&held);
  EXPECT_EQ(held.resets, 1);
  EXPECT_FALSE(held.Holds("k"));
  EXPECT_TRUE(held.Holds("after"));
  EXPECT_EQ(held.by_offset.size(), 1u);
}

TEST_F(CatalogTest, TheSameObjectFromTwoCatalogsHasTwoReplicas) {
  std::unique_ptr<MasterState> next = Restarted();
  MountOutcome a = MountCatalog(*next, "a", "seg-a", 1 << 20, {Entry("k", 4096, 100)});
  MountOutcome b = MountCatalog(*next, "b", "seg-b", 1 << 20, {Entry("k", 8192, 100)});
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  EXPECT_EQ(b.recovery.restored, 1u);
  GetOutcome got = GetFrom(*next, "a", "k");
  ASSERT_TRUE(got.status.ok()) << got.status;
  ASSERT_EQ(got.replicas.size(), 2u);
  EXPECT_EQ(got.replicas[0].segment_id, a.segment_id);
  EXPECT_EQ(got.replicas[0].offset, 4096u);
  EXPECT_EQ(got.replicas[1].segment_id, b.segment_id);
  EXPECT_EQ(got.replicas[1].offset, 8192u);
  EXPECT_EQ(next->Stats().objects, 1u);
}

// A put to the new master is the truth about its key: an older claim from a catalog is neither
// added beside it (same size) nor allowed to drop it (another size).
TEST_F(CatalogTest, AClaimIsNeverAddedBesideBytesPutToThisMaster) {
  std::unique_ptr<MasterState> next = Restarted();
  SegmentMount mount{"seg-w", 0x900000, 1 << 20, {}};
  ASSERT_TRUE(next->MountSegments("w", "host-w", std::span(&mount, 1))[0].ok());
  PutOptions on_w;
  on_w.preferred_segments = {"seg-w"};
  for (std::string_view key : {"same", "other"}) {
    PutStartItem item{key, 100};
    ASSERT_TRUE(next->BatchPutStart("w", std::span(&item, 1), on_w).ok());
    ASSERT_TRUE(next->BatchPutEnd("w", std::span(&key, 1)).ok());
  }
  MountOutcome a = MountCatalog(*next, "a", "seg-a", 1 << 20,
                                {Entry("same", 0, 100), Entry("other", 4096, 200)});
  ASSERT_TRUE(a.status.ok()) << a.status;
  EXPECT_EQ(a.recovery.restored, 0u);
  EXPECT_EQ(a.recovery.dropped, 2u);
  for (std::string_view key : {"same", "other"}) {
    GetOutcome got = GetFrom(*next, "w", key, GetMode::kPeek);
    ASSERT_TRUE(got.status.ok()) << key << ": " << got.status;
    EXPECT_EQ(got.size, 100u) << key;
    ASSERT_EQ(got.replicas.size(), 1u) << key;
    EXPECT_NE(got.replicas[0].segment_id, a.segment_id) << key;
  }
  // a's catalog hears that both are not its own.
  ClientCatalog on_a{a.segment_id};
  on_a.by_offset[0] = Entry("same", 0, 100);
  on_a.by_offset[4096] = Entry("other", 4096, 200);
  Sync(*next, "a", &on_a);
  EXPECT_FALSE(on_a.Holds("same"));
  EXPECT_FALSE(on_a.Holds("other"));
}

TEST_F(CatalogTest, SizeConflictDropsBothSmallerFirst) { CheckSizeConflict(false); }
TEST_F(CatalogTest, SizeConflictDropsBothLargerFirst) { CheckSizeConflict(true); }

TEST_F(CatalogTest, LeasedObjectsAreNotExtended) {
  std::unique_ptr<MasterState> next = Restarted();
  MountOutcome a = MountCatalog(*next, "a", "seg-a", 1 << 20, {Entry("k", 0, 100)});
  ASSERT_TRUE(a.status.ok());
  std::string_view key = "k";
  auto leased = next->BatchGetReplicas("a", std::span(&key, 1));
  ASSERT_TRUE(leased.ok());
  ASSERT_NE(leased->lease_id, 0u);
  MountOutcome b = MountCatalog(*next, "b", "seg-b", 1 << 20, {Entry("k", 0, 100)});
  ASSERT_TRUE(b.status.ok());
  EXPECT_EQ(b.recovery.restored, 0u);
  EXPECT_EQ(b.recovery.dropped, 1u);
  EXPECT_EQ(GetFrom(*next, "a", "k", GetMode::kPeek).replicas.size(), 1u);
  // b's range of k is free once b's catalog has dropped k.
  ClientCatalog on_b{b.segment_id};
  on_b.by_offset[0] = Entry("k", 0, 100);
  Sync(*next, "b", &on_b);
  SyncOnce(*next, "b", &on_b);
  EXPECT_EQ(next->Stats().bytes_used, 128u) << "b's range of k is free";
  // Released: the next catalog adds its replica.
  ASSERT_TRUE(next->ReleaseLeases("a", std::span(&leased->lease_id, 1)).ok());
  MountOutcome c = MountCatalog(*next, "c", "seg-c", 1 << 20, {Entry("k", 64, 100)});
  ASSERT_TRUE(c.status.ok());
  EXPECT_EQ(c.recovery.restored, 1u);
  GetOutcome got = GetFrom(*next, "a", "k", GetMode::kPeek);
  ASSERT_EQ(got.replicas.size(), 2u);
  EXPECT_EQ(got.replicas[1].segment_id, c.segment_id);
  EXPECT_EQ(got.replicas[1].offset, 64u);
}

TEST_F(CatalogTest, AKeyBeingWrittenWins) {
  std::unique_ptr<MasterState> next = Restarted();
  SegmentMount mount{"seg-w", 0x900000, 1 << 20, {}};
  ASSERT_TRUE(next->MountSegments("w", "host-w", std::span(&mount, 1))[0].ok());
  PutStartItem item{"k", 300};
  PutOptions on_w;
  on_w.preferred_segments = {"seg-w"};
  ASSERT_TRUE(next->BatchPutStart("w", std::span(&item, 1), on_w).ok());
  MountOutcome a = MountCatalog(*next, "a", "seg-a", 1 << 20, {Entry("k", 0, 100)});
  ASSERT_TRUE(a.status.ok());
  EXPECT_EQ(a.recovery.dropped, 1u);
  std::string_view key = "k";
  ASSERT_TRUE(next->BatchPutEnd("w", std::span(&key, 1)).ok());
  GetOutcome got = GetFrom(*next, "w", "k");
  ASSERT_TRUE(got.status.ok());
  EXPECT_EQ(got.size, 300u);
  EXPECT_EQ(got.replicas.size(), 1u);
}

class CatalogPinTest : public CatalogTest {
 protected:
  CatalogPinTest()
      : CatalogTest([](MasterOptions& options) {
          options.max_soft_pin_ttl = milliseconds(10000);
          options.eviction_slack = 0;
        }) {}
};

TEST_F(CatalogPinTest, PinsAndEvictionOrderSurviveARebuild) {
  std::unique_ptr<MasterState> next = Restarted([](MasterOptions& options) {
    options.max_soft_pin_ttl = milliseconds(10000);
    options.eviction_slack = 0;
  });
  // Eight pages; listed out of order, with last_access saying old3 < old1 < old2 < ...
  std::vector<CatalogEntry> catalog;
  const char* names[] = {"old2", "old1", "new1", "old3", "new2", "new3"};
  const uint64_t ticks[] = {5000, 4000, 9000, 3000, 9500, 9900};
  for (int i = 0; i < 6; ++i) catalog.push_back(Entry(names[i], i * 4096, 4096, ticks[i]));
  CatalogEntry pinned = Entry("pinned", 6 * 4096, 4096, 1);
  pinned.pinned = true;
  catalog.push_back(pinned);
  CatalogEntry soft = Entry("soft", 7 * 4096, 4096, 2);
  soft.soft_pin_remaining_ms = 2000;
  catalog.push_back(soft);
  CatalogEntry long_soft = Entry("long-soft", 8 * 4096, 4096, 3);
  long_soft.soft_pin_remaining_ms = 3'600'000;  // past max_soft_pin_ttl: capped at 10 s
  catalog.push_back(long_soft);
  MountOutcome mounted = MountCatalog(*next, "a", "seg-a", 9 * 4096, catalog);
  ASSERT_TRUE(mounted.status.ok());
  ASSERT_EQ(mounted.recovery.restored, 9u);
  EXPECT_EQ(next->Stats().soft_pinned_objects, 2u);
  // A get now is newer than every restored use.
  GetFrom(*next, "a", "old3");
  // Three pages of room: the least recently used unpinned objects go, old1 first.
  EXPECT_EQ(next->Evict(3 * 4096), 3u * 4096);
  EXPECT_EQ(ExistIn(*next, "a", "old1").code(), StatusCode::kNotFound);
  EXPECT_EQ(ExistIn(*next, "a", "old2").code(), StatusCode::kNotFound);
  EXPECT_EQ(ExistIn(*next, "a", "new1").code(), StatusCode::kNotFound);
  EXPECT_TRUE(ExistIn(*next, "a", "old3").ok()) << "used after the rebuild";
  EXPECT_TRUE(ExistIn(*next, "a", "new2").ok());
  // The soft pin runs for the time left, the long one for the maximum; the hard pin stays.
  Advance(milliseconds(2001));
  next->Heartbeat("a");
  next->RunMaintenance();
  EXPECT_EQ(next->Stats().soft_pinned_objects, 1u);
  Advance(milliseconds(8000));
  next->Heartbeat("a");
  next->RunMaintenance();
  EXPECT_EQ(next->Stats().soft_pinned_objects, 0u);
  EXPECT_EQ(next->Evict(100 * 4096), 5u * 4096);
  EXPECT_TRUE(ExistIn(*next, "a", "pinned").ok());
  EXPECT_EQ(next->Stats().objects, 1u);
}

// ---- the recovery window ----

TEST_F(CatalogTest, GetsOfAbsentKeysAskForARetryWhileRebuilding) {
  std::unique_ptr<MasterState> next = Restarted();
  Advance(milliseconds(1000));
  MountOutcome a = MountCatalog(*next, "a", "seg-a", 1 << 20, {Entry("k", 0, 100)});
  ASSERT_TRUE(a.status.ok());
  GetOutcome missing = GetFrom(*next, "a", "elsewhere");
  EXPECT_EQ(missing.status.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(missing.status.message().starts_with(kRebuildingMessage)) << missing.status;
  EXPECT_NE(missing.status.message().find("until 4000 ms from now"), std::string::npos)
      << "the window ends client_ttl after the master's start" << missing.status;
  EXPECT_TRUE(GetFrom(*next, "a", "k").status.ok());
  // Exist and peeks answer from what is rebuilt so far.
  EXPECT_EQ(ExistIn(*next, "a", "elsewhere").code(), StatusCode::kNotFound);
  EXPECT_EQ(GetFrom(*next, "a", "elsewhere", GetMode::kPeek).status.code(), StatusCode::kNotFound);
  // b's catalog brings the key: found.
  ASSERT_TRUE(MountCatalog(*next, "b", "seg-b", 1 << 20, {Entry("elsewhere", 0, 100)}).status.ok());
  EXPECT_TRUE(GetFrom(*next, "a", "elsewhere").status.ok());
  Advance(milliseconds(3999));
  EXPECT_EQ(GetFrom(*next, "a", "nowhere").status.code(), StatusCode::kUnavailable);
  Advance(milliseconds(1));
  EXPECT_EQ(GetFrom(*next, "a", "nowhere").status.code(), StatusCode::kNotFound);
  // The window is not opened again: a catalog that comes after it is ignored (its owner stayed
  // away longer than every live client needed to come back), and its owner told to drop it.
  std::unique_ptr<MasterState> standby = Restarted();
  Advance(milliseconds(10000));
  next->Heartbeat("a");
  MountOutcome late = MountCatalog(*next, "c", "seg-c", 1 << 20, {Entry("late", 0, 100)});
  ASSERT_TRUE(late.status.ok()) << late.status;
  EXPECT_EQ(late.recovery.restored, 0u);
  EXPECT_EQ(late.recovery.dropped, 1u);
  EXPECT_EQ(GetFrom(*next, "a", "late").status.code(), StatusCode::kNotFound);
  EXPECT_EQ(GetFrom(*next, "a", "nowhere").status.code(), StatusCode::kNotFound);
  ClientCatalog on_c{late.segment_id};
  on_c.by_offset[0] = Entry("late", 0, 100);
  Sync(*next, "c", &on_c);
  EXPECT_EQ(on_c.resets, 1);
  EXPECT_FALSE(on_c.Holds("late"));
  // A master whose first catalog comes long after its start (a standby elected late) opens its
  // window of client_ttl from then.
  ASSERT_TRUE(MountCatalog(*standby, "c", "seg-c", 1 << 20, {Entry("late", 0, 100)}).status.ok());
  missing = GetFrom(*standby, "c", "nowhere");
  EXPECT_EQ(missing.status.code(), StatusCode::kUnavailable);
  EXPECT_NE(missing.status.message().find("until 5000 ms from now"), std::string::npos)
      << missing.status;
  // A mount without a catalog opens none.
  std::unique_ptr<MasterState> plain = Restarted();
  SegmentMount mount{"seg-p", 0, 1 << 20, {}};
  ASSERT_TRUE(plain->MountSegments("p", "host-p", std::span(&mount, 1))[0].ok());
  EXPECT_EQ(GetFrom(*plain, "p", "nowhere").status.code(), StatusCode::kNotFound);
}

// A million-object rebuild is the benchmark's (larder-bench master --rebuild); this one checks
// that a large catalog is restored whole, in order, with the allocator and the index agreeing.
TEST_F(CatalogTest, ALargeCatalogIsRestoredWhole) {
  std::unique_ptr<MasterState> next = Restarted();
  constexpr uint64_t kEntries = 50000;
  std::vector<CatalogEntry> catalog;
  for (uint64_t i = 0; i < kEntries; ++i) {
    catalog.push_back(Entry("obj/" + std::to_string(i), i * 4096, 4000, (i * 7919) % kEntries));
  }
  MountOutcome mounted = MountCatalog(*next, "a", "seg-a", kEntries * 4096, catalog);
  ASSERT_TRUE(mounted.status.ok());
  EXPECT_EQ(mounted.recovery.restored, kEntries);
  EXPECT_EQ(next->Stats().objects, kEntries);
  EXPECT_EQ(next->Stats().bytes_used, kEntries * 4032);
  // Evicting a tenth takes the entries with the smallest ticks (eviction is exact LRU to within
  // a few objects per shard at the boundary, with restored objects as with put ones).
  EXPECT_EQ(next->Evict(kEntries / 10 * 4032), kEntries / 10 * 4032);
  for (uint64_t i = 0; i < kEntries; ++i) {
    const uint64_t tick = (i * 7919) % kEntries;
    if (tick < kEntries / 10 - 100) {
      ASSERT_EQ(ExistIn(*next, "a", catalog[i].key).code(), StatusCode::kNotFound) << tick;
    } else if (tick >= kEntries / 10 + 100) {
      ASSERT_TRUE(ExistIn(*next, "a", catalog[i].key).ok()) << tick;
    }
  }
}

// ---- a master's own stall ----

TEST_F(CatalogTest, AStalledMasterExpiresNobody) {
  Mount("a", "seg-a", 1 << 20);
  ASSERT_TRUE(Put("a", "k", 100).ok());
  state_.RunMaintenance();
  Advance(milliseconds(10000));  // twice the TTL without a sweep: the master was paused
  state_.RunMaintenance();
  EXPECT_EQ(state_.Stats().clients, 1u);
  EXPECT_EQ(state_.Stats().client_expiries, 0u);
  // Silence after the stall still expires the client, one TTL later.
  for (int i = 0; i < 50; ++i) {
    Advance(milliseconds(100));
    state_.RunMaintenance();
  }
  EXPECT_EQ(state_.Stats().clients, 1u);
  Advance(milliseconds(100));
  state_.RunMaintenance();
  EXPECT_EQ(state_.Stats().clients, 0u);
  EXPECT_EQ(state_.Stats().client_expiries, 1u);
  // A gap just under the heartbeat interval plus the sweep interval is no stall.
  Mount("b", "seg-b", 1 << 20, 0x900000);
  state_.RunMaintenance();
  for (int i = 0; i < 3; ++i) {
    Advance(milliseconds(1766));  // client_ttl / 3 + sweep_interval
    state_.RunMaintenance();
  }
  EXPECT_EQ(state_.Stats().clients, 0u) << "5.3 s of silence, in sweeps 1.77 s apart";
}

}  // namespace
}  // namespace larder::master
