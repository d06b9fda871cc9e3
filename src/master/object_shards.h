// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "master/segment_table.h"

namespace larder::master {

enum class ObjectState : uint8_t {
  kProcessing,  // PutStart done, replicas being written
  kComplete,    // PutEnd done: readable
};

// One object's metadata. Kept small: the master holds millions of them.
struct Object {
  uint64_t size = 0;
  int64_t lease_until = 0;   // master clock, ns; readers hold a lease until then
  int64_t put_started = 0;   // master clock, ns
  uint64_t last_access = 0;  // master-wide tick: orders LRU across shards
  uint32_t writer = 0;       // client slot of the writer
  ObjectState state = ObjectState::kProcessing;
  bool pinned = false;
  bool in_lru = false;
  std::vector<StoredReplica> replicas;
  const std::string* key = nullptr;  // the map's own key
  Object* lru_newer = nullptr;
  Object* lru_older = nullptr;
};

// A put waiting for PutEnd; the sweeper revokes it at `deadline`.
struct PendingPut {
  int64_t deadline = 0;
  int64_t put_started = 0;
  std::string key;
};

// One lock's worth of objects, with its own LRU list of complete, unpinned objects.
// Everything in a Shard is guarded by `mu`.
struct Shard {
  std::mutex mu;
  std::unordered_map<std::string, Object> objects;
  Object* lru_newest = nullptr;
  Object* lru_oldest = nullptr;
  std::deque<PendingPut> pending_puts;

  // Inserts `object` as the newest entry. REQUIRES: not in the list.
  void LruPushNewest(Object* object);
  // Removes `object` if it is in the list.
  void LruUnlink(Object* object);
  void LruTouch(Object* object, uint64_t tick) {
    object->last_access = tick;
    if (object->in_lru) {
      LruUnlink(object);
      LruPushNewest(object);
    }
  }
};

}  // namespace larder::master
