// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Liveness and cleanup: expired clients, leases and soft pins, timed-out puts, quarantined ranges.

#include <algorithm>

#include "common/logging.h"
#include "common/mutex.h"
#include "master/master_state.h"

namespace larder::master {

namespace {
int64_t ToNanos(std::chrono::milliseconds d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}
}  // namespace

void MasterState::RunMaintenance() {
  int64_t now = Now();
  ForgiveStall(now);
  ExpireClients(now);
  ExpireLeases(now);
  ExpireSoftPins(now);
  RevokeTimedOutPuts(now);
  ReleaseQuarantine(now);
  EvictAboveWatermark();
  disk_.Sweep();
  EndRecoveryWindow(now);
  SampleRates(now);
}

// Clients heartbeat every client_ttl / 3. When the master itself did not run for longer than that
// (SIGSTOP, swap, a starved host), their silence is its own: without this, a master paused for a
// TTL expires every client at once when it resumes, and drops every object with them.
void MasterState::ForgiveStall(int64_t now) {
  int64_t stalled;
  {
    MutexLock lock(sweep_mu_);
    stalled = now - last_sweep_;
    last_sweep_ = now;
  }
  if (stalled <= ToNanos(options_.client_ttl) / 3 + ToNanos(options_.sweep_interval)) return;
  size_t clients;
  {
    MutexLock lock(clients_mu_);
    for (auto& [client_id, record] : clients_) record.last_seen = std::max(record.last_seen, now);
    clients = clients_.size();
  }
  Log().warn("master stalled for {} ms: every client gets a fresh TTL ({} client(s))",
             stalled / 1'000'000, clients);
}

void MasterState::SampleRates(int64_t now) {
  constexpr int64_t kWindow = 10'000'000'000;  // 10 s
  constexpr size_t kMaxTickSamples = 4096;
  MutexLock lock(rate_mu_);
  eviction_samples_.emplace_back(now, counters_.evictions.load(std::memory_order_relaxed));
  while (eviction_samples_.size() > 2 && eviction_samples_.front().first < now - kWindow) {
    eviction_samples_.pop_front();
  }
  const uint64_t tick = tick_.load(std::memory_order_relaxed);
  if (!tick_samples_.empty() && tick_samples_.back().second == tick) return;
  if (tick_samples_.size() == kMaxTickSamples) {
    // Every other sample of the older half goes: recent times keep a sweep's resolution.
    size_t kept = 0;
    for (size_t i = 0; i < tick_samples_.size(); ++i) {
      if (i < kMaxTickSamples / 2 && i % 2 == 1) continue;
      tick_samples_[kept++] = tick_samples_[i];
    }
    tick_samples_.resize(kept);
  }
  tick_samples_.emplace_back(now, tick);
}

std::optional<uint64_t> MasterState::TickAtOrBefore(int64_t time) const {
  MutexLock lock(rate_mu_);
  auto after = std::upper_bound(
      tick_samples_.begin(), tick_samples_.end(), time,
      [](int64_t t, const std::pair<int64_t, uint64_t>& sample) { return t < sample.first; });
  if (after == tick_samples_.begin()) return std::nullopt;
  return std::prev(after)->second;
}

std::vector<ClientView> MasterState::ListClients() const {
  const int64_t now = Now();
  std::vector<ClientView> clients;
  {
    MutexLock lock(clients_mu_);
    clients.reserve(clients_.size());
    for (const auto& [client_id, record] : clients_) {
      clients.push_back(ClientView{client_id, record.host_id, record.pid,
                                   std::max<int64_t>(0, now - record.last_seen) / 1'000'000});
    }
    const int64_t kept = ToNanos(kExpiredClientsKept);
    for (const ExpiredClient& expired : expired_clients_) {
      if (now - expired.expired_at > kept) continue;
      clients.push_back(ClientView{expired.client_id, expired.host_id, expired.pid,
                                   std::max<int64_t>(0, now - expired.last_seen) / 1'000'000,
                                   /*alive=*/false});
    }
  }
  std::sort(clients.begin(), clients.end(),
            [](const ClientView& a, const ClientView& b) { return a.client_id < b.client_id; });
  return clients;
}

void MasterState::ExpireClients(int64_t now) {
  int64_t ttl = std::chrono::duration_cast<std::chrono::nanoseconds>(options_.client_ttl).count();
  std::vector<std::pair<std::string, uint32_t>> expired;
  std::vector<int64_t> limits;  // per expired client: the silence it was allowed (ns)
  {
    MutexLock lock(clients_mu_);
    for (auto it = clients_.begin(); it != clients_.end();) {
      // A client whose disk a new process took over (MarkReplaced) goes once it missed about
      // three heartbeats (clients beat at least every third of the TTL).
      const int64_t limit = it->second.replaced ? ttl / 3 : ttl;
      if (now - it->second.last_seen > limit) {
        expired.emplace_back(it->first, it->second.slot);
        limits.push_back(limit);
        expired_clients_.push_back(
            {it->first, it->second.host_id, it->second.pid, it->second.last_seen, now});
        it = clients_.erase(it);
      } else {
        ++it;
      }
    }
    const int64_t kept = ToNanos(kExpiredClientsKept);
    while (!expired_clients_.empty() && (expired_clients_.size() > kMaxExpiredClientsShown ||
                                         now - expired_clients_.front().expired_at > kept)) {
      expired_clients_.pop_front();
    }
    // A claim not renewed for two TTLs was given up (its client mounted elsewhere, or left).
    std::erase_if(claims_, [&](const auto& entry) { return now - entry.second.since > 2 * ttl; });
  }
  for (size_t e = 0; e < expired.size(); ++e) {
    const auto& [client_id, slot] = expired[e];
    std::vector<PoolSegmentId> segments = segments_.SegmentsOf(slot);
    for (PoolSegmentId id : segments) segments_.Unmount(id, slot).IgnoreError();
    DropSegments(segments, slot);
    ForgetTraffic(client_id);
    disk_.ClientGone(client_id);
    counters_.client_expiries.fetch_add(1, std::memory_order_relaxed);
    Log().warn("client {} silent for over {} ms: expired, {} segment(s) unmounted", client_id,
               limits[e] / 1'000'000, segments.size());
  }
}

// Leases never released: their reader died, stalled or lost the master mid-copy. They count as
// held for the whole TTL.
void MasterState::ExpireLeases(int64_t now) {
  size_t expired = leases_.Expire(now);
  if (expired == 0) return;
  counters_.lease_expiries.fetch_add(expired, std::memory_order_relaxed);
  lease_hold_.Observe(ToNanos(options_.lease_ttl), expired);
}

size_t MasterState::ExpireSoftPins(int64_t now) {
  size_t expired = 0;
  for (size_t s = 0; s < shard_count_; ++s) {
    MutexLock lock(shards_[s].mu);
    expired += shards_[s].ExpireSoftPins(now);
  }
  return expired;
}

void MasterState::DropSegments(std::span<const PoolSegmentId> segments, uint32_t writer_slot) {
  if (!segments.empty()) segments_version_.fetch_add(1);
  for (PoolSegmentId id : segments) feed_.RemoveSegment(id);
  auto dropped = [&](const StoredReplica& replica) {
    return std::find(segments.begin(), segments.end(), replica.segment_id) != segments.end();
  };
  uint64_t lost = 0;
  for (size_t s = 0; s < shard_count_; ++s) {
    Shard& shard = shards_[s];
    std::vector<FreedReplica> quarantined;
    {
      MutexLock lock(shard.mu);
      size_t erased = shard.EraseIf([&](Object* object) {
        object->EraseReplicasIf(dropped);
        bool revoke = writer_slot != 0 && object->writer == writer_slot &&
                      object->state == ObjectState::kProcessing;
        if (object->replica_count > 0 && !revoke) return false;
        // From the catalogs of the replicas left, if any. A dead writer may still have bytes in
        // flight into the surviving ranges: they are quarantined.
        LogRemovedLocked(object, &quarantined);
        return true;
      });
      objects_.fetch_sub(erased, std::memory_order_relaxed);
      lost += erased;
    }
    if (!quarantined.empty()) {
      Quarantine(std::move(quarantined), Now() + ToNanos(options_.put_timeout));
    }
  }
  if (lost > 0) Log().info("{} object(s) lost with their segments", lost);
}

void MasterState::RevokeTimedOutPuts(int64_t now) {
  for (size_t s = 0; s < shard_count_; ++s) {
    Shard& shard = shards_[s];
    std::vector<FreedReplica> quarantined;
    {
      MutexLock lock(shard.mu);
      int64_t timeout = ToNanos(options_.put_timeout);
      // Oldest first: stop at the first put still within its time.
      while (shard.processing.oldest != nullptr &&
             shard.processing.oldest->put_started + timeout <= now) {
        std::string key(shard.processing.oldest->key());
        std::vector<FreedReplica> replicas = EraseLocked(shard, shard.processing.oldest);
        quarantined.insert(quarantined.end(), replicas.begin(), replicas.end());
        counters_.put_revokes.fetch_add(1, std::memory_order_relaxed);
        Log().warn("put of key {} not ended within {} ms: revoked", QuoteKey(key),
                   options_.put_timeout.count());
      }
    }
    if (!quarantined.empty())
      Quarantine(std::move(quarantined), now + ToNanos(options_.put_timeout));
  }
}

// Ranges whose writer may still be copying are held back for one more put_timeout before reuse,
// so that a late write cannot land in another object's bytes; ranges a reader may still be
// copying from, until its lease ends. The queue is released in order: an entry behind one with a
// later release time waits for it, which only keeps its ranges out of use longer.
void MasterState::Quarantine(std::vector<FreedReplica> replicas, int64_t release_at) {
  MutexLock lock(quarantine_mu_);
  quarantine_.push_back(QuarantinedRanges{release_at, std::move(replicas)});
}

void MasterState::ReleaseQuarantine(int64_t now) {
  std::vector<FreedReplica> released;
  {
    MutexLock lock(quarantine_mu_);
    while (!quarantine_.empty() && quarantine_.front().release_at <= now) {
      released.insert(released.end(), quarantine_.front().replicas.begin(),
                      quarantine_.front().replicas.end());
      quarantine_.pop_front();
    }
  }
  FreeReplicas(released);
}

void MasterState::FreeReplicas(std::span<const FreedReplica> replicas) {
  std::vector<StoredReplica> now;
  now.reserve(replicas.size());
  for (const FreedReplica& freed : replicas) {
    if (!feed_.Hold(freed.replica, freed.size, freed.seq)) now.push_back(freed.replica);
  }
  segments_.Free(now);
}

void MasterState::FreeReleased(std::span<const StoredReplica> replicas) {
  if (replicas.empty()) return;
  segments_.Free(replicas);
  {
    MutexLock lock(reclaim_mu_);
    ++reclaimed_;
  }
  reclaim_cv_.SignalAll();
}

bool MasterState::WaitForReclaim(uint64_t seen, std::chrono::steady_clock::time_point deadline) {
  MutexLock lock(reclaim_mu_);
  while (reclaimed_ == seen && reclaim_cv_.WaitUntil(lock, deadline)) {
  }
  return reclaimed_ != seen;
}

}  // namespace larder::master
