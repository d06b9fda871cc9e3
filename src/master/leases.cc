// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/leases.h"
#include "common/mutex.h"

#include <algorithm>

namespace larder::master {

LeaseTable::LeaseTable(LeaseId first_id) : next_id_(first_id == 0 ? 1 : first_id) {}

LeaseTable::~LeaseTable() { Clear(); }

void LeaseTable::Drop(const Lease& lease) {
  // The objects of a batch are scattered: start every cache miss before waiting on the first.
  for (Object* object : lease.objects) __builtin_prefetch(&object->holds, 1);
  for (Object* object : lease.objects) Object::DropReader(object);
}

LeaseId LeaseTable::Grant(uint32_t client_slot, int64_t now, int64_t expires,
                          std::vector<Object*> objects) {
  LeaseId id = next_id_.fetch_add(1, std::memory_order_relaxed);
  if (id == 0) id = next_id_.fetch_add(1, std::memory_order_relaxed);  // wrapped: 0 means none
  Shard& shard = ShardOf(id);
  {
    MutexLock lock(shard.mu);
    shard.leases.emplace(id, Lease{client_slot, now, expires, std::move(objects)});
    shard.expiry.emplace_back(expires, id);
  }
  size_.fetch_add(1, std::memory_order_relaxed);
  return id;
}

LeaseTable::ReleaseOutcome LeaseTable::Release(LeaseId id, uint32_t client_slot, int64_t now,
                                               int64_t* held_ns) {
  Shard& shard = ShardOf(id);
  Lease lease;
  {
    MutexLock lock(shard.mu);
    auto it = shard.leases.find(id);
    if (it == shard.leases.end()) return ReleaseOutcome::kUnknown;
    if (it->second.client_slot != client_slot) return ReleaseOutcome::kRefused;
    lease = std::move(it->second);
    shard.leases.erase(it);
  }
  size_.fetch_sub(1, std::memory_order_relaxed);
  *held_ns = now - lease.granted;
  Drop(lease);
  return ReleaseOutcome::kReleased;
}

size_t LeaseTable::Expire(int64_t now) {
  size_t expired = 0;
  std::vector<Lease> ended;
  for (Shard& shard : shards_) {
    {
      MutexLock lock(shard.mu);
      while (!shard.expiry.empty() && shard.expiry.front().first <= now) {
        auto it = shard.leases.find(shard.expiry.front().second);
        shard.expiry.pop_front();
        if (it == shard.leases.end()) continue;  // released before it expired
        ended.push_back(std::move(it->second));
        shard.leases.erase(it);
      }
    }
    for (const Lease& lease : ended) Drop(lease);
    expired += ended.size();
    size_.fetch_sub(ended.size(), std::memory_order_relaxed);
    ended.clear();
  }
  return expired;
}

void LeaseTable::Clear() {
  for (Shard& shard : shards_) {
    absl::flat_hash_map<LeaseId, Lease> leases;
    {
      MutexLock lock(shard.mu);
      leases.swap(shard.leases);
      shard.expiry.clear();
    }
    for (const auto& [id, lease] : leases) Drop(lease);
    size_.fetch_sub(leases.size(), std::memory_order_relaxed);
  }
}

}  // namespace larder::master
