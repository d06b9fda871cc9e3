// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Eviction: least recently used first, across all shards.
//
// Each shard keeps its complete, unpinned objects in LRU order with a master-wide access tick.
// A round takes up to kPerShard evictable candidates from the old end of every shard and evicts
// the globally oldest of them; since any of the kPerShard globally oldest objects is among its
// own shard's kPerShard oldest, each round's choice is exact LRU (objects leased or pinned are
// skipped, never evicted).

#include <algorithm>
#include <cmath>

#include "common/logging.h"
#include "master/master_state.h"

namespace larder::master {

namespace {
constexpr size_t kPerShard = 32;
// How far past leased objects a round looks in one shard before giving up on it.
constexpr size_t kMaxWalk = 4 * kPerShard;
}  // namespace

uint64_t MasterState::Evict(uint64_t bytes) {
  std::lock_guard evict_lock(evict_mu_);
  struct Candidate {
    uint64_t tick;
    uint64_t bytes;
    size_t shard;
    std::string key;
  };
  uint64_t freed = 0;
  std::vector<Candidate> candidates;
  std::vector<StoredReplica> replicas;
  while (freed < bytes) {
    int64_t now = Now();
    candidates.clear();
    for (size_t s = 0; s < shard_count_; ++s) {
      Shard& shard = shards_[s];
      std::lock_guard lock(shard.mu);
      size_t taken = 0;
      size_t walked = 0;
      for (Object* object = shard.lru.oldest;
           object != nullptr && taken < kPerShard && walked < kMaxWalk;
           object = object->newer, ++walked) {
        if (object->lease_until > now) continue;
        candidates.push_back(Candidate{object->last_access, object->size * object->replica_count, s,
                                       std::string(object->key())});
        ++taken;
      }
    }
    if (candidates.empty()) break;
    std::sort(candidates.begin(), candidates.end(),
              [](const Candidate& a, const Candidate& b) { return a.tick < b.tick; });
    size_t evicted_this_round = 0;
    for (size_t i = 0; i < candidates.size() && i < kPerShard && freed < bytes; ++i) {
      const Candidate& candidate = candidates[i];
      Shard& shard = shards_[candidate.shard];
      {
        std::lock_guard lock(shard.mu);
        Object* object = shard.Find(KeyRef(candidate.key));
        // Re-check: a reader may have leased or touched it since the scan.
        if (object == nullptr || object->list != ObjectList::kLru ||
            object->last_access != candidate.tick || object->lease_until > Now()) {
          continue;
        }
        replicas = EraseLocked(shard, object);
      }
      segments_.Free(replicas);
      freed += candidate.bytes;
      ++evicted_this_round;
      counters_.evictions.fetch_add(1, std::memory_order_relaxed);
      counters_.evicted_bytes.fetch_add(candidate.bytes, std::memory_order_relaxed);
    }
    if (evicted_this_round == 0) {
      // Everything found was touched in between; scan again unless nothing is left to find.
      bool any_evictable = false;
      for (const Candidate& candidate : candidates) {
        Shard& shard = shards_[candidate.shard];
        std::lock_guard lock(shard.mu);
        Object* object = shard.Find(KeyRef(candidate.key));
        if (object != nullptr && object->list == ObjectList::kLru && object->lease_until <= Now()) {
          any_evictable = true;
          break;
        }
      }
      if (!any_evictable) break;
    }
  }
  if (freed > 0) Log().debug("evicted {} bytes (asked {})", freed, bytes);
  return freed;
}

void MasterState::EvictAboveWatermark() {
  SegmentTable::Usage usage = segments_.usage();
  double capacity = static_cast<double>(usage.capacity);
  if (usage.capacity == 0 ||
      static_cast<double>(usage.used) <= capacity * options_.eviction_high_watermark) {
    return;
  }
  auto target = static_cast<uint64_t>(std::llround(
      capacity * std::max(0.0, options_.eviction_high_watermark - options_.eviction_ratio)));
  if (usage.used > target) Evict(usage.used - target);
}

}  // namespace larder::master
