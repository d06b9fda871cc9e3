// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/object_shards.h"

namespace larder::master {

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
