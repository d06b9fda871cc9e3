// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The master's objects, split into shards with one lock each.
//
// An object's metadata, its replicas and its key share one allocation, and each shard indexes its
// objects in an open-addressing hash set of pointers. A lookup costs about three cache misses
// (control bytes, slot, object) where a node-based map of std::string costs five or more, and the
// master's resident memory is about 190 bytes per object with 32-byte keys (`larder-bench
// master`). Keys are looked up as string_view with a hash computed once per key (KeyRef), so no
// request key is ever copied.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "master/segment_table.h"

namespace larder::master {

enum class ObjectState : uint8_t {
  kProcessing,  // PutStart done, replicas being written
  kComplete,    // PutEnd done: readable
};

// Which of its shard's intrusive lists an object is on.
enum class ObjectList : uint8_t {
  kNone,        // hard-pinned complete objects
  kLru,         // complete, unpinned: eviction candidates, least recently used at the old end
  kProcessing,  // puts in progress, oldest first: the sweeper revokes those past the timeout
  kSoftPinned,  // complete, soft-pinned: evicted after every kLru object, in LRU order as kLru
};

// What a put in progress does to its object's soft pin when it ends.
struct StagedSoftPin {
  int64_t ttl = 0;    // > 0: soft-pinned until the put's end + ttl (ns)
  int64_t until = 0;  // with ttl 0: this deadline (master clock, ns), kept from a replaced object
};

// A key and its hash, computed once and used for both the shard and the lookup in it.
struct KeyRef {
  explicit KeyRef(std::string_view k) : key(k), hash(std::hash<std::string_view>{}(k)) {}
  // REQUIRES: h == std::hash<std::string_view>{}(k) (computed before, e.g. to sort keys by it).
  KeyRef(std::string_view k, size_t h) : key(k), hash(h) {}
  std::string_view key;
  size_t hash;
};

// Longest key an object can hold (Object::key_size is 16 bits).
inline constexpr size_t kMaxKeyBytes = UINT16_MAX;

// One object's metadata. Created only by Object::Create, which places the replicas and then the
// key bytes right after the header, in the same allocation.
//
// Lifetime: the shard owns the object while it is indexed; each unreleased read lease holds it
// too (the lease table keeps a pointer). An object leaves its shard by Shard::Erase, which retires
// it, and is destroyed by whichever comes last: the retirement or the drop of its last lease. So a
// lease table may still point at an object that was evicted after its lease expired, or dropped
// with its segment, until that lease is released or expires.
struct Object {
  uint64_t size = 0;
  union {
    // kComplete: master clock (ns) until which the newest lease lasts. Leases are granted with one
    // TTL on a monotonic clock, so the newest lease is also the longest.
    int64_t lease_until = 0;
    int64_t put_started;  // kProcessing: master clock (ns) of PutStart
  };
  uint64_t last_access = 0;  // master-wide tick: orders LRU across shards
  Object* newer = nullptr;   // neighbours on `list`
  Object* older = nullptr;
  uint32_t writer = 0;  // client slot of the writer
  // Unreleased leases on this object, plus kRetired once it has left its shard. Changed without
  // the shard lock (a release touches only this word), so that releasing a batch costs one atomic
  // decrement per key.
  std::atomic<uint32_t> holds{0};
  uint16_t key_size = 0;
  uint16_t replica_count = 0;
  ObjectState state = ObjectState::kProcessing;
  bool pinned = false;
  // Rebuilt from an owner's catalog, not put to this master: another catalog may add a replica
  // beside it, never beside an object whose bytes a writer put here (see RebuildObjects).
  bool restored = false;
  ObjectList list = ObjectList::kNone;

  static constexpr uint32_t kRetired = 1u << 31;

  // REQUIRES: replicas.size() <= UINT16_MAX, key.size() <= kMaxKeyBytes.
  static Object* Create(std::string_view key, std::span<const StoredReplica> replicas);
  static void Destroy(Object* object);

  // Readers holding an unreleased lease (expired or not).
  uint32_t readers() const { return holds.load(std::memory_order_acquire) & ~kRetired; }
  // True while a reader holds a lease that has not expired: the object may not be evicted or
  // removed. A lease that was released no longer counts, however long its TTL.
  bool Leased(int64_t now) const { return readers() != 0 && lease_until > now; }
  // A lease taken on the object. REQUIRES: the object is in its shard and the shard lock is held.
  void AddReader() { holds.fetch_add(1, std::memory_order_acq_rel); }
  // A lease on the object ended (released or expired); destroys it when it was retired and this
  // was its last lease. Needs no lock.
  static void DropReader(Object* object) {
    if (object->holds.fetch_sub(1, std::memory_order_acq_rel) == (kRetired | 1)) Destroy(object);
  }
  // The object has left its shard (under the shard lock); destroys it unless a lease holds it.
  static void Retire(Object* object) {
    if (object->holds.fetch_or(kRetired, std::memory_order_acq_rel) == 0) Destroy(object);
  }

  std::string_view key() const {
    return {reinterpret_cast<const char*>(replica_array() + replica_count), key_size};
  }
  std::span<const StoredReplica> replicas() const { return {replica_array(), replica_count}; }
  std::span<StoredReplica> mutable_replicas() { return {replica_array(), replica_count}; }
  bool HasReplicaOn(PoolSegmentId segment) const {
    for (const StoredReplica& replica : replicas()) {
      if (replica.segment_id == segment) return true;
    }
    return false;
  }
  // Removes the replicas for which `drop(replica)` is true, keeping the others in order. The key
  // is moved down with them, so key() stays valid.
  template <typename Pred>
  void EraseReplicasIf(Pred drop);

 private:
  Object() = default;
  StoredReplica* replica_array() { return reinterpret_cast<StoredReplica*>(this + 1); }
  const StoredReplica* replica_array() const {
    return reinterpret_cast<const StoredReplica*>(this + 1);
  }
};
static_assert(kMaxReplicas <= UINT16_MAX, "Object::replica_count is 16 bits");
static_assert(alignof(StoredReplica) <= alignof(Object));
static_assert(sizeof(Object) % alignof(StoredReplica) == 0);
static_assert(sizeof(Object) <= 56, "the object header is part of every object's footprint");

template <typename Pred>
void Object::EraseReplicasIf(Pred drop) {
  std::string_view old_key = key();
  StoredReplica* all = replica_array();
  uint16_t kept = 0;
  for (uint16_t i = 0; i < replica_count; ++i) {
    if (!drop(all[i])) all[kept++] = all[i];
  }
  if (kept == replica_count) return;
  replica_count = kept;
  // The key follows the replicas: slide it down behind the kept ones (memmove: they may overlap).
  std::memmove(all + kept, old_key.data(), old_key.size());
}

// Hash and equality over Object* that also accept a KeyRef, so that a shard is searched by key
// without building an Object or a std::string.
struct ObjectHash {
  using is_transparent = void;
  size_t operator()(const Object* object) const {
    return std::hash<std::string_view>{}(object->key());
  }
  size_t operator()(const KeyRef& ref) const { return ref.hash; }
};
struct ObjectKeyEq {
  using is_transparent = void;
  bool operator()(const Object* a, const Object* b) const { return a == b; }
  bool operator()(const Object* a, const KeyRef& b) const { return a->key() == b.key; }
  bool operator()(const KeyRef& a, const Object* b) const { return b->key() == a.key; }
};

// The two ends of one intrusive list of objects.
struct ObjectListEnds {
  Object* newest = nullptr;
  Object* oldest = nullptr;
};

// One lock's worth of objects. Everything in a Shard is guarded by `mu` (and the fields of its
// objects, which the analysis cannot name: an object does not know its shard), except each
// object's `holds`. The shard owns its objects: Erase and the destructor retire them
// (Object::Retire).
//
// Soft pins live beside the objects, not in their header (which every object pays for, and
// which is full): a complete soft-pinned object is on the `soft_pinned` list and has its deadline
// in `soft_pin_until`; a put in progress that will soft-pin its object at its end has an entry in
// `staged_soft_pins`. Objects without a soft pin cost nothing there; a soft-pinned one about 40
// bytes (its map slot and its entry in the expiry queue).
struct Shard {
  using ObjectSet = absl::flat_hash_set<Object*, ObjectHash, ObjectKeyEq>;

  Shard() = default;
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;
  ~Shard();

  Mutex mu;
  ObjectSet objects LARDER_GUARDED_BY(mu);
  ObjectListEnds lru LARDER_GUARDED_BY(mu);
  ObjectListEnds processing LARDER_GUARDED_BY(mu);
  ObjectListEnds soft_pinned LARDER_GUARDED_BY(mu);
  // Deadline (master clock, ns) of each object on `soft_pinned`.
  absl::flat_hash_map<Object*, int64_t> soft_pin_until LARDER_GUARDED_BY(mu);
  // Of the puts in progress that will soft-pin their object when they end.
  absl::flat_hash_map<Object*, StagedSoftPin> staged_soft_pins LARDER_GUARDED_BY(mu);
  // Keys whose objects two catalogs reported with different sizes during the master's recovery
  // window: entries for them are refused until it ends (MasterState::MountSegments).
  absl::flat_hash_set<std::string> conflicted_keys LARDER_GUARDED_BY(mu);

  // The object stored under `ref`, or nullptr.
  Object* Find(const KeyRef& ref) const LARDER_REQUIRES(mu) {
    auto it = objects.find(ref);
    return it == objects.end() ? nullptr : *it;
  }
  // Creates and indexes a new object. REQUIRES: Find(ref) == nullptr.
  Object* Insert(const KeyRef& ref, std::span<const StoredReplica> replicas) LARDER_REQUIRES(mu);
  // Takes the object off its list, out of the index and out of the soft-pin tables, and retires
  // it: destroyed now, or when its last lease ends.
  void Erase(Object* object) LARDER_REQUIRES(mu);
  // Erases (as Erase) every object for which `pred(object)` is true; returns how many.
  template <typename Pred>
  size_t EraseIf(Pred pred) LARDER_REQUIRES(mu);

  // Puts `object` at the new end of `list`, taking it off the list it was on.
  void Link(Object* object, ObjectList list) LARDER_REQUIRES(mu);
  // Puts `object` on `list` where its last_access keeps the list ordered by last_access, taking
  // it off the list it was on. Costs the distance to the nearer end of the list.
  void LinkInOrder(Object* object, ObjectList list) LARDER_REQUIRES(mu);
  // Puts each of `sorted` (on no list, in ascending last_access order) on `list` where its
  // last_access keeps the list ordered, in one walk of the list from its old end. Ties go after
  // the objects already there.
  void MergeInOrder(std::span<Object* const> sorted, ObjectList list) LARDER_REQUIRES(mu);
  // Takes `object` off its list, if any.
  void Unlink(Object* object) LARDER_REQUIRES(mu);
  // Replaces a complete object by a copy with `replica` added: same key, size, pins, list
  // position and soft-pin deadline. The old object is retired (as by Erase). Returns the copy.
  // REQUIRES: the object is indexed, complete, has fewer than kMaxReplicas replicas, and no
  // reader holds an unexpired lease on it (a lease holds the old object, not the copy).
  Object* AddReplica(Object* object, const StoredReplica& replica) LARDER_REQUIRES(mu);
  // Marks a use: newest on its LRU list (kLru or kSoftPinned), if it is on one.
  void LruTouch(Object* object, uint64_t tick) LARDER_REQUIRES(mu) {
    object->last_access = tick;
    if (object->list == ObjectList::kLru || object->list == ObjectList::kSoftPinned) {
      Link(object, object->list);
    }
  }
  // The ends of `list`. REQUIRES: list != ObjectList::kNone (which is no list).
  ObjectListEnds& Ends(ObjectList list) LARDER_REQUIRES(mu);

  // Soft-pins the object until `until` (master clock, ns), replacing any earlier deadline, and
  // moves it onto `soft_pinned`. REQUIRES: the object is complete and not hard-pinned.
  void SetSoftPin(Object* object, int64_t until) LARDER_REQUIRES(mu);
  // Ends the object's soft pin, if it has one: it goes back onto the LRU list, in tick order.
  void ClearSoftPin(Object* object) LARDER_REQUIRES(mu);
  // The deadline of the object's soft pin; 0 when it has none.
  int64_t SoftPinUntil(Object* object) const LARDER_REQUIRES(mu) {
    auto it = soft_pin_until.find(object);
    return it == soft_pin_until.end() ? 0 : it->second;
  }
  // Ends (as ClearSoftPin) every soft pin whose deadline is at or before `now`; returns how many.
  size_t ExpireSoftPins(int64_t now) LARDER_REQUIRES(mu);

 private:
  // Drops the object's entries in the soft-pin tables.
  void ForgetSoftPin(Object* object) LARDER_REQUIRES(mu) {
    if (!soft_pin_until.empty()) soft_pin_until.erase(object);
    if (!staged_soft_pins.empty()) staged_soft_pins.erase(object);
  }

  // (deadline, object) of every soft pin set, earliest first. An entry whose object no longer has
  // that deadline in soft_pin_until (unpinned, re-pinned or erased since) is dropped when it comes
  // up; its pointer is only compared, never followed, so a destroyed object's entry is harmless.
  // Rebuilt from soft_pin_until when stale entries outnumber live ones.
  using Deadline = std::pair<int64_t, Object*>;
  std::priority_queue<Deadline, std::vector<Deadline>, std::greater<>> soft_pin_expiry_
      LARDER_GUARDED_BY(mu);
};

template <typename Pred>
size_t Shard::EraseIf(Pred pred) {
  size_t erased = 0;
  for (auto it = objects.begin(); it != objects.end();) {
    Object* object = *it;
    if (!pred(object)) {
      ++it;
      continue;
    }
    Unlink(object);
    ForgetSoftPin(object);
    objects.erase(it++);  // erasing leaves the other iterators of a flat_hash_set valid
    Object::Retire(object);
    ++erased;
  }
  return erased;
}

}  // namespace larder::master
