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

#include <absl/container/flat_hash_set.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <string_view>

#include "master/segment_table.h"

namespace larder::master {

enum class ObjectState : uint8_t {
  kProcessing,  // PutStart done, replicas being written
  kComplete,    // PutEnd done: readable
};

// Which of its shard's intrusive lists an object is on.
enum class ObjectList : uint8_t {
  kNone,        // pinned complete objects
  kLru,         // complete, unpinned: eviction candidates, least recently used at the old end
  kProcessing,  // puts in progress, oldest first: the sweeper revokes those past the timeout
};

// A key and its hash, computed once and used for both the shard and the lookup in it.
struct KeyRef {
  explicit KeyRef(std::string_view k) : key(k), hash(std::hash<std::string_view>{}(k)) {}
  std::string_view key;
  size_t hash;
};

// One object's metadata. Created only by Object::Create, which places the replicas and then the
// key bytes right after the header, in the same allocation; destroyed by Object::Destroy.
struct Object {
  uint64_t size = 0;
  union {
    int64_t lease_until = 0;  // kComplete: master clock (ns) until which a reader holds a lease
    int64_t put_started;      // kProcessing: master clock (ns) of PutStart
  };
  uint64_t last_access = 0;  // master-wide tick: orders LRU across shards
  Object* newer = nullptr;   // neighbours on `list`
  Object* older = nullptr;
  uint32_t writer = 0;  // client slot of the writer
  uint32_t key_size = 0;
  uint16_t replica_count = 0;
  ObjectState state = ObjectState::kProcessing;
  bool pinned = false;
  ObjectList list = ObjectList::kNone;

  // REQUIRES: replicas.size() <= UINT16_MAX, key.size() <= UINT32_MAX.
  static Object* Create(std::string_view key, std::span<const StoredReplica> replicas);
  static void Destroy(Object* object);

  std::string_view key() const {
    return {reinterpret_cast<const char*>(replica_array() + replica_count), key_size};
  }
  std::span<const StoredReplica> replicas() const { return {replica_array(), replica_count}; }
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

// One lock's worth of objects. Everything in a Shard is guarded by `mu`. The shard owns its
// objects: Erase and the destructor destroy them.
struct Shard {
  using ObjectSet = absl::flat_hash_set<Object*, ObjectHash, ObjectKeyEq>;

  Shard() = default;
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;
  ~Shard();

  std::mutex mu;
  ObjectSet objects;
  ObjectListEnds lru;
  ObjectListEnds processing;

  // The object stored under `ref`, or nullptr.
  Object* Find(const KeyRef& ref) const {
    auto it = objects.find(ref);
    return it == objects.end() ? nullptr : *it;
  }
  // Creates and indexes a new object. REQUIRES: Find(ref) == nullptr.
  Object* Insert(const KeyRef& ref, std::span<const StoredReplica> replicas);
  // Takes the object off its list and out of the index, and destroys it.
  void Erase(Object* object);
  // Erases (as Erase) every object for which `pred(object)` is true; returns how many.
  template <typename Pred>
  size_t EraseIf(Pred pred);

  // Puts `object` at the new end of `list`, taking it off the list it was on.
  void Link(Object* object, ObjectList list);
  // Takes `object` off its list, if any.
  void Unlink(Object* object);
  // Marks a use: newest on the LRU list, if it is on it.
  void LruTouch(Object* object, uint64_t tick) {
    object->last_access = tick;
    if (object->list == ObjectList::kLru) Link(object, ObjectList::kLru);
  }

 private:
  ObjectListEnds& Ends(ObjectList list) { return list == ObjectList::kLru ? lru : processing; }
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
    objects.erase(it++);  // erasing leaves the other iterators of a flat_hash_set valid
    Object::Destroy(object);
    ++erased;
  }
  return erased;
}

}  // namespace larder::master
