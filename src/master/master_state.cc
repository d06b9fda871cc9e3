// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/master_state.h"

#include <algorithm>
#include <unordered_set>

#include "common/env.h"
#include "common/logging.h"

namespace larder::master {

namespace {

// Segment ids carry the incarnation in their high half, so that a client holding ids from a
// previous master never mistakes them for new ones.
uint64_t SegmentIdBase(uint64_t incarnation) { return (incarnation & 0xffffffffull) << 32; }

int64_t ToNanos(std::chrono::milliseconds d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

}  // namespace

MasterState::MasterState(MasterOptions options)
    : options_(std::move(options)),
      incarnation_(RandomU64() | 1),
      shard_count_(std::max<size_t>(options_.shards, 1)),
      shards_(new Shard[shard_count_]),
      segments_(SegmentIdBase(incarnation_), options_.allocation_alignment, options_.placement) {}

MasterState::~MasterState() {
  {
    std::lock_guard lock(sweeper_mu_);
    stopping_ = true;
  }
  sweeper_cv_.notify_all();
  if (sweeper_.joinable()) sweeper_.join();
}

void MasterState::StartSweeper() {
  if (sweeper_.joinable()) return;
  sweeper_ = std::thread([this] { SweeperLoop(); });
}

void MasterState::SweeperLoop() {
  std::unique_lock lock(sweeper_mu_);
  while (!stopping_) {
    sweeper_cv_.wait_for(lock, options_.sweep_interval, [this] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    RunMaintenance();
    lock.lock();
  }
}

int64_t MasterState::Now() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(options_.clock().time_since_epoch())
      .count();
}

// The shard comes from the hash's high half: a shard's hash set uses the low bits for its own
// slots and fingerprints, which must not be the same few values for every key of the shard.
Shard& MasterState::ShardFor(const KeyRef& key) const {
  return shards_[((key.hash >> 32) * shard_count_) >> 32];
}

Result<MasterState::ClientRecord> MasterState::LookupClient(const std::string& client_id) {
  std::lock_guard lock(clients_mu_);
  auto it = clients_.find(client_id);
  if (it == clients_.end()) {
    return FailedPreconditionError("client '" + client_id +
                                   "' is not registered with this master (it expired, or the "
                                   "master restarted); mount its segments again");
  }
  it->second.last_seen = Now();
  return it->second;
}

Status MasterState::ValidateKey(std::string_view key) const {
  if (key.empty()) return InvalidArgumentError("empty key");
  if (key.size() > options_.max_key_size) {
    return InvalidArgumentError("key of " + std::to_string(key.size()) +
                                " bytes exceeds the maximum of " +
                                std::to_string(options_.max_key_size));
  }
  return Status::Ok();
}

// ---- clients and segments ----

std::vector<Result<SegmentId>> MasterState::MountSegments(const std::string& client_id,
                                                          const std::string& host_id,
                                                          std::span<const SegmentMount> segments) {
  uint32_t slot;
  {
    std::lock_guard lock(clients_mu_);
    auto [it, inserted] = clients_.try_emplace(client_id);
    if (inserted) {
      it->second.slot = next_client_slot_++;
      it->second.host_id = host_id;
      Log().info("client {} (host {}) registered", client_id, host_id);
    }
    it->second.last_seen = Now();
    slot = it->second.slot;
  }
  std::vector<Result<SegmentId>> results;
  results.reserve(segments.size());
  for (const SegmentMount& mount : segments) {
    if (client_id.empty()) {
      results.emplace_back(InvalidArgumentError("empty client id"));
      continue;
    }
    results.push_back(segments_.Mount(slot, client_id, host_id, mount));
    if (results.back().ok()) {
      Log().info("segment '{}' ({}) mounted by {}", mount.name, FormatByteSize(mount.size),
                 client_id);
    }
  }
  return results;
}

Result<std::vector<Status>> MasterState::UnmountSegments(const std::string& client_id,
                                                         std::span<const SegmentId> segments,
                                                         bool unregister) {
  LARDER_ASSIGN_OR_RETURN(ClientRecord client, LookupClient(client_id));
  std::vector<Status> results;
  std::vector<SegmentId> unmounted;
  for (SegmentId id : segments) {
    results.push_back(segments_.Unmount(id, client.slot));
    if (results.back().ok()) unmounted.push_back(id);
  }
  if (unregister) {
    {
      std::lock_guard lock(clients_mu_);
      clients_.erase(client_id);
    }
    for (SegmentId id : segments_.SegmentsOf(client.slot)) {
      if (segments_.Unmount(id, client.slot).ok()) unmounted.push_back(id);
    }
    Log().info("client {} left", client_id);
  }
  if (!unmounted.empty() || unregister) DropSegments(unmounted, unregister ? client.slot : 0);
  return results;
}

HeartbeatOutcome MasterState::Heartbeat(const std::string& client_id) {
  std::lock_guard lock(clients_mu_);
  auto it = clients_.find(client_id);
  if (it == clients_.end()) return HeartbeatOutcome{.remount_required = true};
  it->second.last_seen = Now();
  return HeartbeatOutcome{};
}

// ---- objects ----

Result<std::vector<PutStartOutcome>> MasterState::BatchPutStart(const std::string& client_id,
                                                                std::span<const PutStartItem> items,
                                                                const PutOptions& options) {
  LARDER_ASSIGN_OR_RETURN(ClientRecord client, LookupClient(client_id));
  std::vector<PutStartOutcome> results(items.size());
  std::unordered_set<std::string_view> seen;
  seen.reserve(items.size());
  SegmentTable::Plan plan = segments_.MakePlan(options, client.slot, client.host_id);
  if (plan.replicas > kMaxReplicas) {
    for (PutStartOutcome& result : results) {
      result.status = InvalidArgumentError(std::to_string(plan.replicas) +
                                           " replicas requested; an object has at most " +
                                           std::to_string(kMaxReplicas));
    }
    return results;
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const PutStartItem& item = items[i];
    if (!seen.insert(item.key).second) {
      results[i].status =
          InvalidArgumentError("key '" + std::string(item.key) + "' appears twice in the batch");
      continue;
    }
    results[i] = PutStartOne(client, item, plan, options.pin);
  }
  return results;
}

PutStartOutcome MasterState::PutStartOne(const ClientRecord& client, const PutStartItem& item,
                                         const SegmentTable::Plan& plan, bool pin) {
  PutStartOutcome outcome;
  if (Status status = ValidateKey(item.key); !status.ok()) {
    outcome.status = status;
    return outcome;
  }
  if (item.size == 0) {
    outcome.status = InvalidArgumentError("value of key '" + std::string(item.key) + "' is empty");
    return outcome;
  }
  const KeyRef ref(item.key);
  Shard& shard = ShardFor(ref);
  // Without space, evict and retry while eviction frees something. Each round evicts at least
  // what this object needs, and at least eviction_ratio of the pool so rounds stay rare.
  for (int round = 0;; ++round) {
    {
      std::lock_guard lock(shard.mu);
      if (Object* object = shard.Find(ref); object != nullptr) {
        if (object->state == ObjectState::kProcessing && object->writer == client.slot) {
          // The same client asks again (a retried call whose reply was lost): same answer.
          for (const StoredReplica& replica : object->replicas()) {
            outcome.replicas.push_back(ReplicaLocation{replica.segment_id, replica.offset});
          }
          return outcome;
        }
        // Objects are immutable: the put succeeds without rewriting. A put of a stored key is a
        // reference to it, as a get is.
        if (object->state == ObjectState::kComplete) shard.LruTouch(object, ++tick_);
        outcome.already_exists = true;
        return outcome;
      }
      auto placed = segments_.Allocate(item.size, plan);
      if (placed.ok()) {
        Object* object = shard.Insert(ref, *placed);
        object->size = item.size;
        object->put_started = Now();
        object->writer = client.slot;
        object->pinned = pin;
        shard.Link(object, ObjectList::kProcessing);
        objects_.fetch_add(1, std::memory_order_relaxed);
        for (const StoredReplica& replica : object->replicas()) {
          outcome.replicas.push_back(ReplicaLocation{replica.segment_id, replica.offset});
        }
        return outcome;
      }
      if (placed.status().code() != StatusCode::kResourceExhausted || round >= 64) {
        outcome.status = placed.status().WithContext("key '" + std::string(item.key) + "'");
        return outcome;
      }
    }
    SegmentTable::Usage usage = segments_.usage();
    uint64_t want = std::max<uint64_t>(
        item.size * plan.replicas,
        static_cast<uint64_t>(static_cast<double>(usage.capacity) * options_.eviction_ratio));
    if (Evict(want) == 0) {
      outcome.status = ResourceExhaustedError(
          "no space for key '" + std::string(item.key) + "' (" + std::to_string(item.size) +
          " bytes) and nothing is evictable: every object is leased, pinned or being written");
      return outcome;
    }
  }
}

Result<std::vector<Status>> MasterState::BatchPutEnd(const std::string& client_id,
                                                     std::span<const std::string_view> keys) {
  LARDER_ASSIGN_OR_RETURN(ClientRecord client, LookupClient(client_id));
  std::vector<Status> results(keys.size());
  uint64_t tick = tick_.fetch_add(keys.size());
  uint64_t ended = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const KeyRef ref(keys[i]);
    Shard& shard = ShardFor(ref);
    std::lock_guard lock(shard.mu);
    Object* object = shard.Find(ref);
    if (object == nullptr) {
      results[i] = NotFoundError("no put in progress for key '" + std::string(ref.key) +
                                 "' (revoked, timed out, or its segments were lost)");
      continue;
    }
    if (object->writer != client.slot) {
      results[i] =
          FailedPreconditionError("key '" + std::string(ref.key) + "' is not a put of this client");
      continue;
    }
    if (object->state == ObjectState::kComplete) continue;  // a retried PutEnd
    object->state = ObjectState::kComplete;
    object->lease_until = 0;
    object->last_access = tick + i + 1;
    shard.Link(object, object->pinned ? ObjectList::kNone : ObjectList::kLru);
    ++ended;
  }
  counters_.puts.fetch_add(ended, std::memory_order_relaxed);
  return results;
}

Result<std::vector<Status>> MasterState::BatchPutRevoke(const std::string& client_id,
                                                        std::span<const std::string_view> keys) {
  LARDER_ASSIGN_OR_RETURN(ClientRecord client, LookupClient(client_id));
  std::vector<Status> results(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const KeyRef ref(keys[i]);
    std::vector<StoredReplica> freed;
    {
      Shard& shard = ShardFor(ref);
      std::lock_guard lock(shard.mu);
      Object* object = shard.Find(ref);
      if (object == nullptr) {
        results[i] = NotFoundError("no put in progress for key '" + std::string(ref.key) + "'");
        continue;
      }
      if (object->state != ObjectState::kProcessing || object->writer != client.slot) {
        results[i] = FailedPreconditionError("key '" + std::string(ref.key) +
                                             "' is not a put of this client");
        continue;
      }
      freed = EraseLocked(shard, object);
    }
    // The writer says it stopped writing, so the ranges can go back at once.
    segments_.Free(freed);
    counters_.put_revokes.fetch_add(1, std::memory_order_relaxed);
  }
  return results;
}

Result<std::vector<GetOutcome>> MasterState::BatchGetReplicas(
    const std::string& client_id, std::span<const std::string_view> keys) {
  LARDER_RETURN_IF_ERROR(LookupClient(client_id).status());
  std::vector<GetOutcome> results(keys.size());
  int64_t now = Now();
  int64_t lease_until = now + ToNanos(options_.lease_ttl);
  // One tick range and one update of each shared counter per batch, not per key: these atomics
  // are shared by every RPC thread.
  uint64_t tick = tick_.fetch_add(keys.size());
  uint64_t hits = 0, misses = 0, expiries = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const KeyRef ref(keys[i]);
    GetOutcome& outcome = results[i];
    Shard& shard = ShardFor(ref);
    std::lock_guard lock(shard.mu);
    Object* object = shard.Find(ref);
    if (object == nullptr) {
      outcome.status = NotFoundError("key '" + std::string(ref.key) + "' not found");
      ++misses;
      continue;
    }
    if (object->state != ObjectState::kComplete) {
      outcome.status =
          UnavailableError("key '" + std::string(ref.key) + "' is still being written");
      ++misses;
      continue;
    }
    if (object->lease_until != 0 && object->lease_until < now) ++expiries;
    object->lease_until = lease_until;
    shard.LruTouch(object, tick + i + 1);
    outcome.size = object->size;
    outcome.lease = options_.lease_ttl;
    for (const StoredReplica& replica : object->replicas()) {
      outcome.replicas.push_back(ReplicaLocation{replica.segment_id, replica.offset});
    }
    ++hits;
  }
  counters_.gets.fetch_add(hits, std::memory_order_relaxed);
  counters_.get_misses.fetch_add(misses, std::memory_order_relaxed);
  counters_.lease_expiries.fetch_add(expiries, std::memory_order_relaxed);
  return results;
}

Result<std::vector<Status>> MasterState::BatchExist(const std::string& client_id,
                                                    std::span<const std::string_view> keys) {
  LARDER_RETURN_IF_ERROR(LookupClient(client_id).status());
  std::vector<Status> results(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const KeyRef ref(keys[i]);
    Shard& shard = ShardFor(ref);
    std::lock_guard lock(shard.mu);
    Object* object = shard.Find(ref);
    if (object == nullptr || object->state != ObjectState::kComplete) {
      results[i] = NotFoundError("key '" + std::string(ref.key) + "' not found");
    }
  }
  return results;
}

Result<std::vector<Status>> MasterState::BatchRemove(const std::string& client_id,
                                                     std::span<const std::string_view> keys) {
  LARDER_RETURN_IF_ERROR(LookupClient(client_id).status());
  std::vector<Status> results(keys.size());
  int64_t now = Now();
  for (size_t i = 0; i < keys.size(); ++i) {
    const KeyRef ref(keys[i]);
    std::vector<StoredReplica> freed;
    {
      Shard& shard = ShardFor(ref);
      std::lock_guard lock(shard.mu);
      Object* object = shard.Find(ref);
      if (object == nullptr) {
        results[i] = NotFoundError("key '" + std::string(ref.key) + "' not found");
        continue;
      }
      if (object->state != ObjectState::kComplete) {
        results[i] =
            UnavailableError("key '" + std::string(ref.key) + "' is being written; retry later");
        continue;
      }
      if (object->lease_until > now) {
        results[i] = UnavailableError(
            "key '" + std::string(ref.key) + "' is leased to a reader for another " +
            std::to_string((object->lease_until - now) / 1000000 + 1) + " ms; retry later");
        continue;
      }
      freed = EraseLocked(shard, object);
    }
    segments_.Free(freed);
    counters_.removes.fetch_add(1, std::memory_order_relaxed);
  }
  return results;
}

Result<RemoveAllOutcome> MasterState::RemoveAll(const std::string& client_id) {
  LARDER_RETURN_IF_ERROR(LookupClient(client_id).status());
  RemoveAllOutcome outcome;
  int64_t now = Now();
  for (size_t s = 0; s < shard_count_; ++s) {
    Shard& shard = shards_[s];
    std::vector<StoredReplica> freed;
    {
      std::lock_guard lock(shard.mu);
      size_t removed = shard.EraseIf([&](const Object* object) {
        if (object->state != ObjectState::kComplete) return false;
        if (object->lease_until > now) {
          ++outcome.skipped_leased;
          return false;
        }
        freed.insert(freed.end(), object->replicas().begin(), object->replicas().end());
        return true;
      });
      objects_.fetch_sub(removed, std::memory_order_relaxed);
      outcome.removed += removed;
    }
    segments_.Free(freed);
  }
  counters_.removes.fetch_add(outcome.removed, std::memory_order_relaxed);
  return outcome;
}

std::vector<StoredReplica> MasterState::EraseLocked(Shard& shard, Object* object) {
  std::span<const StoredReplica> replicas = object->replicas();
  std::vector<StoredReplica> freed(replicas.begin(), replicas.end());
  shard.Erase(object);
  objects_.fetch_sub(1, std::memory_order_relaxed);
  return freed;
}

// ---- operators ----

std::vector<SegmentView> MasterState::ListSegments(std::span<const SegmentId> ids) const {
  return segments_.List(ids);
}

std::vector<std::pair<std::string, uint64_t>> MasterState::ListKeys(std::string_view prefix,
                                                                    size_t limit) const {
  std::vector<std::pair<std::string, uint64_t>> keys;
  for (size_t s = 0; s < shard_count_; ++s) {
    Shard& shard = shards_[s];
    std::lock_guard lock(shard.mu);
    for (const Object* object : shard.objects) {
      if (object->state == ObjectState::kComplete && object->key().starts_with(prefix)) {
        keys.emplace_back(std::string(object->key()), object->size);
      }
    }
  }
  std::sort(keys.begin(), keys.end());
  if (keys.size() > limit) keys.resize(limit);
  return keys;
}

MasterStats MasterState::Stats() const {
  MasterStats stats;
  SegmentTable::Usage usage = segments_.usage();
  stats.objects = objects_.load(std::memory_order_relaxed);
  stats.bytes_used = usage.used;
  stats.bytes_capacity = usage.capacity;
  stats.segments = usage.segments;
  {
    std::lock_guard lock(clients_mu_);
    stats.clients = clients_.size();
  }
  stats.puts = counters_.puts.load();
  stats.gets = counters_.gets.load();
  stats.get_misses = counters_.get_misses.load();
  stats.removes = counters_.removes.load();
  stats.evictions = counters_.evictions.load();
  stats.evicted_bytes = counters_.evicted_bytes.load();
  stats.lease_expiries = counters_.lease_expiries.load();
  stats.put_revokes = counters_.put_revokes.load();
  stats.client_expiries = counters_.client_expiries.load();
  stats.incarnation = incarnation_;
  return stats;
}

}  // namespace larder::master
