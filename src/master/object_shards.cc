// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/object_shards.h"

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
