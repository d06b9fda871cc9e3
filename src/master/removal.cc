// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// MasterState: removals a client or an operator asks for (by key, of a whole tenant, by pattern).
#include <re2/re2.h>

#include "common/logging.h"
#include "common/mutex.h"
#include "master/master_state.h"

namespace larder::master {

Result<std::vector<Status>> MasterState::BatchRemove(const std::string& client_id,
                                                     std::span<const std::string_view> keys,
                                                     bool force, std::string_view segment,
                                                     std::chrono::milliseconds unused_for) {
  LARDER_RETURN_IF_ERROR(CheckBatchSize(keys.size(), "keys"));
  LARDER_RETURN_IF_ERROR(LookupSlot(client_id).status());
  if (unused_for < std::chrono::milliseconds{0} || unused_for > kMaxUnusedFor) {
    return InvalidArgumentError(
        "unused_for of " + std::to_string(unused_for.count()) + " ms is outside 0.." +
        std::to_string(std::chrono::milliseconds(kMaxUnusedFor).count()) + " ms");
  }
  std::vector<Status> results(keys.size());
  std::optional<PoolSegmentId> on_segment;
  if (!segment.empty()) {
    std::optional<SegmentTable::NameHolder> holder =
        segment.size() <= kMaxNameBytes ? segments_.FindByName(std::string(segment)) : std::nullopt;
    if (!holder) {
      results.assign(keys.size(),
                     NotFoundError("no segment named " + QuoteKey(segment) + " is mounted"));
      return results;
    }
    on_segment = holder->segment_id;
  }
  int64_t now = Now();
  // Objects whose last use is above this tick were put or read within `unused_for`. Without a
  // sample that old (a young master), every object may have been.
  std::optional<uint64_t> used_after;
  if (unused_for.count() > 0) {
    used_after = TickAtOrBefore(now - std::chrono::nanoseconds(unused_for).count()).value_or(0);
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    const KeyRef ref(keys[i]);
    if (Status invalid = ValidateKey(ref.key); !invalid.ok()) {
      results[i] = std::move(invalid);
      continue;
    }
    {
      Shard& shard = ShardFor(ref);
      MutexLock lock(shard.mu);
      Object* object = shard.Find(ref);
      if (object == nullptr) {
        results[i] = NotFoundError("key " + QuoteKey(ref.key) + " not found");
        continue;
      }
      if (object->state != ObjectState::kComplete) {
        results[i] = UnavailableError("key " + QuoteKey(ref.key) + " is being written; retry later")
                         .WithDetail(ErrorDetail::kBeingWritten);
        continue;
      }
      if (on_segment && !object->HasReplicaOn(*on_segment)) {
        results[i] = NotFoundError("key " + QuoteKey(ref.key) + " has no replica on segment " +
                                   QuoteKey(segment));
        continue;
      }
      if (!force && object->Leased(now)) {
        results[i] =
            UnavailableError("key " + QuoteKey(ref.key) + " is leased to a reader for another " +
                             std::to_string((object->lease_until - now) / 1000000 + 1) +
                             " ms; retry later")
                .WithDetail(ErrorDetail::kLeased);
        continue;
      }
      if (used_after && object->last_access > *used_after) {
        results[i] =
            UnavailableError("key " + QuoteKey(ref.key) + " was put or read within the last " +
                             std::to_string(unused_for.count()) + " ms; retry later")
                .WithDetail(ErrorDetail::kLeased);
        continue;
      }
      if (on_segment && object->replica_count > 1) {
        DropReplicaLocked(object, *on_segment, now);
        continue;
      }
      ReleaseLocked(shard, object, now);
    }
    counters_.removes.fetch_add(1, std::memory_order_relaxed);
  }
  return results;
}

Result<RemoveAllOutcome> MasterState::RemoveAll(const std::string& client_id,
                                                std::string_view tenant, bool force) {
  LARDER_RETURN_IF_ERROR(LookupSlot(client_id).status());
  LARDER_RETURN_IF_ERROR(ValidateTenant(tenant));
  return RemoveWhere(tenant, force, [](std::string_view) { return true; });
}

Result<RemoveAllOutcome> MasterState::RemoveByRegex(const std::string& client_id,
                                                    std::string_view tenant,
                                                    std::string_view pattern, bool force) {
  LARDER_RETURN_IF_ERROR(LookupSlot(client_id).status());
  LARDER_RETURN_IF_ERROR(ValidateTenant(tenant));
  if (pattern.size() > kMaxRegexBytes) {
    return InvalidArgumentError("pattern of " + std::to_string(pattern.size()) +
                                " bytes exceeds the maximum of " + std::to_string(kMaxRegexBytes));
  }
  RE2::Options re2_options;
  re2_options.set_log_errors(false);
  const RE2 regex(re2::StringPiece(pattern.data(), pattern.size()), re2_options);
  if (!regex.ok()) return InvalidArgumentError("invalid pattern: " + regex.error());
  return RemoveWhere(tenant, force, [&regex](std::string_view key) {
    return RE2::FullMatch(re2::StringPiece(key.data(), key.size()), regex);
  });
}

RemoveAllOutcome MasterState::RemoveWhere(std::optional<std::string_view> tenant, bool force,
                                          absl::FunctionRef<bool(std::string_view)> match,
                                          PoolSegmentId on_segment) {
  RemoveAllOutcome outcome;
  int64_t now = Now();
  for (size_t s = 0; s < shard_count_; ++s) {
    Shard& shard = shards_[s];
    std::vector<FreedReplica> freed, leased;
    int64_t leased_until = 0;
    {
      MutexLock lock(shard.mu);
      size_t removed = shard.EraseIf([&](const Object* object) {
        if (object->state != ObjectState::kComplete) return false;
        if (on_segment != 0 && !object->HasReplicaOn(on_segment)) return false;
        std::optional<std::string_view> key =
            tenant ? KeyInTenant(object->key(), *tenant) : std::optional(object->key());
        if (!key.has_value() || !match(*key)) return false;
        std::vector<FreedReplica>* into = &freed;
        if (object->Leased(now)) {
          if (!force) {
            ++outcome.skipped_leased;
            return false;
          }
          into = &leased;
          leased_until = std::max(leased_until, object->lease_until);
        }
        LogRemovedLocked(object, into);
        return true;
      });
      objects_.fetch_sub(removed, std::memory_order_relaxed);
      outcome.removed += removed;
    }
    FreeReplicas(freed);
    // One entry for the shard's leased objects, held until the last of their leases ends.
    if (!leased.empty()) Quarantine(std::move(leased), leased_until);
  }
  // Disk copies go too (those of keys removed above, and those with no object in memory).
  if (on_segment == 0 && disk_.active()) {
    disk_.InvalidateIf([&](std::string_view whole) {
      std::optional<std::string_view> key =
          tenant ? KeyInTenant(whole, *tenant) : std::optional(whole);
      return key.has_value() && match(*key);
    });
  }
  counters_.removes.fetch_add(outcome.removed, std::memory_order_relaxed);
  return outcome;
}

}  // namespace larder::master
