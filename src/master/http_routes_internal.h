// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// What the master's two sets of HTTP routes share: the operator's routes (http_endpoint.cc) and
// the routes of Mooncake's master in its formats (mooncake_routes.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "master/http_endpoint.h"
#include "master/types.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace larder::master {

inline constexpr size_t kMaxKeysListed = 100000;
inline constexpr char kTextFormat[] = "text/plain; version=0.0.4";

// True when the request may see the admin routes; otherwise fills the refusal.
bool AdminAllowed(const HttpAuth& auth, const httplib::Request& request,
                  httplib::Response& response);

// A key or name on a line of its own: printable ASCII as is; other bytes, and backslash, as \xNN
// (so tenant keys show as \x00tenant\x00key, and no key can break a line).
std::string EscapeLine(std::string_view text);

// JSON text, bytes that are not UTF-8 replaced.
std::string Dump(const nlohmann::ordered_json& j);

// The gauges that any of `reports` (pairs of a client id and its ClientTraffic) names, each with
// the transport that keeps it, sorted by name: what /metrics and /api/clients show for every
// client.
template <typename Reports>
std::map<std::string, std::string> GaugeNames(const Reports& reports) {
  std::map<std::string, std::string> names;
  for (const auto& [client, report] : reports) {
    for (const TransportGaugeReport& gauge : report.gauges)
      names.emplace(gauge.name, gauge.transport);
  }
  return names;
}

// GET /get_all_segments, /get_all_keys, /query_key, /batch_query_keys, /query_segment.
void InstallMooncakeRoutes(httplib::Server& server, MasterState& state, const HttpAuth& auth);

}  // namespace larder::master
