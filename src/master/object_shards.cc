// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/object_shards.h"

namespace larder::master {

void Shard::LruPushNewest(Object* object) {
  object->lru_older = lru_newest;
  object->lru_newer = nullptr;
  if (lru_newest != nullptr) lru_newest->lru_newer = object;
  lru_newest = object;
  if (lru_oldest == nullptr) lru_oldest = object;
  object->in_lru = true;
}

void Shard::LruUnlink(Object* object) {
  if (!object->in_lru) return;
  if (object->lru_newer != nullptr) {
    object->lru_newer->lru_older = object->lru_older;
  } else {
    lru_newest = object->lru_older;
  }
  if (object->lru_older != nullptr) {
    object->lru_older->lru_newer = object->lru_newer;
  } else {
    lru_oldest = object->lru_newer;
  }
  object->lru_newer = object->lru_older = nullptr;
  object->in_lru = false;
}

}  // namespace larder::master
