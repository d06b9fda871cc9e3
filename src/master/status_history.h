// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

// The master's recent history, for the status page and GET /api/history: a sample of its
// cumulative counters every second or so (MasterServer takes them), and the rates between
// consecutive samples. Thread-safe.

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "master/tenant_stats.h"

namespace larder::master {

class MasterState;

struct StatusSample {
  int64_t unix_ms = 0;    // wall clock, for the page's time axis
  int64_t steady_ns = 0;  // a monotonic clock, for the rates
  // Keys: `gets` counts every key asked of GetReplicas, hit or miss; `get_misses` the misses.
  uint64_t puts = 0, gets = 0, get_misses = 0, removes = 0, evictions = 0, lease_expiries = 0;
  // Lookups and gets by tenant, for the hit rate the serving engines see (tenant_stats.h).
  TenantCounters::Snapshot tenants;
  uint64_t objects = 0, bytes_used = 0, bytes_capacity = 0;
  // Bytes the clients' engines reported moving, by (client, route). A client's counters start
  // over when the client does, so each is differenced on its own: a drop counts as nothing, and
  // so does a pair's first interval.
  std::map<std::pair<std::string, std::string>, uint64_t> client_route_bytes;
};

// What happened between two samples.
struct StatusPoint {
  int64_t unix_ms = 0;  // the end of the interval
  double seconds = 0;   // its length
  double puts_per_s = 0, gets_per_s = 0, removes_per_s = 0, ops_per_s = 0;
  double evictions_per_s = 0, lease_expiries_per_s = 0;
  // The hit rate the serving engines saw (ServingHitRate: their lookups', where they look up),
  // and the gets' own; none when nothing was asked.
  std::optional<double> hit_rate, get_hit_rate;
  uint64_t objects = 0, bytes_used = 0, bytes_capacity = 0;  // at the end
  std::map<std::string, double> route_bytes_per_s;           // summed over the clients
};

// The state's counters now.
StatusSample SampleStatus(const MasterState& state, int64_t unix_ms, int64_t steady_ns);
// The rates from `before` to `after`. REQUIRES: after.steady_ns > before.steady_ns.
StatusPoint Between(const StatusSample& before, const StatusSample& after);

class StatusHistory {
 public:
  // Keeps the last `max_samples` samples (at least 2).
  explicit StatusHistory(size_t max_samples = 301);
  // A sample not later than the last one is ignored.
  void Record(StatusSample sample);
  // One point per pair of consecutive samples, oldest first.
  std::vector<StatusPoint> Points() const;
  // The newest point, if there are two samples yet.
  std::optional<StatusPoint> Latest() const;

 private:
  const size_t max_samples_;
  mutable Mutex mu_;
  std::deque<StatusSample> samples_ LARDER_GUARDED_BY(mu_);
};

}  // namespace larder::master
