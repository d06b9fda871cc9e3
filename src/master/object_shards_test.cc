// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/object_shards.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace larder::master {
namespace {

std::vector<StoredReplica> Replicas(int n) {
  std::vector<StoredReplica> replicas;
  for (int i = 0; i < n; ++i) {
    replicas.push_back(StoredReplica{static_cast<PoolSegmentId>(100 + i),
                                     static_cast<uint64_t>(4096 * i), static_cast<uint32_t>(i)});
  }
  return replicas;
}

TEST(ObjectTest, KeepsKeyAndReplicasInOneAllocation) {
  std::string key("layer0/\0block/42", 16);  // an embedded NUL is part of the key
  auto replicas = Replicas(3);
  Object* object = Object::Create(key, replicas);
  EXPECT_EQ(object->key(), key);
  ASSERT_EQ(object->replicas().size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(object->replicas()[i].segment_id, replicas[i].segment_id);
    EXPECT_EQ(object->replicas()[i].offset, replicas[i].offset);
    EXPECT_EQ(object->replicas()[i].handle, replicas[i].handle);
  }
  Object::Destroy(object);
}

TEST(ObjectTest, ErasingReplicasKeepsTheKeyAndTheOthersInOrder) {
  const std::string key(4096, 'k');
  Object* object = Object::Create(key, Replicas(4));
  object->EraseReplicasIf([](const StoredReplica& r) { return r.segment_id == 101; });
  ASSERT_EQ(object->replicas().size(), 3u);
  EXPECT_EQ(object->replicas()[0].segment_id, 100u);
  EXPECT_EQ(object->replicas()[1].segment_id, 102u);
  EXPECT_EQ(object->replicas()[2].segment_id, 103u);
  EXPECT_EQ(object->key(), key);
  object->EraseReplicasIf([](const StoredReplica&) { return false; });
  EXPECT_EQ(object->replicas().size(), 3u);
  object->EraseReplicasIf([](const StoredReplica&) { return true; });
  EXPECT_TRUE(object->replicas().empty());
  EXPECT_EQ(object->key(), key);
  Object::Destroy(object);
}

TEST(ShardTest, FindsWhatWasInsertedAndNothingElse) {
  Shard shard;
  MutexLock lock(shard.mu);  // what every caller of a Shard holds
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    std::string key = "key/" + std::to_string(i);
    ASSERT_EQ(shard.Find(KeyRef(key)), nullptr);
    Object* object = shard.Insert(KeyRef(key), Replicas(1 + i % 3));
    object->size = static_cast<uint64_t>(i);
    shard.Link(object, ObjectList::kLru);
  }
  EXPECT_EQ(shard.objects.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    std::string key = "key/" + std::to_string(i);
    Object* object = shard.Find(KeyRef(key));
    ASSERT_NE(object, nullptr) << key;
    EXPECT_EQ(object->key(), key);
    EXPECT_EQ(object->size, static_cast<uint64_t>(i));
    EXPECT_EQ(object->replicas().size(), static_cast<size_t>(1 + i % 3));
  }
  EXPECT_EQ(shard.Find(KeyRef("key/")), nullptr);
  EXPECT_EQ(shard.Find(KeyRef("key/1x")), nullptr);
  EXPECT_EQ(shard.Find(KeyRef("")), nullptr);
}

TEST(ShardTest, EraseKeepsTheListAndIndexConsistent) {
  Shard shard;
  MutexLock lock(shard.mu);  // what every caller of a Shard holds
  std::vector<std::string> keys;
  for (int i = 0; i < 1000; ++i) {
    keys.push_back("k" + std::to_string(i));
    shard.Link(shard.Insert(KeyRef(keys.back()), Replicas(1)), ObjectList::kLru);
  }
  // Erase one in the middle, the newest and the oldest.
  shard.Erase(shard.Find(KeyRef("k500")));
  shard.Erase(shard.Find(KeyRef("k999")));
  shard.Erase(shard.Find(KeyRef("k0")));
  // Every other even one, by predicate.
  size_t erased = shard.EraseIf([](const Object* object) {
    int i = std::stoi(std::string(object->key().substr(1)));
    return i % 2 == 0;
  });
  EXPECT_EQ(erased, 498u);  // 0 and 500 were already gone
  EXPECT_EQ(shard.objects.size(), 1000u - 3 - 498);
  // Walking the LRU list from the oldest visits exactly the survivors, oldest first.
  std::vector<std::string> walked;
  for (Object* object = shard.lru.oldest; object != nullptr; object = object->newer) {
    walked.emplace_back(object->key());
  }
  std::vector<std::string> expected;
  for (int i = 1; i < 999; i += 2) expected.push_back("k" + std::to_string(i));
  EXPECT_EQ(walked, expected);
  EXPECT_EQ(shard.lru.newest->key(), "k997");
  for (int i = 0; i < 1000; ++i) {
    bool alive = i % 2 == 1 && i != 999;
    EXPECT_EQ(shard.Find(KeyRef(keys[i])) != nullptr, alive) << keys[i];
  }
}

TEST(ShardTest, LruTouchMovesAnObjectToTheNewEnd) {
  Shard shard;
  MutexLock lock(shard.mu);  // what every caller of a Shard holds
  Object* a = shard.Insert(KeyRef("a"), Replicas(1));
  Object* b = shard.Insert(KeyRef("b"), Replicas(1));
  Object* pinned = shard.Insert(KeyRef("p"), Replicas(1));
  shard.Link(a, ObjectList::kLru);
  shard.Link(b, ObjectList::kLru);
  shard.Link(pinned, ObjectList::kNone);
  EXPECT_EQ(shard.lru.oldest, a);
  shard.LruTouch(a, 7);
  EXPECT_EQ(shard.lru.oldest, b);
  EXPECT_EQ(shard.lru.newest, a);
  EXPECT_EQ(a->last_access, 7u);
  shard.LruTouch(pinned, 8);  // not on the LRU list: only the tick changes
  EXPECT_EQ(shard.lru.newest, a);
  EXPECT_EQ(pinned->list, ObjectList::kNone);
}

// The keys on `list`, oldest first.
std::vector<std::string> Walk(Shard& shard, ObjectList list) LARDER_REQUIRES(shard.mu) {
  std::vector<std::string> keys;
  for (Object* object = shard.Ends(list).oldest; object != nullptr; object = object->newer) {
    keys.emplace_back(object->key());
  }
  return keys;
}

TEST(ShardTest, LinkInOrderKeepsTheListOrderedByLastAccess) {
  Shard shard;
  MutexLock lock(shard.mu);  // what every caller of a Shard holds
  for (int tick : {10, 20, 30, 40, 50}) {
    Object* object = shard.Insert(KeyRef("k" + std::to_string(tick)), Replicas(1));
    object->last_access = static_cast<uint64_t>(tick);
    shard.Link(object, ObjectList::kLru);
  }
  // Older than all, newer than all, near the old end, near the new end, equal to one.
  for (int tick : {5, 60, 15, 45, 30}) {
    Object* object = shard.Insert(KeyRef("n" + std::to_string(tick)), Replicas(1));
    object->last_access = static_cast<uint64_t>(tick);
    shard.LinkInOrder(object, ObjectList::kLru);
  }
  EXPECT_EQ(Walk(shard, ObjectList::kLru),
            (std::vector<std::string>{"n5", "k10", "n15", "k20", "k30", "n30", "k40", "n45", "k50",
                                      "n60"}));
  EXPECT_EQ(shard.lru.newest->key(), "n60");
  // Into an empty list, and moved from another list.
  Object* moved = shard.Find(KeyRef("k30"));
  shard.LinkInOrder(moved, ObjectList::kSoftPinned);
  EXPECT_EQ(Walk(shard, ObjectList::kSoftPinned), std::vector<std::string>{"k30"});
  EXPECT_EQ(Walk(shard, ObjectList::kLru).size(), 9u);
}

TEST(ShardTest, SoftPinsMoveObjectsBetweenListsAndExpireInDeadlineOrder) {
  Shard shard;
  MutexLock lock(shard.mu);  // what every caller of a Shard holds
  std::vector<Object*> objects;
  for (int i = 0; i < 4; ++i) {
    Object* object = shard.Insert(KeyRef("k" + std::to_string(i)), Replicas(1));
    object->last_access = static_cast<uint64_t>(i + 1);
    shard.Link(object, ObjectList::kLru);
    objects.push_back(object);
  }
  shard.SetSoftPin(objects[0], 300);
  shard.SetSoftPin(objects[2], 100);
  shard.SetSoftPin(objects[3], 200);
  EXPECT_EQ(Walk(shard, ObjectList::kSoftPinned), (std::vector<std::string>{"k0", "k2", "k3"}));
  EXPECT_EQ(Walk(shard, ObjectList::kLru), std::vector<std::string>{"k1"});
  EXPECT_EQ(shard.SoftPinUntil(objects[2]), 100);
  EXPECT_EQ(shard.SoftPinUntil(objects[1]), 0);
  // A new deadline replaces the old one; unpinning and erasing drop theirs.
  shard.SetSoftPin(objects[2], 400);
  shard.ClearSoftPin(objects[3]);
  shard.Erase(objects[0]);
  EXPECT_EQ(shard.soft_pin_until.size(), 1u);
  EXPECT_EQ(Walk(shard, ObjectList::kLru), (std::vector<std::string>{"k1", "k3"}));
  EXPECT_EQ(shard.ExpireSoftPins(399), 0u);  // the stale entries (100, 200, 300) end nothing
  EXPECT_EQ(shard.ExpireSoftPins(400), 1u);
  EXPECT_TRUE(shard.soft_pin_until.empty());
  EXPECT_EQ(Walk(shard, ObjectList::kLru), (std::vector<std::string>{"k1", "k2", "k3"}));
  // Pins set and dropped many times (the stale entries are compacted away) end nothing.
  for (int i = 0; i < 10000; ++i) {
    shard.SetSoftPin(objects[1], 1000 + i);
    shard.ClearSoftPin(objects[1]);
  }
  EXPECT_EQ(shard.ExpireSoftPins(INT64_MAX), 0u);
}

}  // namespace
}  // namespace larder::master
