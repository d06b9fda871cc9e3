// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Eviction: least recently used first, across all shards.
//
// Each shard keeps its complete, unpinned objects in LRU order with a master-wide access tick. A
// run works in rounds of two passes. The first pass reads the ticks and sizes of the k oldest
// evictable objects of every shard (k: about as many objects as are still to free, at most
// kPerShard) and finds the tick T below which the globally oldest objects add up to what is still
// to free; since any of the k globally oldest objects is among its own shard's k oldest, the
// objects at or below T are exactly the oldest of the pool. The second pass evicts, in each shard,
// the evictable objects at or below T. An object read or written in between has a newer tick and
// stays; leased, pinned and incomplete objects are never candidates.
//
// Soft-pinned objects are on a list of their own in each shard, in the same LRU order. A run
// evicts from the unpinned lists first; only when nothing there is evictable does it end the soft
// pins past their deadline (the sweeper does too, but a put should not wait for it), evict from
// the unpinned lists again, and then, with MasterOptions::evict_soft_pinned, take soft-pinned
// objects, least recently used first, with the same two passes.
//
// Nothing is copied in the first pass (no keys: only two numbers per candidate), and the second
// looks no further into a shard than the first did, so a put's eviction costs O(shards) lock
// acquisitions and O(shards * k) objects examined, k being a couple more than the evicted
// objects' share per shard. The counters eviction_runs and eviction_scanned,
// and the eviction time histogram, report what it costs.

#include <algorithm>
#include <cmath>

#include "common/logging.h"
#include "common/mutex.h"
#include "master/master_state.h"

namespace larder::master {

namespace {
constexpr size_t kPerShard = 32;
// How far past leased objects a pass looks in one shard.
constexpr size_t kMaxWalk = 4 * kPerShard;
// Rounds in a row that may free nothing (every candidate was used in between) before giving up.
constexpr int kMaxIdleRounds = 4;
}  // namespace

uint64_t MasterState::EvictForPut(uint64_t bytes) {
  SegmentTable::Usage usage = segments_.usage();
  auto slack = static_cast<uint64_t>(static_cast<double>(usage.capacity) *
                                     std::max(0.0, options_.eviction_slack));
  // In whole objects of the mean size: a slack smaller than one object evicts none.
  uint64_t objects = objects_.load(std::memory_order_relaxed);
  uint64_t mean = objects == 0 ? 0 : usage.used / objects;
  if (mean > 0) slack -= slack % mean;
  return Evict(bytes + slack);
}

uint64_t MasterState::Evict(uint64_t bytes) {
  MutexLock evict_lock(evict_mu_);
  const auto started = Clock::now();
  uint64_t scanned = 0, evicted = 0;
  uint64_t freed = EvictFrom(ObjectList::kLru, bytes, &scanned, &evicted);
  if (freed < bytes && ExpireSoftPins(Now()) > 0) {
    freed += EvictFrom(ObjectList::kLru, bytes - freed, &scanned, &evicted);
  }
  if (freed < bytes && options_.evict_soft_pinned) {
    freed += EvictFrom(ObjectList::kSoftPinned, bytes - freed, &scanned, &evicted);
  }
  counters_.evictions.fetch_add(evicted, std::memory_order_relaxed);
  counters_.eviction_runs.fetch_add(1, std::memory_order_relaxed);
  counters_.eviction_scanned.fetch_add(scanned, std::memory_order_relaxed);
  eviction_time_.Observe(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - started).count());
  if (freed > 0) Log().debug("evicted {} bytes in {} objects (asked {})", freed, evicted, bytes);
  return freed;
}

uint64_t MasterState::EvictFrom(ObjectList list, uint64_t bytes, uint64_t* scanned,
                                uint64_t* evicted) {
  struct Candidate {
    uint64_t tick;
    uint64_t bytes;
  };
  uint64_t freed = 0;
  std::vector<Candidate> candidates;
  std::vector<FreedReplica> replicas;
  // Per shard, from pass 1: its oldest candidate's tick (UINT64_MAX: none), and how far the walk
  // went, which is as far as pass 2 needs to look.
  std::vector<uint64_t> oldest_tick(shard_count_);
  std::vector<size_t> walk_length(shard_count_);
  int idle_rounds = 0;
  while (freed < bytes && idle_rounds < kMaxIdleRounds) {
    // About how many objects are still to free, from the mean object size. Taking that many from
    // every shard would make any round exact, however the oldest objects are spread; the hash
    // spreads them evenly, so a couple more than the mean share per shard is enough for one
    // round in the usual case, and exact_below keeps a round exact otherwise.
    uint64_t objects = std::max<uint64_t>(objects_.load(std::memory_order_relaxed), 1);
    uint64_t mean = std::max<uint64_t>(segments_.usage().used / objects, 1);
    uint64_t need = (bytes - freed + mean - 1) / mean;
    uint64_t share = 2 * ((need + shard_count_ - 1) / shard_count_) + 2;
    auto k = static_cast<size_t>(std::clamp<uint64_t>(std::min(need, share), 1, kPerShard));

    // Pass 1: the k oldest evictable objects of each shard.
    int64_t now = Now();
    candidates.clear();
    uint64_t exact_below = UINT64_MAX;  // candidates above this tick may miss older objects
    for (size_t s = 0; s < shard_count_; ++s) {
      Shard& shard = shards_[s];
      size_t taken = 0, walked = 0;
      uint64_t oldest = UINT64_MAX, newest = 0;
      {
        MutexLock lock(shard.mu);
        for (Object* object = shard.Ends(list).oldest;
             object != nullptr && taken < k && walked < kMaxWalk; object = object->newer) {
          ++walked;
          if (object->Leased(now) || (disk_.active() && disk_.JustPromoted(object->key()))) {
            continue;
          }
          candidates.push_back(
              Candidate{object->last_access, object->size * object->replica_count});
          oldest = std::min(oldest, object->last_access);
          newest = std::max(newest, object->last_access);
          ++taken;
        }
        // The walk stopped early: this shard may hold more evictable objects past those taken.
        if (taken == k || walked == kMaxWalk) exact_below = std::min(exact_below, newest);
      }
      oldest_tick[s] = oldest;
      walk_length[s] = walked;
      *scanned += walked;
    }
    if (candidates.empty()) break;

    // The tick at which the oldest candidates add up to what is still to free.
    std::sort(candidates.begin(), candidates.end(),
              [](const Candidate& a, const Candidate& b) { return a.tick < b.tick; });
    uint64_t threshold = candidates.back().tick;
    uint64_t sum = 0;
    for (const Candidate& candidate : candidates) {
      sum += candidate.bytes;
      if (freed + sum >= bytes) {
        threshold = candidate.tick;
        break;
      }
    }
    // Never past a tick where some shard may hold older objects than those taken; at least the
    // oldest candidate goes, so that every round makes progress.
    threshold = std::max(std::min(threshold, exact_below), candidates.front().tick);

    // Pass 2: evict what is at or below the threshold and still evictable, in the shards that had
    // such candidates, no further than pass 1 looked.
    uint64_t freed_this_round = 0;
    now = Now();
    for (size_t s = 0; s < shard_count_ && freed + freed_this_round < bytes; ++s) {
      if (oldest_tick[s] > threshold) continue;
      Shard& shard = shards_[s];
      replicas.clear();
      size_t walked = 0;
      {
        MutexLock lock(shard.mu);
        for (Object* object = shard.Ends(list).oldest;
             object != nullptr && walked < walk_length[s] && freed + freed_this_round < bytes;
             ++walked) {
          Object* next = object->newer;
          if (object->last_access <= threshold && !object->Leased(now) &&
              !(disk_.active() && disk_.JustPromoted(object->key()))) {
            uint64_t object_bytes = object->size * object->replica_count;
            if (disk_.active()) {
              auto& counter = disk_.Has(object->key()) ? disk_.counters().evicted_with_copy
                                                       : disk_.counters().evicted_dropped;
              counter.fetch_add(1, std::memory_order_relaxed);
            }
            LogRemovedLocked(object, &replicas);
            shard.Erase(object);
            objects_.fetch_sub(1, std::memory_order_relaxed);
            freed_this_round += object_bytes;
            ++*evicted;
            counters_.evicted_bytes.fetch_add(object_bytes, std::memory_order_relaxed);
          }
          object = next;
        }
      }
      *scanned += walked;
      FreeReplicas(replicas);
    }
    freed += freed_this_round;
    idle_rounds = freed_this_round == 0 ? idle_rounds + 1 : 0;
  }
  return freed;
}

void MasterState::EvictAboveWatermark() {
  SegmentTable::Usage usage = segments_.usage();
  // Ranges held for their owners come back without evicting anything more.
  usage.used -= std::min(usage.used, feed_.held_bytes());
  double capacity = static_cast<double>(usage.capacity);
  if (usage.capacity == 0 || options_.eviction_high_watermark >= 1.0 ||
      static_cast<double>(usage.used) <= capacity * options_.eviction_high_watermark) {
    return;
  }
  auto target = static_cast<uint64_t>(std::llround(
      capacity * std::max(0.0, options_.eviction_high_watermark - options_.eviction_ratio)));
  if (usage.used > target) Evict(usage.used - target);
}

}  // namespace larder::master
