// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// MasterState: construction, the sweeper, keys and tenants, puts, gets and leases. Clients and
// segments are in clients.cc, removals in removal.cc, operators' actions in operators.cc,
// eviction in eviction.cc, liveness in liveness.cc, catalogs and rebuilds in recovery.cc.
#include "master/master_state.h"

#include <algorithm>
#include <bit>
#include <optional>
#include <unordered_set>

#include "common/env.h"
#include "common/logging.h"
#include "common/mutex.h"

namespace larder::master {

namespace {

// Segment ids carry the incarnation in their high half, so that a client holding ids from a
// previous master never mistakes them for new ones.
uint64_t SegmentIdBase(uint64_t incarnation) { return (incarnation & 0xffffffffull) << 32; }

int64_t ToNanos(std::chrono::milliseconds d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

// A TTL in nanoseconds that cannot overflow when added to a clock reading (at most ~73 years).
int64_t TtlNanos(std::chrono::milliseconds ttl) {
  constexpr int64_t kMaxMs = INT64_MAX / 4 / 1'000'000;
  return std::clamp<int64_t>(ttl.count(), 0, kMaxMs) * 1'000'000;
}

std::string FormatMs(std::chrono::milliseconds d) { return std::to_string(d.count()) + " ms"; }

// The longest a put waits, in all, for ranges held until their owners apply REMOVEs: several of
// the owners' catalog syncs (200 ms apart by default).
constexpr auto kReclaimWait = std::chrono::milliseconds(1000);

}  // namespace

MasterState::MasterState(MasterOptions options)
    : options_(std::move(options)),
      incarnation_(RandomU64() | 1),
      shard_count_(std::max<size_t>(options_.shards, 1)),
      shards_(new Shard[shard_count_]),
      segments_(SegmentIdBase(incarnation_), options_.allocation_alignment, options_.placement),
      feed_(shard_count_),
      started_(Now()),
      leases_(RandomU64()),
      last_sweep_(started_) {}

MasterState::~MasterState() {
  disk_.Stop();
  {
    MutexLock lock(sweeper_mu_);
    stopping_ = true;
  }
  sweeper_cv_.SignalAll();
  if (sweeper_.joinable()) sweeper_.join();
  {
    MutexLock lock(demotion_mu_);
    demotion_stopping_ = true;
    demotion_cv_.SignalAll();
  }
  if (demoter_.joinable()) demoter_.join();
}

void MasterState::StartSweeper() {
  if (sweeper_.joinable()) return;
  sweeper_ = std::thread([this] { SweeperLoop(); });
  demoter_ = std::thread([this] { DemotionLoop(); });
}

void MasterState::SweeperLoop() {
  MutexLock lock(sweeper_mu_);
  while (!stopping_) {
    const auto deadline = std::chrono::steady_clock::now() + options_.sweep_interval;
    while (!stopping_ && sweeper_cv_.WaitUntil(lock, deadline)) {
    }
    if (stopping_) break;
    lock.Unlock();
    RunMaintenance();
    lock.Lock();
  }
}

int64_t MasterState::Now() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(options_.clock().time_since_epoch())
      .count();
}

// The shard comes from the hash's high half: a shard's hash set uses the low bits for its own
// slots and fingerprints, which must not be the same few values for every key of the shard.
size_t MasterState::ShardIndex(const KeyRef& key) const {
  return ((key.hash >> 32) * shard_count_) >> 32;
}

Shard& MasterState::ShardFor(const KeyRef& key) const { return shards_[ShardIndex(key)]; }

void MasterState::SortByShard(std::span<const KeyRef> refs, std::vector<uint32_t>* indices) const {
  // A counting sort: stable, and linear in keys and shards.
  std::vector<uint32_t> starts(shard_count_ + 1, 0);
  for (uint32_t i : *indices) ++starts[ShardIndex(refs[i]) + 1];
  for (size_t s = 1; s <= shard_count_; ++s) starts[s] += starts[s - 1];
  std::vector<uint32_t> sorted(indices->size());
  for (uint32_t i : *indices) sorted[starts[ShardIndex(refs[i])]++] = i;
  *indices = std::move(sorted);
}

MasterState::ClientRecord* MasterState::TouchClientLocked(const std::string& client_id) {
  auto it = clients_.find(client_id);
  if (it == clients_.end()) return nullptr;
  it->second.last_seen = Now();
  return &it->second;
}

Status MasterState::UnknownClientError(const std::string& client_id) {
  return FailedPreconditionError("client '" + client_id +
                                 "' is not registered with this master (it expired, or the "
                                 "master restarted); mount its segments again")
      .WithDetail(ErrorDetail::kRemountRequired);
}

Result<MasterState::ClientRecord> MasterState::LookupClient(const std::string& client_id) {
  MutexLock lock(clients_mu_);
  ClientRecord* client = TouchClientLocked(client_id);
  if (client == nullptr) return UnknownClientError(client_id);
  return *client;
}

Result<uint32_t> MasterState::LookupSlot(const std::string& client_id) {
  MutexLock lock(clients_mu_);
  ClientRecord* client = TouchClientLocked(client_id);
  if (client == nullptr) return UnknownClientError(client_id);
  return client->slot;
}

Status MasterState::ValidateKey(std::string_view key) const {
  if (key.empty()) return InvalidArgumentError("empty key");
  if (key.size() > std::min(options_.max_key_size, kMaxKeyBytes)) {
    return InvalidArgumentError("key " + QuoteKey(key) + " exceeds the maximum of " +
                                std::to_string(std::min(options_.max_key_size, kMaxKeyBytes)) +
                                " bytes");
  }
  return Status::Ok();
}

Status CheckBatchSize(size_t items, const char* what) {
  if (items <= kMaxBatchKeys) return Status::Ok();
  return InvalidArgumentError("a batch of " + std::to_string(items) + " " + what +
                              " exceeds the maximum of " + std::to_string(kMaxBatchKeys));
}

Status ValidateTenant(std::string_view tenant) {
  if (tenant.size() > kMaxTenantBytes) {
    return InvalidArgumentError("tenant " + QuoteKey(tenant) + " exceeds the maximum of " +
                                std::to_string(kMaxTenantBytes) + " bytes");
  }
  if (tenant.find('\0') != std::string_view::npos) {
    return InvalidArgumentError("tenant " + QuoteKey(tenant) + " contains a NUL byte");
  }
  return Status::Ok();
}

std::optional<std::string_view> KeyInTenant(std::string_view key, std::string_view tenant) {
  // The default tenant's keys, except those that start with NUL: clients store those as
  // "\0\0" + key (the form below, for tenant "").
  if (tenant.empty() && (key.empty() || key.front() != '\0')) return key;
  // "\0" + tenant + "\0" + key
  if (key.size() < tenant.size() + 2 || key.front() != '\0' ||
      key.substr(1, tenant.size()) != tenant || key[tenant.size() + 1] != '\0') {
    return std::nullopt;
  }
  return key.substr(tenant.size() + 2);
}

std::string QuoteKey(std::string_view key) {
  constexpr size_t kShown = 64;
  std::string out = "'";
  for (size_t i = 0; i < std::min(key.size(), kShown); ++i) {
    auto c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      char escaped[5];
      snprintf(escaped, sizeof(escaped), "\\x%02x", c);
      out += escaped;
    }
  }
  out += '\'';
  if (key.size() > kShown) out += "... (" + std::to_string(key.size()) + " bytes)";
  return out;
}

// ---- objects ----

Result<std::vector<PutStartOutcome>> MasterState::BatchPutStart(const std::string& client_id,
                                                                std::span<const PutStartItem> items,
                                                                const PutOptions& options) {
  LARDER_RETURN_IF_ERROR(CheckBatchSize(items.size(), "put items"));
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
  Result<int64_t> soft_pin_ttl = SoftPinTtl(options);
  if (!soft_pin_ttl.ok()) {
    for (PutStartOutcome& result : results) result.status = soft_pin_ttl.status();
    counters_.put_refusals_invalid.fetch_add(results.size(), std::memory_order_relaxed);
    return results;
  }
  MakeRoomForBatch(items, plan.replicas);
  uint64_t invalid = 0, no_space = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const PutStartItem& item = items[i];
    if (!seen.insert(item.key).second) {
      results[i].status =
          InvalidArgumentError("key " + QuoteKey(item.key) + " appears twice in the batch");
    } else {
      results[i] = PutStartOne(client, item, plan, options, *soft_pin_ttl);
    }
    if (results[i].status.code() == StatusCode::kInvalidArgument) ++invalid;
    if (results[i].status.code() == StatusCode::kResourceExhausted) ++no_space;
  }
  if (invalid > 0) counters_.put_refusals_invalid.fetch_add(invalid, std::memory_order_relaxed);
  if (no_space > 0) counters_.put_refusals_no_space.fetch_add(no_space, std::memory_order_relaxed);
  return results;
}

Result<int64_t> MasterState::SoftPinTtl(const PutOptions& options) const {
  switch (options.soft_pin_action) {
    case SoftPinAction::kPreserve:
    case SoftPinAction::kDisable:
      if (options.soft_pin_ttl.has_value()) {
        return InvalidArgumentError(
            std::string("a soft-pin TTL needs the action ENABLE, not ") +
            (options.soft_pin_action == SoftPinAction::kPreserve ? "PRESERVE" : "DISABLE"));
      }
      return 0;
    case SoftPinAction::kEnable: {
      std::chrono::milliseconds ttl = options.soft_pin_ttl.value_or(options_.default_soft_pin_ttl);
      if (ttl.count() < 0 ||
          (options.soft_pin_ttl.has_value() && ttl > options_.max_soft_pin_ttl)) {
        return InvalidArgumentError("soft-pin TTL of " + FormatMs(ttl) + " is outside 0.." +
                                    FormatMs(options_.max_soft_pin_ttl));
      }
      return TtlNanos(ttl);
    }
  }
  return InvalidArgumentError("unknown soft-pin action " +
                              std::to_string(static_cast<int32_t>(options.soft_pin_action)));
}

void MasterState::MakeRoomForBatch(std::span<const PutStartItem> items, uint32_t replicas) {
  if (items.size() < 2 || replicas == 0) return;  // PutStartOne evicts for one key as it goes
  SegmentTable::Usage usage = segments_.usage();
  // Ranges held for their owners are free soon: evicting for them too would empty the pool.
  uint64_t free = std::min(
      usage.capacity, usage.capacity - std::min(usage.used, usage.capacity) + feed_.held_bytes());
  // Bytes an item takes; 0 for one that cannot be placed at all (it fails on its own later).
  auto bytes_of = [&](const PutStartItem& item) -> uint64_t {
    if (item.size == 0 || item.size > usage.capacity / replicas) return 0;
    return item.size * replicas;
  };
  // Sums saturate: sizes come from the network.
  auto add = [](uint64_t a, uint64_t b) { return UINT64_MAX - a < b ? UINT64_MAX : a + b; };
  uint64_t most = 0;
  for (const PutStartItem& item : items) most = add(most, bytes_of(item));
  if (most <= free) return;  // fits even if every key is new: no lookups needed
  uint64_t needed = 0;
  for (const PutStartItem& item : items) {
    if (!ValidateKey(item.key).ok() || bytes_of(item) == 0) continue;
    const KeyRef ref(item.key);
    Shard& shard = ShardFor(ref);
    MutexLock lock(shard.mu);
    if (shard.Find(ref) == nullptr) needed = add(needed, bytes_of(item));
  }
  if (needed > free) EvictForPut(std::min(needed - free, usage.capacity));
}

PutStartOutcome MasterState::PutStartOne(const ClientRecord& client, const PutStartItem& item,
                                         const SegmentTable::Plan& plan, const PutOptions& options,
                                         int64_t soft_pin_ttl) {
  PutStartOutcome outcome;
  if (Status status = ValidateKey(item.key); !status.ok()) {
    outcome.status = status;
    return outcome;
  }
  if (item.size == 0) {
    outcome.status = InvalidArgumentError("value of key " + QuoteKey(item.key) + " is empty");
    return outcome;
  }
  const KeyRef ref(item.key);
  Shard& shard = ShardFor(ref);
  // What the new object inherits from the one an upsert replaced, kept across rounds: the old
  // object is gone by the time a round after an eviction finds the key absent.
  bool pin = options.pin;
  int64_t kept_soft_pin = 0;
  // How long this put may wait, in all, for held ranges to come back.
  std::optional<std::chrono::steady_clock::time_point> reclaim_deadline;
  // Without space, evict and retry while eviction frees something. Each round evicts what this
  // object needs and a little more (eviction_slack), so that the pool stays full.
  for (int round = 0;; ++round) {
    {
      MutexLock lock(shard.mu);
      std::optional<Result<std::vector<StoredReplica>>> placed;
      if (Object* object = shard.Find(ref); object != nullptr) {
        if (object->state == ObjectState::kProcessing) {
          if (object->writer == client.slot) {
            // The same client asks again (a retried call whose reply was lost): same answer.
            for (const StoredReplica& replica : object->replicas()) {
              outcome.replicas.push_back(ReplicaLocation{replica.segment_id, replica.offset});
            }
          } else if (options.upsert) {
            outcome.status = UnavailableError("key " + QuoteKey(item.key) +
                                              " is being written by another client; retry later")
                                 .WithDetail(ErrorDetail::kBeingWritten);
          } else {
            outcome.already_exists = true;
          }
          return outcome;
        }
        if (!options.upsert) {
          // Objects are immutable: the put succeeds without rewriting. A put of a stored key is a
          // reference to it, as a get is.
          shard.LruTouch(object, ++tick_);
          outcome.already_exists = true;
          return outcome;
        }
        // An upsert places the new value before it lets the old one go, so that a value that can
        // never be placed leaves the key as it was; when the pool is full, the old object's space
        // is freed first and tried again.
        placed = segments_.Allocate(item.size, plan);
        if (!placed->ok() && placed->status().code() != StatusCode::kResourceExhausted) {
          outcome.status = placed->status().WithContext("key " + QuoteKey(item.key));
          return outcome;
        }
        pin = pin || object->pinned;
        kept_soft_pin = shard.SoftPinUntil(object);
        ReleaseLocked(shard, object, Now());
        if (!placed->ok()) placed = segments_.Allocate(item.size, plan);
      } else {
        placed = segments_.Allocate(item.size, plan);
      }
      if (placed->ok()) {
        Object* object = shard.Insert(ref, **placed);
        object->size = item.size;
        object->put_started = Now();
        object->writer = client.slot;
        object->pinned = pin;
        shard.Link(object, ObjectList::kProcessing);
        if (!pin) {
          StagedSoftPin staged;
          if (options.soft_pin_action == SoftPinAction::kEnable) staged.ttl = soft_pin_ttl;
          if (options.soft_pin_action == SoftPinAction::kPreserve) staged.until = kept_soft_pin;
          if (staged.ttl > 0 || staged.until > 0) shard.staged_soft_pins[object] = staged;
        }
        objects_.fetch_add(1, std::memory_order_relaxed);
        for (const StoredReplica& replica : object->replicas()) {
          outcome.replicas.push_back(ReplicaLocation{replica.segment_id, replica.offset});
        }
        return outcome;
      }
      if (placed->status().code() != StatusCode::kResourceExhausted || round >= 64) {
        outcome.status = placed->status().WithContext("key " + QuoteKey(item.key));
        return outcome;
      }
    }
    // What eviction frees may be held until the segments' owners apply the REMOVEs (a catalog
    // sync away; only for owners that do not check their catalogs: see CatalogFeed::Hold): wait
    // for ranges to come back.
    uint64_t seen;
    {
      MutexLock lock(reclaim_mu_);
      seen = reclaimed_;
    }
    // Once it waits for held space, a put evicts again only when nothing is held any more: what
    // it evicted before comes back to it.
    const bool waiting = reclaim_deadline.has_value() && feed_.held_bytes() > 0;
    const uint64_t evicted = waiting ? 0 : EvictForPut(item.size * plan.replicas);
    if (feed_.held_bytes() > 0) {
      if (!reclaim_deadline) reclaim_deadline = std::chrono::steady_clock::now() + kReclaimWait;
      if (WaitForReclaim(seen, *reclaim_deadline)) continue;
      outcome.status = ResourceExhaustedError(
          "no space for key " + QuoteKey(item.key) + " (" + std::to_string(item.size) +
          " bytes): the space that evictions and removals freed waits for the segments' owners "
          "to apply them to their catalogs, and they did not within " +
          FormatMs(std::chrono::duration_cast<std::chrono::milliseconds>(kReclaimWait)));
      return outcome;
    }
    if (evicted == 0) {
      outcome.status = ResourceExhaustedError(
          "no space for key " + QuoteKey(item.key) + " (" + std::to_string(item.size) +
          " bytes) and nothing is evictable: every object is leased, pinned or being written");
      return outcome;
    }
  }
}

void MasterState::ReleaseLocked(Shard& shard, Object* object, int64_t now) {
  const bool leased = object->Leased(now);
  const int64_t lease_until = object->lease_until;
  std::vector<FreedReplica> replicas = EraseLocked(shard, object);
  if (leased) {
    // A reader may be copying the bytes until its lease ends: nothing may be written there before.
    Quarantine(std::move(replicas), lease_until);
  } else {
    FreeReplicas(replicas);
  }
}

void MasterState::DropReplicaLocked(Object* object, PoolSegmentId segment, int64_t now) {
  std::vector<FreedReplica> freed;
  for (const StoredReplica& replica : object->replicas()) {
    if (replica.segment_id != segment) continue;
    LoggedChange change;
    change.kind = CatalogChangeKind::kRemove;
    change.key = object->key();
    change.size = object->size;
    change.offset = replica.offset;
    freed.push_back(FreedReplica{replica, object->size, feed_.Append(segment, change)});
  }
  object->EraseReplicasIf(
      [segment](const StoredReplica& replica) { return replica.segment_id == segment; });
  if (object->Leased(now)) {
    // A reader may be copying from that replica until its lease ends.
    Quarantine(std::move(freed), object->lease_until);
  } else {
    FreeReplicas(freed);
  }
}

Result<std::vector<Status>> MasterState::BatchPutEnd(const std::string& client_id,
                                                     std::span<const std::string_view> keys) {
  LARDER_RETURN_IF_ERROR(CheckBatchSize(keys.size(), "keys"));
  LARDER_ASSIGN_OR_RETURN(uint32_t slot, LookupSlot(client_id));
  std::vector<Status> results(keys.size());
  uint64_t tick = tick_.fetch_add(keys.size());
  uint64_t ended = 0;
  const int64_t now = Now();
  for (size_t i = 0; i < keys.size(); ++i) {
    const KeyRef ref(keys[i]);
    if (Status invalid = ValidateKey(ref.key); !invalid.ok()) {
      results[i] = std::move(invalid);
      continue;
    }
    Shard& shard = ShardFor(ref);
    MutexLock lock(shard.mu);
    Object* object = shard.Find(ref);
    if (object == nullptr) {
      results[i] = NotFoundError("no put in progress for key " + QuoteKey(ref.key) +
                                 " (revoked, timed out, or its segments were lost)");
      continue;
    }
    if (object->writer != slot) {
      results[i] =
          FailedPreconditionError("key " + QuoteKey(ref.key) + " is not a put of this client");
      continue;
    }
    if (object->state == ObjectState::kComplete) continue;  // a retried PutEnd
    object->state = ObjectState::kComplete;
    object->lease_until = 0;
    object->last_access = tick + i + 1;
    int64_t soft_pin_until = 0;
    if (auto staged = shard.staged_soft_pins.find(object); staged != shard.staged_soft_pins.end()) {
      soft_pin_until = staged->second.ttl > 0 ? now + staged->second.ttl : staged->second.until;
      shard.staged_soft_pins.erase(staged);
    }
    if (object->pinned) {
      shard.Link(object, ObjectList::kNone);
    } else if (soft_pin_until > now) {
      shard.SetSoftPin(object, soft_pin_until);
    } else {
      shard.Link(object, ObjectList::kLru);
    }
    // Under the shard lock, so that a REMOVE of the object can only be logged after its ADD.
    LogAddedLocked(object, !object->pinned && soft_pin_until > now ? soft_pin_until : 0);
    ++ended;
  }
  counters_.puts.fetch_add(ended, std::memory_order_relaxed);
  return results;
}

Result<std::vector<Status>> MasterState::BatchPutRevoke(const std::string& client_id,
                                                        std::span<const std::string_view> keys) {
  LARDER_RETURN_IF_ERROR(CheckBatchSize(keys.size(), "keys"));
  LARDER_ASSIGN_OR_RETURN(uint32_t slot, LookupSlot(client_id));
  std::vector<Status> results(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const KeyRef ref(keys[i]);
    if (Status invalid = ValidateKey(ref.key); !invalid.ok()) {
      results[i] = std::move(invalid);
      continue;
    }
    std::vector<FreedReplica> freed;
    {
      Shard& shard = ShardFor(ref);
      MutexLock lock(shard.mu);
      Object* object = shard.Find(ref);
      if (object == nullptr) {
        results[i] = NotFoundError("no put in progress for key " + QuoteKey(ref.key));
        continue;
      }
      if (object->state != ObjectState::kProcessing || object->writer != slot) {
        results[i] =
            FailedPreconditionError("key " + QuoteKey(ref.key) + " is not a put of this client");
        continue;
      }
      freed = EraseLocked(shard, object);
    }
    // The writer says it stopped writing, so the ranges can go back at once.
    FreeReplicas(freed);
    counters_.put_revokes.fetch_add(1, std::memory_order_relaxed);
  }
  return results;
}

Result<GetBatch> MasterState::BatchGetReplicas(const std::string& client_id,
                                               std::span<const std::string_view> keys, GetMode mode,
                                               std::span<const uint64_t> release) {
  LARDER_RETURN_IF_ERROR(CheckBatchSize(keys.size(), "keys"));
  LARDER_RETURN_IF_ERROR(CheckBatchSize(release.size(), "lease ids"));
  LARDER_ASSIGN_OR_RETURN(uint32_t slot, LookupSlot(client_id));
  if (!release.empty()) ReleaseLeasesOf(slot, client_id, release, nullptr);
  GetBatch batch;
  batch.items.resize(keys.size());
  const bool lease = mode != GetMode::kPeek;
  const bool use = mode == GetMode::kLease;  // a reader's get: it counts for LRU and the tallies
  std::vector<Object*> leased;
  if (lease) leased.reserve(keys.size());
  int64_t now = Now();
  int64_t lease_until = now + ToNanos(options_.lease_ttl);
  // One tick range and one update of each shared counter per batch, not per key: these atomics
  // are shared by every RPC thread.
  uint64_t tick = use ? tick_.fetch_add(keys.size()) : 0;
  // A get logs a TOUCH in its object's catalogs (see SyncCatalog) when it is the object's first
  // use in an epoch of 2^epoch_bits ticks: a catalog's tick is then at most one epoch behind the
  // object's last use, and an object costs one TOUCH per epoch at most, however hot.
  const int epoch_bits =
      std::max(12, static_cast<int>(std::bit_width(objects_.load(std::memory_order_relaxed) / 8)));
  TouchBatch touches;
  const int64_t rebuilding_until = rebuilding_until_.load(std::memory_order_relaxed);
  const bool rebuilding = lease && now < rebuilding_until;
  uint64_t hits = 0, misses = 0;
  TenantTally tally;
  // The keys grouped by shard, in key order within each: each shard's lock is taken once per
  // batch, and the lookups under it are prefetched together, so that their cache misses overlap.
  std::vector<KeyRef> refs;
  refs.reserve(keys.size());
  std::vector<uint32_t> by_shard;  // indices of the valid keys
  by_shard.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    refs.emplace_back(keys[i]);
    if (Status invalid = ValidateKey(keys[i]); !invalid.ok()) {
      batch.items[i].status = std::move(invalid);
      ++misses;
      continue;
    }
    by_shard.push_back(static_cast<uint32_t>(i));
  }
  SortByShard(refs, &by_shard);
  for (size_t group = 0; group < by_shard.size();) {
    const size_t shard_index = ShardIndex(refs[by_shard[group]]);
    size_t group_end = group + 1;
    while (group_end < by_shard.size() && ShardIndex(refs[by_shard[group_end]]) == shard_index) {
      ++group_end;
    }
    Shard& shard = shards_[shard_index];
    MutexLock lock(shard.mu);
    for (size_t j = group; j < group_end; ++j) shard.objects.prefetch(refs[by_shard[j]]);
    for (size_t j = group; j < group_end; ++j) {
      const size_t i = by_shard[j];
      const KeyRef& ref = refs[i];
      GetOutcome& outcome = batch.items[i];
      Object* object = shard.Find(ref);
      if (object == nullptr) {
        outcome.status = rebuilding ? RebuildingError(ref.key, rebuilding_until - now)
                                    : NotFoundError("key " + QuoteKey(ref.key) + " not found");
        ++misses;
        if (use) tally.Get(ref.key, false);
        continue;
      }
      if (object->state != ObjectState::kComplete) {
        outcome.status = UnavailableError("key " + QuoteKey(ref.key) + " is still being written")
                             .WithDetail(ErrorDetail::kBeingWritten);
        ++misses;
        if (use) tally.Get(ref.key, false);
        continue;
      }
      if (lease) {
        object->lease_until = lease_until;
        object->AddReader();
        leased.push_back(object);
      }
      if (use) {
        if (object->last_access >> epoch_bits < (tick + i + 1) >> epoch_bits) {
          if (touches.empty()) {
            // Usually most of a batch's keys are touched once one is: room for all at once.
            touches.Reserve(keys.size());
          }
          for (const StoredReplica& replica : object->replicas()) {
            touches.Add(replica.segment_id, replica.offset, tick + i + 1);
          }
        }
        shard.LruTouch(object, tick + i + 1);
      }
      outcome.size = object->size;
      for (const StoredReplica& replica : object->replicas()) {
        outcome.replicas.push_back(ReplicaLocation{replica.segment_id, replica.offset});
      }
      ++hits;
      if (use) tally.Get(ref.key, true);
    }
    group = group_end;
  }
  // TOUCHes are logged after the shard locks: a late one is harmless (a client applies a TOUCH
  // only to the entry at its offset, and keeps the latest tick).
  if (!touches.empty()) feed_.Append(touches);
  if (!leased.empty()) {
    batch.lease_id = leases_.Grant(slot, now, lease_until, std::move(leased));
    batch.lease_ttl = options_.lease_ttl;
  }
  if (use) {
    counters_.gets.fetch_add(hits, std::memory_order_relaxed);
    counters_.get_misses.fetch_add(misses, std::memory_order_relaxed);
    tenant_counters_.Merge(tally);
  }
  return batch;
}

Result<std::vector<Status>> MasterState::ReleaseLeases(const std::string& client_id,
                                                       std::span<const uint64_t> lease_ids) {
  LARDER_RETURN_IF_ERROR(CheckBatchSize(lease_ids.size(), "lease ids"));
  LARDER_ASSIGN_OR_RETURN(uint32_t slot, LookupSlot(client_id));
  std::vector<Status> results(lease_ids.size());
  ReleaseLeasesOf(slot, client_id, lease_ids, &results);
  return results;
}

void MasterState::ReleaseLeasesOf(uint32_t slot, const std::string& client_id,
                                  std::span<const uint64_t> lease_ids,
                                  std::vector<Status>* results) {
  int64_t now = Now();
  uint64_t released = 0, unknown = 0, refused = 0;
  for (size_t i = 0; i < lease_ids.size(); ++i) {
    int64_t held = 0;
    switch (leases_.Release(lease_ids[i], slot, now, &held)) {
      case LeaseTable::ReleaseOutcome::kReleased:
        lease_hold_.Observe(held);
        ++released;
        break;
      case LeaseTable::ReleaseOutcome::kUnknown:
        ++unknown;
        break;
      case LeaseTable::ReleaseOutcome::kRefused:
        if (results != nullptr) {
          (*results)[i] = PermissionDeniedError("lease " + std::to_string(lease_ids[i]) +
                                                " is held by another client; not released");
        }
        ++refused;
        break;
    }
  }
  counters_.lease_releases.fetch_add(released, std::memory_order_relaxed);
  counters_.lease_releases_unknown.fetch_add(unknown, std::memory_order_relaxed);
  if (refused > 0) {
    counters_.lease_releases_refused.fetch_add(refused, std::memory_order_relaxed);
    Log().warn("client {} tried to release {} lease(s) of another client", client_id, refused);
  }
}

Result<std::vector<Status>> MasterState::BatchExist(const std::string& client_id,
                                                    std::span<const std::string_view> keys) {
  LARDER_RETURN_IF_ERROR(CheckBatchSize(keys.size(), "keys"));
  LARDER_RETURN_IF_ERROR(LookupSlot(client_id).status());
  std::vector<Status> results(keys.size());
  uint64_t misses = 0;
  TenantTally tally;
  for (size_t i = 0; i < keys.size(); ++i) {
    const KeyRef ref(keys[i]);
    if (Status invalid = ValidateKey(ref.key); !invalid.ok()) {
      results[i] = std::move(invalid);
      ++misses;
      continue;
    }
    Shard& shard = ShardFor(ref);
    MutexLock lock(shard.mu);
    Object* object = shard.Find(ref);
    const bool found = object != nullptr && object->state == ObjectState::kComplete;
    if (!found) {
      results[i] = NotFoundError("key " + QuoteKey(ref.key) + " not found");
      ++misses;
    }
    tally.Lookup(ref.key, found);
  }
  // Lookups are what a serving engine's hit rate is made of (tenant_stats.h).
  counters_.lookups.fetch_add(keys.size(), std::memory_order_relaxed);
  counters_.lookup_misses.fetch_add(misses, std::memory_order_relaxed);
  tenant_counters_.Merge(tally);
  return results;
}

std::vector<MasterState::FreedReplica> MasterState::EraseLocked(Shard& shard, Object* object) {
  std::vector<FreedReplica> freed;
  freed.reserve(object->replica_count);
  LogRemovedLocked(object, &freed);
  shard.Erase(object);
  objects_.fetch_sub(1, std::memory_order_relaxed);
  return freed;
}

MasterStats MasterState::Stats() const {
  MasterStats stats;
  SegmentTable::Usage usage = segments_.usage();
  stats.objects = objects_.load(std::memory_order_relaxed);
  for (size_t s = 0; s < shard_count_; ++s) {
    MutexLock lock(shards_[s].mu);
    stats.soft_pinned_objects += shards_[s].soft_pin_until.size();
  }
  stats.bytes_used = usage.used;
  stats.bytes_capacity = usage.capacity;
  stats.segments = usage.segments;
  {
    MutexLock lock(clients_mu_);
    stats.clients = clients_.size();
  }
  stats.puts = counters_.puts.load();
  stats.gets = counters_.gets.load();
  stats.get_misses = counters_.get_misses.load();
  stats.lookups = counters_.lookups.load();
  stats.lookup_misses = counters_.lookup_misses.load();
  stats.removes = counters_.removes.load();
  stats.evictions = counters_.evictions.load();
  stats.evicted_bytes = counters_.evicted_bytes.load();
  stats.lease_expiries = counters_.lease_expiries.load();
  stats.lease_releases = counters_.lease_releases.load();
  stats.lease_releases_unknown = counters_.lease_releases_unknown.load();
  stats.lease_releases_refused = counters_.lease_releases_refused.load();
  stats.leases_active = leases_.size();
  stats.put_refusals_no_space = counters_.put_refusals_no_space.load();
  stats.put_refusals_invalid = counters_.put_refusals_invalid.load();
  stats.eviction_runs = counters_.eviction_runs.load();
  stats.eviction_scanned = counters_.eviction_scanned.load();
  {
    MutexLock lock(rate_mu_);
    if (eviction_samples_.size() >= 2) {
      const auto& [first_at, first] = eviction_samples_.front();
      const auto& [last_at, last] = eviction_samples_.back();
      if (last_at > first_at) {
        stats.evictions_per_second =
            static_cast<double>(last - first) * 1e9 / static_cast<double>(last_at - first_at);
      }
    }
  }
  stats.put_revokes = counters_.put_revokes.load();
  stats.client_expiries = counters_.client_expiries.load();
  stats.incarnation = incarnation_;
  stats.recovered_objects = counters_.recovered_objects.load();
  stats.catalog_entries_dropped = counters_.catalog_entries_dropped.load();
  stats.catalog_resets = feed_.resets();
  return stats;
}

}  // namespace larder::master
