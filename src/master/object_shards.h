// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

#include <cstdint>
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

// Which of its shard's intrusive lists an object is on.
enum class ObjectList : uint8_t {
  kNone,        // pinned complete objects
  kLru,         // complete, unpinned: eviction candidates, least recently used at the old end
  kProcessing,  // puts in progress, oldest first: the sweeper revokes those past the timeout
};

// One object's metadata. Kept small: the master holds millions of them.
struct Object {
  uint64_t size = 0;
  union {
    int64_t lease_until = 0;  // kComplete: master clock (ns) until which a reader holds a lease
    int64_t put_started;      // kProcessing: master clock (ns) of PutStart
  };
  uint64_t last_access = 0;  // master-wide tick: orders LRU across shards
  uint32_t writer = 0;       // client slot of the writer
  ObjectState state = ObjectState::kProcessing;
  bool pinned = false;
  ObjectList list = ObjectList::kNone;
  std::vector<StoredReplica> replicas;
  const std::string* key = nullptr;  // the map's own key
  Object* newer = nullptr;           // neighbours on `list`
  Object* older = nullptr;
};

// The two ends of one intrusive list of objects.
struct ObjectListEnds {
  Object* newest = nullptr;
  Object* oldest = nullptr;
};

// One lock's worth of objects. Everything in a Shard is guarded by `mu`.
struct Shard {
  std::mutex mu;
  std::unordered_map<std::string, Object> objects;
  ObjectListEnds lru;
  ObjectListEnds processing;

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

}  // namespace larder::master
