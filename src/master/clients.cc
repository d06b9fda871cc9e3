// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// MasterState: clients and their segments (mounts, unmounts, heartbeats and the traffic they
// report).
#include <optional>

#include "common/logging.h"
#include "common/mutex.h"
#include "master/master_state.h"

namespace larder::master {

std::vector<Result<PoolSegmentId>> MasterState::MountSegments(
    const std::string& client_id, const std::string& host_id,
    std::span<const SegmentMount> segments) {
  std::vector<Result<PoolSegmentId>> results;
  for (MountOutcome& outcome : MountSegments(MountCaller{client_id, host_id}, segments)) {
    if (outcome.status.ok()) {
      results.emplace_back(outcome.segment_id);
    } else {
      results.emplace_back(std::move(outcome.status));
    }
  }
  return results;
}

std::vector<MountOutcome> MasterState::MountSegments(const MountCaller& caller,
                                                     std::span<const SegmentMount> segments) {
  Status invalid;
  if (caller.client_id.empty() || caller.client_id.size() > kMaxNameBytes) {
    invalid =
        InvalidArgumentError("client id must have 1.." + std::to_string(kMaxNameBytes) + " bytes");
  } else if (caller.host_id.size() > kMaxNameBytes) {
    invalid =
        InvalidArgumentError("host id is longer than " + std::to_string(kMaxNameBytes) + " bytes");
  } else if (segments.size() > kMaxSegmentsPerMount) {
    invalid =
        InvalidArgumentError(std::to_string(segments.size()) + " segments in one mount; at most " +
                             std::to_string(kMaxSegmentsPerMount));
  }
  if (!invalid.ok()) {
    std::vector<MountOutcome> refused(std::max<size_t>(segments.size(), 1));
    for (MountOutcome& outcome : refused) outcome.status = invalid;
    return refused;
  }
  uint32_t slot;
  {
    MutexLock lock(clients_mu_);
    auto [it, inserted] = clients_.try_emplace(caller.client_id);
    if (inserted) {
      std::erase_if(expired_clients_, [&](const ExpiredClient& expired) {
        return expired.client_id == caller.client_id;
      });
      it->second.slot = next_client_slot_++;
      it->second.host_id = caller.host_id;
      Log().info("client {} (host {}, pid {}) registered", caller.client_id, caller.host_id,
                 caller.pid);
    }
    it->second.last_seen = Now();
    if (caller.pid != 0) it->second.pid = caller.pid;
    slot = it->second.slot;
  }
  std::vector<MountOutcome> outcomes;
  outcomes.reserve(segments.size());
  for (const SegmentMount& mount : segments) outcomes.push_back(MountOne(caller, slot, mount));
  return outcomes;
}

Result<std::vector<Status>> MasterState::UnmountSegments(const std::string& client_id,
                                                         std::span<const PoolSegmentId> segments,
                                                         bool unregister) {
  LARDER_ASSIGN_OR_RETURN(uint32_t slot, LookupSlot(client_id));
  std::vector<Status> results;
  std::vector<PoolSegmentId> unmounted;
  for (PoolSegmentId id : segments) {
    results.push_back(segments_.Unmount(id, slot));
    if (results.back().ok()) unmounted.push_back(id);
  }
  if (unregister) {
    {
      MutexLock lock(clients_mu_);
      clients_.erase(client_id);
    }
    for (PoolSegmentId id : segments_.SegmentsOf(slot)) {
      if (segments_.Unmount(id, slot).ok()) unmounted.push_back(id);
    }
    ForgetTraffic(client_id);
    disk_.ClientGone(client_id);
    Log().info("client {} left", client_id);
  }
  if (!unmounted.empty() || unregister) DropSegments(unmounted, unregister ? slot : 0);
  return results;
}

HeartbeatOutcome MasterState::Heartbeat(const std::string& client_id, ClientTraffic* traffic) {
  HeartbeatOutcome outcome{.segments_version = segments_version_.load()};
  std::optional<uint32_t> revived;
  {
    MutexLock lock(clients_mu_);
    auto it = clients_.find(client_id);
    if (it == clients_.end()) {
      outcome.remount_required = true;
      return outcome;
    }
    it->second.last_seen = Now();
    if (it->second.replaced) {  // alive after all: its segments take puts again
      it->second.replaced = false;
      revived = it->second.slot;
    }
  }
  if (revived) segments_.SetOwnerReplaced(*revived, false);
  if (traffic != nullptr) {
    if (traffic->routes.size() > kMaxTrafficEntries) traffic->routes.resize(kMaxTrafficEntries);
    for (RouteTrafficReport& route : traffic->routes) {
      if (route.peer_client_id.size() > kMaxTrafficLabelBytes) {
        route.peer_client_id.resize(kMaxTrafficLabelBytes);
      }
      if (route.route.size() > kMaxTrafficLabelBytes) route.route.resize(kMaxTrafficLabelBytes);
    }
    MutexLock lock(traffic_mu_);
    auto [last, first] = traffic_.try_emplace(client_id);
    if (!first) traffic_totals_.Add(client_id, last->second, *traffic);
    last->second = std::move(*traffic);
  }
  return outcome;
}

std::vector<std::pair<std::string, ClientTraffic>> MasterState::Traffic() const {
  MutexLock lock(traffic_mu_);
  return {traffic_.begin(), traffic_.end()};
}

std::map<TrafficTotals::Key, TrafficTotals::Counters> MasterState::TrafficByLocality() const {
  MutexLock lock(traffic_mu_);
  return traffic_totals_.totals();
}

void MasterState::ForgetTraffic(const std::string& client_id) {
  MutexLock lock(traffic_mu_);
  traffic_.erase(client_id);
}

}  // namespace larder::master
