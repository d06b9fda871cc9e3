// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/status_history.h"

#include <algorithm>

#include "common/mutex.h"
#include "master/master_state.h"

namespace larder::master {

namespace {

// Counters only grow, except where a restart reset them: a drop counts as nothing.
double Rate(uint64_t before, uint64_t after, double seconds) {
  return after > before ? static_cast<double>(after - before) / seconds : 0.0;
}

}  // namespace

StatusSample SampleStatus(const MasterState& state, int64_t unix_ms, int64_t steady_ns) {
  MasterStats stats = state.Stats();
  StatusSample sample;
  sample.unix_ms = unix_ms;
  sample.steady_ns = steady_ns;
  sample.puts = stats.puts;
  // MasterStats counts hits (leases granted) and misses apart; a sample's gets are both.
  sample.gets = stats.gets + stats.get_misses;
  sample.get_misses = stats.get_misses;
  sample.removes = stats.removes;
  sample.evictions = stats.evictions;
  sample.lease_expiries = stats.lease_expiries;
  sample.tenants = state.TenantStats();
  sample.objects = stats.objects;
  sample.bytes_used = stats.bytes_used;
  sample.bytes_capacity = stats.bytes_capacity;
  for (const auto& [client, traffic] : state.Traffic()) {
    for (const RouteTrafficReport& route : traffic.routes) {
      sample.client_route_bytes[{client, route.route}] += route.bytes;
    }
  }
  return sample;
}

StatusPoint Between(const StatusSample& before, const StatusSample& after) {
  StatusPoint point;
  point.unix_ms = after.unix_ms;
  point.seconds = static_cast<double>(after.steady_ns - before.steady_ns) / 1e9;
  const double s = point.seconds;
  point.puts_per_s = Rate(before.puts, after.puts, s);
  point.gets_per_s = Rate(before.gets, after.gets, s);
  point.removes_per_s = Rate(before.removes, after.removes, s);
  point.ops_per_s = point.puts_per_s + point.gets_per_s + point.removes_per_s;
  point.evictions_per_s = Rate(before.evictions, after.evictions, s);
  point.lease_expiries_per_s = Rate(before.lease_expiries, after.lease_expiries, s);
  if (after.gets > before.gets) {
    const uint64_t gets = after.gets - before.gets;
    const uint64_t misses =
        std::min(gets, after.get_misses - std::min(after.get_misses, before.get_misses));
    point.get_hit_rate = static_cast<double>(gets - misses) / static_cast<double>(gets);
  }
  // Each tenant on its own (one may look up and another not); one new in the interval counts
  // from zero (its counts start when the master first sees it).
  std::vector<std::pair<std::string, TenantTraffic>> tenants;
  for (const auto& [name, traffic] : after.tenants.tenants) {
    auto it = std::lower_bound(before.tenants.tenants.begin(), before.tenants.tenants.end(), name,
                               [](const auto& row, const std::string& n) { return row.first < n; });
    const bool seen = it != before.tenants.tenants.end() && it->first == name;
    tenants.emplace_back(name, traffic.Since(seen ? it->second : TenantTraffic{}));
  }
  point.hit_rate = ServingHitRate(tenants, after.tenants.others.Since(before.tenants.others));
  point.objects = after.objects;
  point.bytes_used = after.bytes_used;
  point.bytes_capacity = after.bytes_capacity;
  for (const auto& [client_route, bytes] : after.client_route_bytes) {
    // A (client, route) new in this interval adds nothing yet: its first report may count what
    // moved long before (a client's counters outlive a master restart).
    auto it = before.client_route_bytes.find(client_route);
    double rate = it == before.client_route_bytes.end() ? 0.0 : Rate(it->second, bytes, s);
    point.route_bytes_per_s[client_route.second] += rate;
  }
  return point;
}

StatusHistory::StatusHistory(size_t max_samples) : max_samples_(std::max<size_t>(max_samples, 2)) {}

void StatusHistory::Record(StatusSample sample) {
  MutexLock lock(mu_);
  if (!samples_.empty() && sample.steady_ns <= samples_.back().steady_ns) return;
  samples_.push_back(std::move(sample));
  while (samples_.size() > max_samples_) samples_.pop_front();
}

std::vector<StatusPoint> StatusHistory::Points() const {
  MutexLock lock(mu_);
  std::vector<StatusPoint> points;
  for (size_t i = 1; i < samples_.size(); ++i) {
    points.push_back(Between(samples_[i - 1], samples_[i]));
  }
  return points;
}

std::optional<StatusPoint> StatusHistory::Latest() const {
  MutexLock lock(mu_);
  if (samples_.size() < 2) return std::nullopt;
  return Between(samples_[samples_.size() - 2], samples_.back());
}

}  // namespace larder::master
