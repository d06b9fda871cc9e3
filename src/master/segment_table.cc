// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/segment_table.h"

#include <algorithm>

#include "common/env.h"
#include "common/mutex.h"
#include "master/placement.h"

namespace larder::master {

SegmentTable::SegmentTable(uint64_t id_base, uint64_t alignment, PlacementStrategy strategy)
    : alignment_(alignment), strategy_(strategy), next_id_(id_base + 1) {}

Result<PoolSegmentId> SegmentTable::Mount(uint32_t client_slot, const std::string& client_id,
                                          const std::string& host_id, const SegmentMount& mount,
                                          const MountPreparation& prepare) {
  if (mount.name.empty()) return InvalidArgumentError("segment name is empty");
  if (mount.name.size() > kMaxNameBytes) {
    return InvalidArgumentError("segment name " + QuoteKey(mount.name) + " is longer than " +
                                std::to_string(kMaxNameBytes) + " bytes");
  }
  if (mount.size > kMaxSegmentBytes) {
    return InvalidArgumentError("segment " + QuoteKey(mount.name) + " has size " +
                                std::to_string(mount.size) + ", above the maximum of " +
                                FormatByteSize(kMaxSegmentBytes));
  }
  if (mount.size < alignment_) {
    return InvalidArgumentError("segment '" + mount.name + "' has size " +
                                std::to_string(mount.size) + ", below the minimum of " +
                                std::to_string(alignment_) + " bytes");
  }
  if (mount.base + mount.size < mount.base) {
    return InvalidArgumentError("segment '" + mount.name + "' wraps the address space");
  }
  // The allocator is built, and a catalog's ranges taken, before the lock: a rebuild of a
  // million objects does not hold up every put meanwhile. Nobody sees the segment before it is
  // in the table.
  SegmentView view;
  view.name = mount.name;
  view.client_id = client_id;
  view.host_id = host_id;
  view.base = mount.base;
  view.size = mount.size;
  view.descriptor = mount.descriptor;
  auto segment = std::make_unique<Segment>(std::move(view), client_slot, alignment_);
  std::vector<std::optional<OffsetAllocator::Allocation>> reserved;
  reserved.reserve(prepare.reserve.size());
  if (!prepare.reserve.empty()) segment->allocator.ReserveBookkeeping(prepare.reserve.size());
  for (const ByteRange& range : prepare.reserve) {
    reserved.push_back(segment->allocator.Reserve(range.offset, range.size));
  }
  MutexLock lock(mu_);
  if (capacity_ + mount.size > kMaxPoolBytes) {
    return ResourceExhaustedError("mounting segment " + QuoteKey(mount.name) +
                                  " would take the pool past " + FormatByteSize(kMaxPoolBytes));
  }
  if (by_name_.contains(mount.name)) {
    return AlreadyExistsError("segment '" + mount.name + "' is already mounted");
  }
  for (const auto& [id, other_segment] : segments_) {
    if (other_segment->client_slot != client_slot) continue;
    const SegmentView& other = other_segment->view;
    if (mount.base < other.base + other.size && other.base < mount.base + mount.size) {
      return AlreadyExistsError("segment '" + mount.name + "' [" + FormatHex(mount.base) + ", +" +
                                std::to_string(mount.size) + ") overlaps mounted segment '" +
                                other.name + "'");
    }
  }
  const PoolSegmentId id = next_id_++;
  segment->view.segment_id = id;
  if (prepare.reserved != nullptr) *prepare.reserved = std::move(reserved);
  if (prepare.on_mount) prepare.on_mount(id);
  segments_.emplace(id, std::move(segment));
  by_name_.emplace(mount.name, id);
  capacity_ += mount.size;
  largest_ = std::max(largest_, mount.size);
  return id;
}

Status SegmentTable::Unmount(PoolSegmentId id, uint32_t client_slot) {
  MutexLock lock(mu_);
  auto it = segments_.find(id);
  if (it == segments_.end()) return NotFoundError("segment " + std::to_string(id) + " is unknown");
  if (it->second->client_slot != client_slot) {
    return PermissionDeniedError("segment '" + it->second->view.name +
                                 "' belongs to another client");
  }
  capacity_ -= it->second->view.size;
  by_name_.erase(it->second->view.name);
  segments_.erase(it);
  largest_ = 0;
  for (const auto& [other_id, segment] : segments_)
    largest_ = std::max(largest_, segment->view.size);
  return Status::Ok();
}

std::optional<SegmentTable::NameHolder> SegmentTable::FindByName(const std::string& name) const {
  MutexLock lock(mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  const Segment& segment = *segments_.at(it->second);
  return NameHolder{it->second, segment.client_slot, segment.view.client_id};
}

std::vector<PoolSegmentId> SegmentTable::SegmentsOf(uint32_t client_slot) const {
  MutexLock lock(mu_);
  std::vector<PoolSegmentId> ids;
  for (const auto& [id, segment] : segments_) {
    if (segment->client_slot == client_slot) ids.push_back(id);
  }
  return ids;
}

Status SegmentTable::SetDraining(PoolSegmentId id, bool draining) {
  MutexLock lock(mu_);
  auto it = segments_.find(id);
  if (it == segments_.end())
    return NotFoundError("segment " + std::to_string(id) + " is not mounted");
  it->second->view.draining = draining;
  return Status::Ok();
}

void SegmentTable::SetOwnerReplaced(uint32_t client_slot, bool replaced) {
  MutexLock lock(mu_);
  for (auto& [id, segment] : segments_) {
    if (segment->client_slot == client_slot) segment->view.owner_replaced = replaced;
  }
}

SegmentTable::Plan SegmentTable::MakePlan(const PutOptions& options, uint32_t writer_slot,
                                          const std::string& writer_host) const {
  Plan plan;
  plan.replicas = std::max<uint32_t>(options.replica_num, 1);
  MutexLock lock(mu_);
  std::vector<PoolSegmentId> ids;
  std::vector<PlacementCandidate> candidates;
  ids.reserve(segments_.size());
  candidates.reserve(segments_.size());
  for (const auto& [id, segment] : segments_) {
    if (segment->view.draining || segment->view.owner_replaced) continue;
    ids.push_back(id);
    candidates.push_back(PlacementCandidate{segment->view.name, segment->client_slot == writer_slot,
                                            segment->view.host_id == writer_host,
                                            segment->allocator.free_bytes(), segment->view.size});
  }
  std::vector<PoolSegmentId> avoided;
  for (size_t index : OrderPlacement(candidates, 0, options.preferred_segments, strategy_)) {
    const bool avoid = std::find(options.avoid_segments.begin(), options.avoid_segments.end(),
                                 ids[index]) != options.avoid_segments.end();
    (avoid ? avoided : plan.order).push_back(ids[index]);
  }
  // With enough other segments the avoided ones are left out: a put evicts in a reachable segment
  // rather than landing where its writer cannot write. Otherwise they come last.
  if (plan.order.size() < plan.replicas) {
    plan.order.insert(plan.order.end(), avoided.begin(), avoided.end());
  }
  return plan;
}

Result<std::vector<StoredReplica>> SegmentTable::Allocate(uint64_t size, const Plan& plan) {
  MutexLock lock(mu_);
  if (segments_.empty()) return ResourceExhaustedError("no segment is mounted");
  if (size > largest_) {
    return InvalidArgumentError("value of " + std::to_string(size) +
                                " bytes is larger than every mounted segment (largest " +
                                std::to_string(largest_) + " bytes)");
  }
  if (plan.replicas > segments_.size()) {
    return InvalidArgumentError(std::to_string(plan.replicas) + " replicas requested but only " +
                                std::to_string(segments_.size()) + " segments are mounted");
  }
  std::vector<StoredReplica> placed;
  placed.reserve(plan.replicas);
  for (PoolSegmentId id : plan.order) {
    auto it = segments_.find(id);
    if (it == segments_.end() || it->second->view.size < size) continue;  // unmounted since
    auto allocation = it->second->allocator.Allocate(size);
    if (!allocation) continue;
    placed.push_back(StoredReplica{id, allocation->offset, allocation->handle});
    if (placed.size() == plan.replicas) return placed;
  }
  for (const StoredReplica& replica : placed) {
    segments_.at(replica.segment_id)->allocator.Free(replica.handle);
  }
  return ResourceExhaustedError("no free range of " + std::to_string(size) + " bytes on " +
                                std::to_string(plan.replicas) + " distinct segments");
}

void SegmentTable::Free(std::span<const StoredReplica> replicas) {
  MutexLock lock(mu_);
  for (const StoredReplica& replica : replicas) {
    auto it = segments_.find(replica.segment_id);
    if (it != segments_.end()) it->second->allocator.Free(replica.handle);
  }
}

SegmentTable::Usage SegmentTable::usage() const {
  MutexLock lock(mu_);
  Usage usage;
  usage.capacity = capacity_;
  usage.segments = segments_.size();
  for (const auto& [id, segment] : segments_) usage.used += segment->allocator.used_bytes();
  return usage;
}

SegmentView SegmentTable::ViewOf(const Segment& segment) const {
  SegmentView view = segment.view;
  view.used = segment.allocator.used_bytes();
  view.objects = segment.allocator.live_allocations();
  return view;
}

std::vector<SegmentView> SegmentTable::List(std::span<const PoolSegmentId> ids) const {
  MutexLock lock(mu_);
  std::vector<SegmentView> views;
  if (ids.empty()) {
    for (const auto& [id, segment] : segments_) views.push_back(ViewOf(*segment));
    std::sort(views.begin(), views.end(), [](const SegmentView& a, const SegmentView& b) {
      return a.segment_id < b.segment_id;
    });
  } else {
    for (PoolSegmentId id : ids) {
      auto it = segments_.find(id);
      if (it != segments_.end()) views.push_back(ViewOf(*it->second));
    }
  }
  return views;
}

}  // namespace larder::master
