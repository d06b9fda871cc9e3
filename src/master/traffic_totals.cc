// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/traffic_totals.h"

#include <algorithm>
#include <utility>

namespace larder::master {

std::string_view LocalityName(Locality locality) {
  return locality == Locality::kSameHost ? "same_host" : "other_host";
}

std::string_view HostOfEngineId(std::string_view engine_id) {
  const size_t fingerprint = engine_id.rfind('/');
  if (fingerprint == std::string_view::npos || fingerprint == 0) return engine_id;
  const size_t pid = engine_id.rfind('/', fingerprint - 1);
  if (pid == std::string_view::npos || pid == 0) return engine_id;
  return engine_id.substr(0, pid);
}

TrafficTotals::TrafficTotals() {
  for (std::string_view route : kTotalledRoutes) {
    for (Locality locality : {Locality::kSameHost, Locality::kOtherHost}) {
      totals_[Key{std::string(route), locality}] = {};
    }
  }
}

void TrafficTotals::Add(std::string_view client_id, const ClientTraffic& previous,
                        const ClientTraffic& report) {
  std::map<std::pair<std::string_view, std::string_view>, const RouteTrafficReport*> before;
  for (const RouteTrafficReport& entry : previous.routes) {
    before[{entry.peer_client_id, entry.route}] = &entry;
  }
  // Each counter only grows for one engine: a smaller value is a report to distrust, not a reset.
  auto grown = [](uint64_t was, uint64_t now) { return now > was ? now - was : 0; };
  const std::string_view host = HostOfEngineId(client_id);
  for (const RouteTrafficReport& entry : report.routes) {
    const bool known = std::find(kTotalledRoutes.begin(), kTotalledRoutes.end(), entry.route) !=
                       kTotalledRoutes.end();
    const Locality locality =
        HostOfEngineId(entry.peer_client_id) == host ? Locality::kSameHost : Locality::kOtherHost;
    Counters& sum = totals_[Key{std::string(known ? entry.route : kOtherRoute), locality}];
    auto it = before.find({entry.peer_client_id, entry.route});
    const RouteTrafficReport zero;
    const RouteTrafficReport& was = it == before.end() ? zero : *it->second;
    sum.requests += grown(was.requests, entry.requests);
    sum.bytes += grown(was.bytes, entry.bytes);
    sum.failures += grown(was.failures, entry.failures);
  }
}

}  // namespace larder::master
