// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "master/types.h"

namespace larder::master {

// Whether the two ends of a transfer ran on one host (equal host ids).
enum class Locality { kSameHost, kOtherHost };
std::string_view LocalityName(Locality locality);  // "same_host", "other_host"

// The routes that TrafficTotals keeps apart, always all of them (a series for each, zero until
// used); a route a client names beyond these is counted as "other". "<route>-staged" is device
// memory that a CPU route moved through pinned host staging (tcp: either end's device memory).
inline constexpr std::array<std::string_view, 9> kTotalledRoutes = {
    "local",      "shm",          "tcp",        "ucx",       "device",
    "tcp-staged", "local-staged", "shm-staged", "ucx-staged"};
inline constexpr std::string_view kOtherRoute = "other";

// The host part of an engine id "<host_id>/<pid>/<fingerprint>" (TransferEngine::id()); the whole
// id when it has not that form. Host ids may hold '/' themselves, hence the last two parts go.
std::string_view HostOfEngineId(std::string_view engine_id);

// Transfer counters of every store client's engine, summed by route and locality: what
// /metrics exports with labels that do not change when clients restart. A client's heartbeat
// reports its engine's counters since that engine started; these totals add what each report
// counts beyond the same client's report before it, so they only grow while the master runs.
// A client's first report to this master adds nothing: it may count bytes moved long before
// (a client outlives a master restart), so what a new client moved before its first report
// (under one heartbeat interval) is not counted.
//
// Not thread-safe: MasterState guards it with the mutex of the reports.
class TrafficTotals {
 public:
  struct Key {
    std::string route;  // one of kTotalledRoutes, or kOtherRoute
    Locality locality = Locality::kSameHost;
    friend auto operator<=>(const Key&, const Key&) = default;
  };
  struct Counters {
    uint64_t requests = 0;
    uint64_t bytes = 0;
    uint64_t failures = 0;
  };

  // Every (route of kTotalledRoutes, locality) at zero.
  TrafficTotals();

  // Adds what `report`, the report of client `client_id`, counts beyond `previous`, that client's
  // report before it. Entries are matched by (peer, route); one absent from `previous` counts in
  // full (its engine had not used that peer and route then); a counter that went back counts
  // nothing.
  void Add(std::string_view client_id, const ClientTraffic& previous, const ClientTraffic& report);

  const std::map<Key, Counters>& totals() const { return totals_; }

 private:
  std::map<Key, Counters> totals_;
};

}  // namespace larder::master
