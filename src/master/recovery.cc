// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// What lets the cache outlive a master: mounts that bring catalogs (rebuilds), the recovery
// window, takeovers of a segment name from a process that is gone, and the reads of the catalog
// feed (SyncCatalog).
//
// A rebuild of a catalog of n entries costs O(n log n): two sorts of the entries (by offset, to
// find overlaps and take the ranges in one ascending run of the allocator; by hash, to find
// duplicate keys and visit each shard once), then one lock of each shard, in which its entries are
// inserted in last_access order and merged into its LRU lists in one walk.

#include <algorithm>
#include <numeric>

#include "common/env.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "master/master_state.h"

namespace larder::master {

namespace {

int64_t ToNanos(std::chrono::milliseconds d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

// Access ticks from a catalog are the client's word: capped, so that one cannot push the
// master's tick near its end.
constexpr uint64_t kMaxTickHint = uint64_t{1} << 62;

// The REMOVE of a catalog entry. A refused entry's key may be longer than any key: it is named
// by its first kMaxKeyBytes bytes.
LoggedChange RemovalOf(const CatalogEntry& entry) {
  LoggedChange change;
  change.kind = CatalogChangeKind::kRemove;
  change.key = std::string_view(entry.key).substr(0, kMaxKeyBytes);
  change.offset = entry.offset;
  change.size = entry.size;
  return change;
}

}  // namespace

struct MasterState::PreparedCatalog {
  const std::vector<CatalogEntry>* catalog = nullptr;
  std::vector<size_t> hashes;  // of each entry's key (0 for refused ones)
  // The entries that passed the checks in hash order, which groups them by shard.
  std::vector<uint32_t> by_hash;
  // The same in ascending offset order, and their ranges (in that order).
  std::vector<uint32_t> accepted;
  std::vector<ByteRange> ranges;
  // Filled by the mount: the allocation of each of `ranges`.
  std::vector<std::optional<OffsetAllocator::Allocation>> reserved;
  // The entries that failed the checks.
  std::vector<uint32_t> refused;
};

MasterState::PreparedCatalog MasterState::PrepareCatalog(const SegmentMount& mount) const {
  PreparedCatalog prepared;
  const std::vector<CatalogEntry>& catalog = mount.catalog;
  prepared.catalog = &catalog;
  prepared.hashes.assign(catalog.size(), 0);
  const uint64_t alignment = options_.allocation_alignment;
  const uint64_t capacity = mount.size / alignment * alignment;  // what the allocator can hand out
  const size_t max_key = std::min(options_.max_key_size, kMaxKeyBytes);
  std::vector<uint8_t> refused(catalog.size(), 0);
  // Sorts work on (sort key, entry) pairs, never through the entries: a catalog of a million
  // entries is 70 MB, and a comparison that reads it misses the cache.
  std::vector<std::pair<size_t, uint32_t>> by_hash;
  by_hash.reserve(catalog.size());
  for (uint32_t i = 0; i < catalog.size(); ++i) {
    const CatalogEntry& entry = catalog[i];
    const bool ok = !entry.key.empty() && entry.key.size() <= max_key && entry.size > 0 &&
                    entry.offset % alignment == 0 && entry.offset < capacity &&
                    entry.size <= capacity - entry.offset &&
                    (entry.size + alignment - 1) / alignment * alignment <= capacity - entry.offset;
    if (!ok) {
      refused[i] = 1;
      continue;
    }
    prepared.hashes[i] = std::hash<std::string_view>{}(entry.key);
    by_hash.emplace_back(prepared.hashes[i], i);
  }
  // A key twice in one catalog: the owner's catalog is confused about it, so neither is trusted.
  // Equal keys have equal hashes: each run of equal hashes is checked for equal keys.
  std::sort(by_hash.begin(), by_hash.end());
  for (size_t run = 0; run < by_hash.size();) {
    size_t end = run + 1;
    while (end < by_hash.size() && by_hash[end].first == by_hash[run].first) ++end;
    if (end - run > 1) {
      // Rare (a collision or a duplicate): order the run by key, so that equal keys are adjacent
      // however many keys collide.
      std::sort(by_hash.begin() + static_cast<ptrdiff_t>(run),
                by_hash.begin() + static_cast<ptrdiff_t>(end), [&](const auto& a, const auto& b) {
                  return catalog[a.second].key < catalog[b.second].key;
                });
      for (size_t k = run; k + 1 < end; ++k) {
        if (catalog[by_hash[k].second].key == catalog[by_hash[k + 1].second].key) {
          refused[by_hash[k].second] = refused[by_hash[k + 1].second] = 1;
        }
      }
    }
    run = end;
  }
  // Overlapping ranges: at most one of them can hold the bytes its entry names, and which one is
  // not known, so the whole group goes. Ranges are compared as the allocator holds them, rounded
  // up to the alignment.
  std::vector<std::pair<uint64_t, uint32_t>> by_offset;
  by_offset.reserve(by_hash.size());
  for (const auto& [hash, i] : by_hash) {
    if (refused[i] == 0) by_offset.emplace_back(catalog[i].offset, i);
  }
  std::sort(by_offset.begin(), by_offset.end());
  auto rounded_end = [&](uint32_t i) {
    return catalog[i].offset + (catalog[i].size + alignment - 1) / alignment * alignment;
  };
  for (size_t group = 0; group < by_offset.size();) {
    size_t end = group + 1;
    uint64_t group_end = rounded_end(by_offset[group].second);
    while (end < by_offset.size() && by_offset[end].first < group_end) {
      group_end = std::max(group_end, rounded_end(by_offset[end].second));
      ++end;
    }
    if (end - group > 1) {
      for (size_t k = group; k < end; ++k) refused[by_offset[k].second] = 1;
    }
    group = end;
  }
  prepared.accepted.reserve(by_offset.size());
  prepared.ranges.reserve(by_offset.size());
  for (const auto& [offset, i] : by_offset) {
    if (refused[i] != 0) continue;
    prepared.accepted.push_back(i);
    prepared.ranges.push_back(ByteRange{offset, catalog[i].size});
  }
  prepared.by_hash.reserve(prepared.accepted.size());
  for (const auto& [hash, i] : by_hash) {
    if (refused[i] == 0) prepared.by_hash.push_back(i);
  }
  for (uint32_t i = 0; i < catalog.size(); ++i) {
    if (refused[i] != 0) prepared.refused.push_back(i);
  }
  return prepared;
}

MountOutcome MasterState::MountOne(const MountCaller& caller, uint32_t slot,
                                   const SegmentMount& mount) {
  MountOutcome outcome;
  // A name held by another client: refused, unless the holder is provably gone. Decided before
  // any work on the catalog, which a refused caller brings again on every attempt.
  if (std::optional<SegmentTable::NameHolder> holder = segments_.FindByName(mount.name);
      holder.has_value() && holder->client_slot != slot) {
    if (!MayTakeOver(caller, *holder, mount.name, &outcome)) return outcome;
    if (segments_.Unmount(holder->segment_id, holder->client_slot).ok()) {
      const PoolSegmentId gone = holder->segment_id;
      DropSegments(std::span(&gone, 1), 0);
      Log().warn(
          "segment '{}' taken over by client {} from client {}, whose process is gone: "
          "its objects were dropped",
          mount.name, caller.client_id, holder->client_id);
    }
  }
  const bool has_catalog = !mount.catalog.empty();
  const bool own_catalog = has_catalog && mount.catalog_incarnation == incarnation_;
  // A catalog of another incarnation is rebuilt only in this master's recovery window, which the
  // first one opens. One that comes after the window closed is from a client that stayed away
  // longer than every live client needed to come back (its objects would now shadow what was put
  // since), or a claim made when nothing is being rebuilt: ignored like a catalog of this master.
  const bool late_catalog = has_catalog && !own_catalog && RecoveryWindowClosed(Now());
  const bool ignored_catalog = own_catalog || late_catalog;
  PreparedCatalog prepared;
  if (has_catalog && !ignored_catalog) prepared = PrepareCatalog(mount);
  MountPreparation preparation;
  preparation.reserve = prepared.ranges;
  preparation.reserved = &prepared.reserved;
  // The log exists before any put can place a replica in the segment, and starts with the
  // REMOVEs of the entries refused so far, before any ADD that may reuse their ranges.
  preparation.on_mount = [&](PoolSegmentId id) {
    feed_.AddSegment(id, ignored_catalog, has_catalog, mount.verifies_catalog);
    for (uint32_t i : prepared.refused) feed_.Append(id, RemovalOf(mount.catalog[i]));
    for (size_t k = 0; k < prepared.reserved.size(); ++k) {
      if (!prepared.reserved[k].has_value()) {
        feed_.Append(id, RemovalOf(mount.catalog[prepared.accepted[k]]));
      }
    }
  };
  Result<PoolSegmentId> mounted =
      segments_.Mount(slot, caller.client_id, caller.host_id, mount, preparation);
  if (!mounted.ok()) {
    outcome.status = mounted.status();
    return outcome;
  }
  outcome.segment_id = *mounted;
  {
    MutexLock lock(clients_mu_);
    claims_.erase(mount.name);
  }
  if (ignored_catalog) {
    outcome.recovery.dropped = mount.catalog.size();
    counters_.catalog_entries_dropped.fetch_add(mount.catalog.size(), std::memory_order_relaxed);
  } else if (has_catalog) {
    OpenRecoveryWindow(Now());
    outcome.recovery = RebuildObjects(*mounted, slot, prepared);
  }
  if (!has_catalog) {
    Log().info("segment '{}' ({}) mounted by {}", mount.name, FormatByteSize(mount.size),
               caller.client_id);
  } else {
    Log().info(
        "segment '{}' ({}) mounted by {}: {} object(s) restored, {} catalog entries "
        "dropped{}",
        mount.name, FormatByteSize(mount.size), caller.client_id, outcome.recovery.restored,
        outcome.recovery.dropped,
        own_catalog    ? " (a catalog of this master)"
        : late_catalog ? " (a catalog that came after the recovery window)"
                       : "");
  }
  return outcome;
}

bool MasterState::MayTakeOver(const MountCaller& caller, const SegmentTable::NameHolder& holder,
                              const std::string& name, MountOutcome* refusal) {
  const int64_t now = Now();
  MutexLock lock(clients_mu_);
  auto it = clients_.find(holder.client_id);
  // No longer registered: it expired a moment ago, and its segment is going.
  if (it == clients_.end() || it->second.slot != holder.client_slot) return true;
  const ClientRecord& record = it->second;
  if (caller.take_over_pid != 0 && caller.take_over_pid == record.pid &&
      caller.host_id == record.host_id) {
    claims_.erase(name);
    Log().warn("client {} on host {} says process {} of client {} is gone: takes over '{}'",
               caller.client_id, caller.host_id, record.pid, holder.client_id, name);
    return true;
  }
  auto [claim, fresh] = claims_.try_emplace(name);
  if (fresh || claim->second.client_id != caller.client_id) {
    claim->second = NameClaim{caller.client_id, now};
  } else if (record.last_seen > claim->second.since) {
    claim->second.since = now;  // the holder is alive: its silence counts from here
  } else if (now - claim->second.since >= ToNanos(options_.client_ttl) / 3) {
    Log().warn("client {} silent for {} ms since client {} asked for its segment '{}': taken over",
               holder.client_id, (now - record.last_seen) / 1'000'000, caller.client_id, name);
    claims_.erase(claim);
    return true;
  }
  std::string message = "segment '";
  message += name;
  message += "' is held by client ";
  message += holder.client_id;
  message += " (host ";
  message += record.host_id;
  message += ", pid ";
  message += std::to_string(record.pid);
  message +=
      "); it is taken over once that process is shown gone (take_over_pid from the same "
      "host) or silent for ";
  message += std::to_string(options_.client_ttl.count() / 3);
  message += " ms";
  refusal->status = AlreadyExistsError(std::move(message));
  refusal->holder_host_id = record.host_id;
  refusal->holder_pid = record.pid;
  return false;
}

CatalogRecovery MasterState::RebuildObjects(PoolSegmentId segment, uint32_t slot,
                                            PreparedCatalog& prepared) {
  const std::vector<CatalogEntry>& catalog = *prepared.catalog;
  CatalogRecovery recovery;
  recovery.dropped = prepared.refused.size();
  std::vector<OffsetAllocator::Handle> handles(catalog.size(), OffsetAllocator::kInvalidHandle);
  for (size_t k = 0; k < prepared.accepted.size(); ++k) {
    if (prepared.reserved[k].has_value()) {
      handles[prepared.accepted[k]] = prepared.reserved[k]->handle;
    } else {
      ++recovery.dropped;  // its REMOVE was logged at the mount
    }
  }
  auto shard_of = [&](uint32_t i) {
    return static_cast<size_t>(&ShardFor(KeyRef(catalog[i].key, prepared.hashes[i])) -
                               shards_.get());
  };
  const int64_t now = Now();
  const int64_t max_soft_pin = ToNanos(options_.max_soft_pin_ttl);
  uint64_t largest_tick = 0;
  std::vector<std::pair<uint64_t, uint32_t>> run_order;  // (last_access, entry) of one shard
  std::vector<Object*> unpinned, soft_pinned;
  std::vector<int64_t> soft_pin_until;
  std::vector<FreedReplica> refused;
  // In hash order the entries come grouped by shard (a shard is a range of the hash's high half);
  // each shard's are inserted least recently used first, under one lock of the shard.
  const std::vector<uint32_t>& by_hash = prepared.by_hash;
  for (size_t run = 0; run < by_hash.size();) {
    const size_t shard_index = shard_of(by_hash[run]);
    size_t end = run + 1;
    while (end < by_hash.size() && shard_of(by_hash[end]) == shard_index) ++end;
    run_order.clear();
    for (size_t k = run; k < end; ++k) {
      const uint32_t i = by_hash[k];
      if (handles[i] != OffsetAllocator::kInvalidHandle) {
        run_order.emplace_back(catalog[i].last_access, i);
      }
    }
    std::sort(run_order.begin(), run_order.end());
    Shard& shard = shards_[shard_index];
    unpinned.clear();
    soft_pinned.clear();
    soft_pin_until.clear();
    refused.clear();
    uint64_t created = 0;
    {
      MutexLock lock(shard.mu);
      shard.objects.reserve(shard.objects.size() + run_order.size());
      for (size_t k = 0; k < run_order.size(); ++k) {
        if (k + 4 < run_order.size()) {
          // The entries are visited in no order of the catalog's: start the misses early.
          const CatalogEntry& ahead = catalog[run_order[k + 4].second];
          __builtin_prefetch(&ahead);
          __builtin_prefetch(ahead.key.data());
        }
        const uint32_t i = run_order[k].second;
        const CatalogEntry& entry = catalog[i];
        const StoredReplica replica{segment, entry.offset, handles[i]};
        const KeyRef ref(entry.key, prepared.hashes[i]);
        auto refuse = [&] {
          // Logged before the range is freed, and the range held until the owner applied it.
          refused.push_back(
              FreedReplica{replica, entry.size, feed_.Append(segment, RemovalOf(entry))});
        };
        if (!shard.conflicted_keys.empty() && shard.conflicted_keys.contains(entry.key)) {
          refuse();
          continue;
        }
        Object* known = shard.Find(ref);
        if (known == nullptr) {
          Object* object = shard.Insert(ref, std::span(&replica, 1));
          object->size = entry.size;
          object->state = ObjectState::kComplete;
          object->restored = true;
          object->lease_until = 0;
          object->writer = slot;
          object->pinned = entry.pinned;
          object->last_access = std::min(entry.last_access, kMaxTickHint);
          largest_tick = std::max(largest_tick, object->last_access);
          if (entry.pinned) {
            // Hard-pinned objects are on no list.
          } else if (entry.soft_pin_remaining_ms > 0) {
            soft_pinned.push_back(object);
            const auto ms = static_cast<int64_t>(
                std::min<uint64_t>(entry.soft_pin_remaining_ms, INT64_MAX / 1'000'000));
            soft_pin_until.push_back(now + std::min(ms * 1'000'000, max_soft_pin));
          } else {
            unpinned.push_back(object);
          }
          ++created;
          ++recovery.restored;
          continue;
        }
        if (known->state != ObjectState::kComplete || !known->restored) {
          // A put to this master wrote the key (or is writing it): its bytes are the truth, and
          // an older claim is neither added beside them nor put in their place.
          refuse();
          continue;
        }
        if (known->size != entry.size) {
          // Two owners disagree on what the key holds: neither copy is trusted, now or in any
          // catalog that comes later in this window.
          ReleaseLocked(shard, known, now);
          shard.conflicted_keys.emplace(entry.key);
          conflicted_keys_.store(true, std::memory_order_relaxed);
          refuse();
          continue;
        }
        if (known->Leased(now) || known->replica_count >= kMaxReplicas) {
          // A reader's lease holds the object itself, which a new replica would replace.
          refuse();
          continue;
        }
        shard.AddReplica(known, replica);
        ++recovery.restored;
      }
      shard.MergeInOrder(unpinned, ObjectList::kLru);
      shard.MergeInOrder(soft_pinned, ObjectList::kSoftPinned);
      for (size_t k = 0; k < soft_pinned.size(); ++k) {
        shard.SetSoftPin(soft_pinned[k], soft_pin_until[k]);
      }
    }
    objects_.fetch_add(created, std::memory_order_relaxed);
    recovery.dropped += refused.size();
    FreeReplicas(refused);
    run = end;
  }
  // New uses are newer than every restored one.
  for (uint64_t tick = tick_.load(); tick <= largest_tick;) {
    if (tick_.compare_exchange_weak(tick, largest_tick + 1)) break;
  }
  counters_.recovered_objects.fetch_add(recovery.restored, std::memory_order_relaxed);
  counters_.catalog_entries_dropped.fetch_add(recovery.dropped, std::memory_order_relaxed);
  return recovery;
}

bool MasterState::RecoveryWindowClosed(int64_t now) const {
  const int64_t until = rebuilding_until_.load();
  return until != 0 && now >= until;
}

void MasterState::OpenRecoveryWindow(int64_t now) {
  MutexLock lock(recovery_mu_);
  if (rebuilding_until_.load() != 0) return;  // once per master: see MountOne
  const int64_t ttl = ToNanos(options_.client_ttl);
  const int64_t until = now < started_ + ttl ? started_ + ttl : now + ttl;
  rebuilding_until_.store(until);
  Log().info(
      "rebuilding from the clients' catalogs: gets of absent keys answer Unavailable for "
      "{} ms",
      (until - now) / 1'000'000);
}

void MasterState::EndRecoveryWindow(int64_t now) {
  if (!conflicted_keys_.load(std::memory_order_relaxed)) return;
  {
    MutexLock lock(recovery_mu_);
    if (now < rebuilding_until_.load()) return;
    conflicted_keys_.store(false);
  }
  for (size_t s = 0; s < shard_count_; ++s) {
    MutexLock lock(shards_[s].mu);
    shards_[s].conflicted_keys.clear();
  }
}

Status MasterState::RebuildingError(std::string_view key, int64_t left_ns) {
  std::string message(kRebuildingMessage);
  message += " (until ";
  message += std::to_string((left_ns + 999'999) / 1'000'000);
  message += " ms from now); retry: key ";
  message += QuoteKey(key);
  message += " is not stored yet";
  return UnavailableError(std::move(message)).WithDetail(ErrorDetail::kRebuilding);
}

void MasterState::LogAddedLocked(Object* object, int64_t soft_pin_until) {
  LoggedChange change;
  change.kind = CatalogChangeKind::kAdd;
  change.key = object->key();
  change.size = object->size;
  change.pinned = object->pinned;
  change.soft_pin_until = soft_pin_until;
  change.last_access = object->last_access;
  for (StoredReplica& replica : object->mutable_replicas()) {
    change.offset = replica.offset;
    replica.added = CatalogFeed::AddedMark(feed_.Append(replica.segment_id, change));
  }
}

void MasterState::LogRemovedLocked(const Object* object, std::vector<FreedReplica>* freed) {
  const bool logged = object->state == ObjectState::kComplete;  // others were never in a catalog
  LoggedChange change;
  change.kind = CatalogChangeKind::kRemove;
  change.key = object->key();
  change.size = object->size;
  for (const StoredReplica& replica : object->replicas()) {
    uint64_t seq = 0;
    if (logged) {
      change.offset = replica.offset;
      seq = feed_.Append(replica.segment_id, change);
    }
    freed->push_back(FreedReplica{replica, object->size, seq});
  }
}

void MasterState::SnapshotShard(PoolSegmentId segment, size_t shard_index) {
  Shard& shard = shards_[shard_index];
  MutexLock lock(shard.mu);
  for (Object* object : shard.objects) {
    if (object->state != ObjectState::kComplete) continue;
    for (StoredReplica& replica : object->mutable_replicas()) {
      if (replica.segment_id != segment) continue;
      LoggedChange change;
      change.kind = CatalogChangeKind::kAdd;
      change.key = object->key();
      change.offset = replica.offset;
      change.size = object->size;
      change.pinned = object->pinned;
      change.soft_pin_until = shard.SoftPinUntil(object);
      change.last_access = object->last_access;
      replica.added = CatalogFeed::AddedMark(feed_.AppendSnapshot(segment, change));
    }
  }
}

Result<std::vector<SegmentCatalogChanges>> MasterState::SyncCatalog(
    const std::string& client_id, std::span<const CatalogAck> acks) {
  if (acks.size() > kMaxSegmentsPerMount) {
    return InvalidArgumentError(std::to_string(acks.size()) +
                                " catalog acks in one call; at most " +
                                std::to_string(kMaxSegmentsPerMount));
  }
  LARDER_ASSIGN_OR_RETURN(uint32_t slot, LookupSlot(client_id));
  std::vector<PoolSegmentId> ids = segments_.SegmentsOf(slot);
  std::sort(ids.begin(), ids.end());
  std::vector<SegmentCatalogChanges> replies;
  replies.reserve(ids.size());
  size_t budget = kMaxCatalogChangesPerReply;
  const int64_t now = Now();
  std::vector<StoredReplica> released;  // ranges whose REMOVE the owner has now applied
  for (PoolSegmentId id : ids) {
    uint64_t ack = 0;
    bool full = false;
    for (const CatalogAck& given : acks) {
      if (given.segment_id == id) {
        ack = given.seq;
        full = given.full;
      }
    }
    if (!feed_.Acknowledge(id, ack, full, &released)) continue;  // unmounted meanwhile
    const size_t limit = std::min(kMaxCatalogChangesPerSegment, budget);
    while (std::optional<size_t> shard = feed_.NextSnapshotShard(id, ack, limit)) {
      SnapshotShard(id, *shard);
    }
    SegmentCatalogChanges& reply = replies.emplace_back();
    feed_.Read(id, ack, limit, now, &reply);
    budget -= std::min(budget, reply.changes.size());
  }
  FreeReleased(released);
  return replies;
}

}  // namespace larder::master
