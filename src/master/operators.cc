// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// MasterState's operator calls (master_state.h, "operators"): lists, removal by prefix, and the
// drain of a segment. No client, no tenant, no lease.
#include <algorithm>
#include <optional>

#include "common/mutex.h"
#include "master/master_state.h"

namespace larder::master {

RemoveAllOutcome MasterState::RemoveByPrefix(std::string_view prefix, bool force) {
  return RemoveWhere(std::nullopt, force,
                     [prefix](std::string_view key) { return key.starts_with(prefix); });
}

std::vector<SegmentView> MasterState::ListSegments(std::span<const PoolSegmentId> ids) const {
  return segments_.List(ids);
}

Result<SegmentView> MasterState::SetDraining(const std::string& segment_name, bool draining) {
  std::optional<SegmentTable::NameHolder> holder = segments_.FindByName(segment_name);
  if (!holder) return NotFoundError("no segment named " + QuoteKey(segment_name) + " is mounted");
  LARDER_RETURN_IF_ERROR(segments_.SetDraining(holder->segment_id, draining));
  const PoolSegmentId id = holder->segment_id;
  std::vector<SegmentView> views = segments_.List(std::span(&id, 1));
  if (views.empty()) return NotFoundError("segment " + QuoteKey(segment_name) + " is gone");
  return std::move(views.front());
}

Result<MasterState::SegmentObjects> MasterState::ListSegmentObjects(const std::string& segment_name,
                                                                    size_t limit) const {
  std::optional<SegmentTable::NameHolder> holder = segments_.FindByName(segment_name);
  if (!holder) return NotFoundError("no segment named " + QuoteKey(segment_name) + " is mounted");
  // The most recently used `limit`, kept bounded while the shards are walked: past 2 * limit,
  // the list is cut back to the newest `limit`.
  std::vector<std::pair<uint64_t, SegmentObject>> found;
  SegmentObjects result;
  auto newest_first = [](const auto& a, const auto& b) { return a.first > b.first; };
  auto cut = [&] {
    if (found.size() <= limit) return;
    std::nth_element(found.begin(), found.begin() + static_cast<ptrdiff_t>(limit), found.end(),
                     newest_first);
    found.resize(limit);
    result.truncated = true;
  };
  for (size_t s = 0; s < shard_count_; ++s) {
    Shard& shard = shards_[s];
    MutexLock lock(shard.mu);
    for (const Object* object : shard.objects) {
      if (object->state != ObjectState::kComplete || !object->HasReplicaOn(holder->segment_id)) {
        continue;
      }
      found.emplace_back(object->last_access,
                         SegmentObject{std::string(object->key()), object->size,
                                       object->replica_count, object->pinned});
      if (found.size() >= 2 * limit) cut();
    }
  }
  cut();
  std::sort(found.begin(), found.end(), newest_first);
  result.objects.reserve(found.size());
  for (auto& [tick, object] : found) result.objects.push_back(std::move(object));
  return result;
}

Result<RemoveAllOutcome> MasterState::RemoveOnSegment(const std::string& segment_name, bool force) {
  std::optional<SegmentTable::NameHolder> holder = segments_.FindByName(segment_name);
  if (!holder) return NotFoundError("no segment named " + QuoteKey(segment_name) + " is mounted");
  const PoolSegmentId id = holder->segment_id;
  std::vector<SegmentView> views = segments_.List(std::span(&id, 1));
  if (views.empty() || !views.front().draining) {
    return FailedPreconditionError("segment " + QuoteKey(segment_name) +
                                   " is not draining: drain it first, so that no put lands there "
                                   "meanwhile");
  }
  return RemoveWhere(
      std::nullopt, force, [](std::string_view) { return true; }, id);
}

std::vector<std::pair<std::string, uint64_t>> MasterState::ListKeys(std::string_view prefix,
                                                                    size_t limit) const {
  std::vector<std::pair<std::string, uint64_t>> keys;
  for (size_t s = 0; s < shard_count_; ++s) {
    Shard& shard = shards_[s];
    MutexLock lock(shard.mu);
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

std::vector<GetOutcome> MasterState::DescribeKeys(std::span<const std::string_view> keys) const {
  std::vector<GetOutcome> items(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const KeyRef ref(keys[i]);
    GetOutcome& outcome = items[i];
    if (Status invalid = ValidateKey(ref.key); !invalid.ok()) {
      outcome.status = std::move(invalid);
      continue;
    }
    Shard& shard = ShardFor(ref);
    MutexLock lock(shard.mu);
    const Object* object = shard.Find(ref);
    if (object == nullptr || object->state != ObjectState::kComplete) {
      outcome.status = NotFoundError("key " + QuoteKey(ref.key) + " not found");
      continue;
    }
    outcome.size = object->size;
    for (const StoredReplica& replica : object->replicas()) {
      outcome.replicas.push_back(ReplicaLocation{replica.segment_id, replica.offset});
    }
  }
  return items;
}

}  // namespace larder::master
