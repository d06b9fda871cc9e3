// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Demotion to the disk tier: the sweeper queues, ahead of eviction, the least recently used objects
// whose memory replica is on a disk holder's host (disk_tier.h).

#include <algorithm>
#include <unordered_map>

#include "common/logging.h"
#include "master/master_state.h"

namespace larder::master {

namespace {
// Puts and polls have objects to demote looked for at most this often: a pool that puts turn
// over quickly needs its next demotions chosen long before the next sweep interval.
constexpr std::chrono::milliseconds kDemoteScheduleInterval{2};
// Objects one sweep looks at per shard, oldest first.
constexpr size_t kMinDemoteWalk = 16;
constexpr size_t kMaxDemoteWalk = 1024;
}  // namespace

Result<std::string> MasterState::ClientHostId(const std::string& client_id) {
  LARDER_ASSIGN_OR_RETURN(ClientRecord client, LookupClient(client_id));
  return client.host_id;
}

void MasterState::MarkReplaced(const std::string& client_id) {
  uint32_t slot = 0;
  {
    MutexLock lock(clients_mu_);
    auto it = clients_.find(client_id);
    if (it == clients_.end() || it->second.replaced) return;
    it->second.replaced = true;
    slot = it->second.slot;
  }
  // Not under clients_mu_ (the segment table's lock is never taken under it). A heartbeat in
  // between may clear the mark before it is set: the client then waits for its next one.
  segments_.SetOwnerReplaced(slot, true);
  Log().info("client {}: its disk was taken over; no puts into its segments until it heartbeats",
             client_id);
}

bool MasterState::DemoteNow(std::string_view key) {
  PoolSegmentId segment = 0;
  {
    KeyRef ref(key);
    Shard& shard = ShardFor(ref);
    MutexLock lock(shard.mu);
    const Object* object = shard.Find(ref);
    if (object == nullptr || object->state != ObjectState::kComplete ||
        object->replica_count == 0) {
      return false;
    }
    segment = object->replicas()[0].segment_id;
  }
  const PoolSegmentId ids[] = {segment};
  const std::vector<SegmentView> views = segments_.List(ids);
  if (views.empty()) return false;
  return disk_.QueueDemote(views[0].host_id, views[0].client_id, key);
}

bool MasterState::HasObject(std::string_view key) const {
  KeyRef ref(key);
  Shard& shard = ShardFor(ref);
  MutexLock lock(shard.mu);
  return shard.Find(ref) != nullptr;
}

void MasterState::KickDemotions() {
  if (!disk_.active() || options_.disk.demote_watermark >= 1.0) return;
  if (demotion_kicked_.exchange(true, std::memory_order_acq_rel)) return;  // a kick is pending
  MutexLock lock(demotion_mu_);
  demotion_cv_.SignalAll();
}

void MasterState::DemotionLoop() {
  MutexLock lock(demotion_mu_);
  while (!demotion_stopping_) {
    // Woken by a kick, else once a sweep interval.
    const auto deadline = std::chrono::steady_clock::now() + options_.sweep_interval;
    while (!demotion_stopping_ && !demotion_kicked_.load(std::memory_order_acquire) &&
           demotion_cv_.WaitUntil(lock, deadline)) {
    }
    if (demotion_stopping_) break;
    demotion_kicked_.store(false, std::memory_order_release);
    lock.Unlock();
    ScheduleDemotions();
    lock.Lock();
    // At most once every kDemoteScheduleInterval, however many puts kick.
    const auto rest = std::chrono::steady_clock::now() + kDemoteScheduleInterval;
    while (!demotion_stopping_ && demotion_cv_.WaitUntil(lock, rest)) {
    }
  }
}

void MasterState::ScheduleDemotions() {
  if (!disk_.active() || options_.disk.demote_watermark >= 1.0) return;
  SegmentTable::Usage usage = segments_.usage();
  const double capacity = static_cast<double>(usage.capacity);
  if (usage.capacity == 0 ||
      static_cast<double>(usage.used) < capacity * options_.disk.demote_watermark) {
    return;
  }
  // The objects to have on disk before eviction needs their memory: the oldest ones, every byte
  // above the watermark. A pool that is full (puts evict as they go) then keeps its older part on
  // disk, so that eviction, which takes the oldest, finds demoted objects even when puts turn
  // the pool over faster than one demotion's round trip.
  const auto want = static_cast<uint64_t>(static_cast<double>(usage.used) -
                                          capacity * options_.disk.demote_watermark) +
                    usage.capacity / 100;
  // Objects looked at per shard: about twice a shard's share of `want`.
  const uint64_t objects = std::max<uint64_t>(objects_.load(std::memory_order_relaxed), 1);
  const uint64_t mean = std::max<uint64_t>(usage.used / objects, 1);
  const size_t walk =
      std::clamp<size_t>(2 * (want / mean) / shard_count_ + 1, kMinDemoteWalk, kMaxDemoteWalk);
  struct Owner {
    std::string host_id;
    std::string client_id;
  };
  std::unordered_map<PoolSegmentId, Owner> hosts;  // segments on a host with a holder
  for (const SegmentView& view : segments_.List({})) {
    if (disk_.HasHolderOn(view.host_id)) {
      hosts.emplace(view.segment_id, Owner{view.host_id, view.client_id});
    }
  }
  if (hosts.empty()) return;
  struct Candidate {
    uint64_t tick;
    uint64_t size;
    std::string key;
    PoolSegmentId segment;
  };
  std::vector<Candidate> candidates;
  for (size_t s = 0; s < shard_count_; ++s) {
    Shard& shard = shards_[s];
    MutexLock lock(shard.mu);
    size_t walked = 0;
    for (Object* object = shard.Ends(ObjectList::kLru).oldest; object != nullptr && walked < walk;
         object = object->newer, ++walked) {
      if (object->state != ObjectState::kComplete || object->pinned) continue;
      for (const StoredReplica& replica : object->replicas()) {
        if (hosts.contains(replica.segment_id)) {
          candidates.push_back(Candidate{object->last_access, object->size,
                                         std::string(object->key()), replica.segment_id});
          break;
        }
      }
    }
  }
  std::sort(candidates.begin(), candidates.end(),
            [](const Candidate& a, const Candidate& b) { return a.tick < b.tick; });
  uint64_t covered = 0;
  for (const Candidate& candidate : candidates) {
    if (covered >= want) break;
    if (disk_.Has(candidate.key) || disk_.Pending(candidate.key)) {
      covered += candidate.size;  // on its way to disk, or there already
      continue;
    }
    const Owner& owner = hosts[candidate.segment];
    if (disk_.QueueDemote(owner.host_id, owner.client_id, candidate.key)) {
      covered += candidate.size;
    }
  }
}

}  // namespace larder::master
