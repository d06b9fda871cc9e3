// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/object_shards.h"

#include <absl/container/inlined_vector.h>

#include <new>

namespace larder::master {

Object* Object::Create(std::string_view key, std::span<const StoredReplica> replicas) {
  size_t bytes = sizeof(Object) + replicas.size() * sizeof(StoredReplica) + key.size();
  Object* object = new (::operator new(bytes)) Object();
  object->key_size = static_cast<uint16_t>(key.size());
  object->replica_count = static_cast<uint16_t>(replicas.size());
  StoredReplica* array = object->replica_array();
  for (size_t i = 0; i < replicas.size(); ++i) new (array + i) StoredReplica(replicas[i]);
  std::memcpy(array + replicas.size(), key.data(), key.size());
  return object;
}

void Object::Destroy(Object* object) {
  object->~Object();
  ::operator delete(object);
}

Shard::~Shard() {
  for (Object* object : objects) Object::Retire(object);
}

Object* Shard::Insert(const KeyRef& ref, std::span<const StoredReplica> replicas) {
  Object* object = Object::Create(ref.key, replicas);
  objects.insert(object);
  return object;
}

void Shard::Erase(Object* object) {
  Unlink(object);
  ForgetSoftPin(object);
  objects.erase(object);
  Object::Retire(object);
}

void Shard::Link(Object* object, ObjectList list) {
  Unlink(object);
  if (list == ObjectList::kNone) return;
  ObjectListEnds& ends = Ends(list);
  object->older = ends.newest;
  object->newer = nullptr;
  if (ends.newest != nullptr) ends.newest->newer = object;
  ends.newest = object;
  if (ends.oldest == nullptr) ends.oldest = object;
  object->list = list;
}

ObjectListEnds& Shard::Ends(ObjectList list) {
  switch (list) {
    case ObjectList::kLru:
      return lru;
    case ObjectList::kSoftPinned:
      return soft_pinned;
    case ObjectList::kProcessing:
    case ObjectList::kNone:
      break;
  }
  return processing;
}

void Shard::LinkInOrder(Object* object, ObjectList list) {
  Unlink(object);
  if (list == ObjectList::kNone) return;
  ObjectListEnds& ends = Ends(list);
  const uint64_t tick = object->last_access;
  // The object goes right after the newest object not newer than it (nullptr: at the old end).
  // Both ends are searched at once: a recently used object is found near the new end, a long
  // unused one near the old end. The two walks take the same number of steps, so while the one
  // from the new end has not run off the list, neither has the one from the old end.
  Object* after = nullptr;
  for (Object *from_new = ends.newest, *from_old = ends.oldest; from_new != nullptr;
       from_new = from_new->older, from_old = from_old->newer) {
    if (from_new->last_access <= tick) {
      after = from_new;
      break;
    }
    if (from_old->last_access > tick) {
      after = from_old->older;
      break;
    }
  }
  object->list = list;
  object->older = after;
  object->newer = after == nullptr ? ends.oldest : after->newer;
  if (object->older != nullptr) {
    object->older->newer = object;
  } else {
    ends.oldest = object;
  }
  if (object->newer != nullptr) {
    object->newer->older = object;
  } else {
    ends.newest = object;
  }
}

void Shard::MergeInOrder(std::span<Object* const> sorted, ObjectList list) {
  if (list == ObjectList::kNone) return;
  ObjectListEnds& ends = Ends(list);
  Object* next = ends.oldest;  // the oldest object on the list newer than the one to place
  for (Object* object : sorted) {
    while (next != nullptr && next->last_access <= object->last_access) next = next->newer;
    object->list = list;
    object->newer = next;
    object->older = next == nullptr ? ends.newest : next->older;
    if (object->older != nullptr) {
      object->older->newer = object;
    } else {
      ends.oldest = object;
    }
    if (next != nullptr) {
      next->older = object;
    } else {
      ends.newest = object;
    }
  }
}

Object* Shard::AddReplica(Object* object, const StoredReplica& replica) {
  absl::InlinedVector<StoredReplica, 4> replicas(object->replicas().begin(),
                                                 object->replicas().end());
  replicas.push_back(replica);
  Object* copy = Object::Create(object->key(), replicas);
  copy->size = object->size;
  copy->lease_until = object->lease_until;
  copy->last_access = object->last_access;
  copy->writer = object->writer;
  copy->state = object->state;
  copy->pinned = object->pinned;
  if (object->list != ObjectList::kNone) {
    // The copy takes the object's place on its list.
    ObjectListEnds& ends = Ends(object->list);
    copy->list = object->list;
    copy->newer = object->newer;
    copy->older = object->older;
    if (copy->newer != nullptr) {
      copy->newer->older = copy;
    } else {
      ends.newest = copy;
    }
    if (copy->older != nullptr) {
      copy->older->newer = copy;
    } else {
      ends.oldest = copy;
    }
    object->newer = object->older = nullptr;
    object->list = ObjectList::kNone;
  }
  const int64_t soft_pin_until = SoftPinUntil(object);
  ForgetSoftPin(object);
  objects.erase(object);
  objects.insert(copy);
  if (soft_pin_until != 0) SetSoftPin(copy, soft_pin_until);
  Object::Retire(object);
  return copy;
}

void Shard::SetSoftPin(Object* object, int64_t until) {
  soft_pin_until[object] = until;
  soft_pin_expiry_.emplace(until, object);
  if (soft_pin_expiry_.size() > 2 * soft_pin_until.size() + 64) {
    std::vector<Deadline> live;
    live.reserve(soft_pin_until.size());
    for (const auto& [pinned, deadline] : soft_pin_until) live.emplace_back(deadline, pinned);
    soft_pin_expiry_ = decltype(soft_pin_expiry_)(std::greater<>(), std::move(live));
  }
  if (object->list != ObjectList::kSoftPinned) LinkInOrder(object, ObjectList::kSoftPinned);
}

void Shard::ClearSoftPin(Object* object) {
  if (soft_pin_until.erase(object) == 0) return;
  LinkInOrder(object, ObjectList::kLru);
}

size_t Shard::ExpireSoftPins(int64_t now) {
  size_t expired = 0;
  while (!soft_pin_expiry_.empty() && soft_pin_expiry_.top().first <= now) {
    auto [deadline, object] = soft_pin_expiry_.top();
    soft_pin_expiry_.pop();
    auto it = soft_pin_until.find(object);
    if (it == soft_pin_until.end() || it->second != deadline) continue;  // a stale entry
    soft_pin_until.erase(it);
    LinkInOrder(object, ObjectList::kLru);
    ++expired;
  }
  return expired;
}

void Shard::Unlink(Object* object) {
  if (object->list == ObjectList::kNone) return;
  ObjectListEnds& ends = Ends(object->list);
  if (object->newer != nullptr) {
    object->newer->older = object->older;
  } else {
    ends.newest = object->older;
  }
  if (object->older != nullptr) {
    object->older->newer = object->newer;
  } else {
    ends.oldest = object->newer;
  }
  object->newer = object->older = nullptr;
  object->list = ObjectList::kNone;
}

}  // namespace larder::master
