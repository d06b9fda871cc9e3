// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Read leases: what keeps an object's bytes in place while a reader copies them.
//
// A BatchGetReplicas call takes one lease on every object it returns, all under one lease id.
// The reader releases the id when its copy has ended, so a lease lives about as long as the copy;
// the TTL ends leases that are never released (a reader that died or stalled mid-copy). Each
// object counts its unreleased leases (Object::holds), so any number of readers may hold one
// object, and it becomes evictable when the last of them releases or every lease on it expired.
#pragma once

#include <absl/container/flat_hash_map.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <vector>

#include "common/mutex.h"
#include "master/latency_histogram.h"
#include "master/object_shards.h"

namespace larder::master {

using LeaseId = uint64_t;

// The leases that have been granted and neither released nor expired. Sharded by lease id, one
// mutex per shard; no method takes a metadata shard lock.
//
// Thread-safe.
class LeaseTable {
 public:
  enum class ReleaseOutcome {
    kReleased,
    kUnknown,  // never granted by this master, already released, or expired: nothing to do
    kRefused,  // granted to another client: left in place
  };

  // Ids start at `first_id` (a random number per master incarnation, so that an id from an earlier
  // master is not mistaken for a new one) and are never 0.
  explicit LeaseTable(LeaseId first_id);
  // Ends every lease (as Clear does).
  ~LeaseTable();
  LeaseTable(const LeaseTable&) = delete;
  LeaseTable& operator=(const LeaseTable&) = delete;

  // Records a lease of `client_slot` on `objects`, each of which has already counted it
  // (Object::AddReader). REQUIRES: objects is not empty.
  LeaseId Grant(uint32_t client_slot, int64_t now, int64_t expires, std::vector<Object*> objects);

  // Ends lease `id` when `client_slot` holds it. With kReleased, *held_ns is how long it was held.
  ReleaseOutcome Release(LeaseId id, uint32_t client_slot, int64_t now, int64_t* held_ns);

  // Ends every lease that expired by `now`; returns how many.
  size_t Expire(int64_t now);

  // Ends every lease.
  void Clear();

  // Leases granted and not yet ended.
  uint64_t size() const { return size_.load(std::memory_order_relaxed); }

 private:
  struct Lease {
    uint32_t client_slot = 0;
    int64_t granted = 0;
    int64_t expires = 0;
    std::vector<Object*> objects;
  };
  struct Shard {
    Mutex mu;
    absl::flat_hash_map<LeaseId, Lease> leases LARDER_GUARDED_BY(mu);
    // (expires, id) in grant order; leases share one TTL, so this is also expiry order. Entries
    // of leases released since are skipped when reached.
    std::deque<std::pair<int64_t, LeaseId>> expiry LARDER_GUARDED_BY(mu);
  };
  static constexpr size_t kShards = 16;

  Shard& ShardOf(LeaseId id) { return shards_[id % kShards]; }
  static void Drop(const Lease& lease);

  std::atomic<LeaseId> next_id_;
  std::atomic<uint64_t> size_{0};
  std::array<Shard, kShards> shards_;
};

}  // namespace larder::master
