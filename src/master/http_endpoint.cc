// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/http_endpoint.h"

#include <httplib.h>
#include <openssl/crypto.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "master/master_server.h"
#include "master/master_state.h"

namespace larder::master {

namespace {

// A Prometheus histogram in seconds: cumulative buckets, +Inf, _sum and _count.
void Histogram(std::ostringstream& out, const char* name, const char* help,
               const LatencyHistogram::Snapshot& snapshot) {
  out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " histogram\n";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < LatencyHistogram::kBounds.size(); ++i) {
    cumulative += snapshot.counts[i];
    out << name << "_bucket{le=\"" << static_cast<double>(LatencyHistogram::kBounds[i]) / 1e9
        << "\"} " << cumulative << '\n';
  }
  out << name << "_bucket{le=\"+Inf\"} " << snapshot.count << '\n'
      << name << "_sum " << static_cast<double>(snapshot.sum_ns) / 1e9 << '\n'
      << name << "_count " << snapshot.count << '\n';
}

// A label value as Prometheus' text format wants it: backslash, quote and newline escaped.
std::string LabelValue(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// The page size a segment's descriptor announces (4 KiB when it says none).
uint64_t PageSizeOf(const SegmentView& segment) {
  auto j = nlohmann::json::parse(segment.descriptor, nullptr, /*allow_exceptions=*/false);
  if (j.is_object()) {
    auto it = j.find("page_size");
    if (it != j.end() && it->is_number_unsigned()) return it->get<uint64_t>();
  }
  return 4096;
}

void RenderTraffic(std::ostringstream& out, const MasterState& state) {
  auto traffic = state.Traffic();
  struct Family {
    const char* name;
    const char* help;
    uint64_t RouteTrafficReport::*field;
  };
  static constexpr Family kFamilies[] = {
      {"larder_client_transfer_requests_total",
       "Transfer requests a client's engine finished, by peer engine and route.",
       &RouteTrafficReport::requests},
      {"larder_client_transfer_bytes_total",
       "Bytes a client's engine moved, by peer engine and route (tcp to a peer on the same host "
       "is the hairpin to watch for).",
       &RouteTrafficReport::bytes},
      {"larder_client_transfer_failures_total",
       "Transfer requests of a client's engine that failed, by peer engine and route.",
       &RouteTrafficReport::failures},
  };
  for (const Family& family : kFamilies) {
    out << "# HELP " << family.name << ' ' << family.help << "\n# TYPE " << family.name
        << " counter\n";
    for (const auto& [client, report] : traffic) {
      for (const RouteTrafficReport& route : report.routes) {
        out << family.name << "{client=\"" << LabelValue(client) << "\",peer=\""
            << LabelValue(route.peer_client_id) << "\",route=\"" << LabelValue(route.route)
            << "\"} " << route.*family.field << '\n';
      }
    }
  }
  out << "# HELP larder_client_mapped_segments Peer segments a client maps over shm.\n"
         "# TYPE larder_client_mapped_segments gauge\n";
  for (const auto& [client, report] : traffic) {
    out << "larder_client_mapped_segments{client=\"" << LabelValue(client) << "\"} "
        << report.mapped_segments << '\n';
  }
  out << "# HELP larder_client_mapped_bytes Address space of the peer segments a client maps "
         "(resident memory is only what it copied).\n"
         "# TYPE larder_client_mapped_bytes gauge\n";
  for (const auto& [client, report] : traffic) {
    out << "larder_client_mapped_bytes{client=\"" << LabelValue(client) << "\"} "
        << report.mapped_bytes << '\n';
  }
}

}  // namespace

std::string RenderMetrics(const MasterState& state) {
  MasterStats stats = state.Stats();
  std::ostringstream out;
  auto metric = [&](const char* name, const char* type, const char* help, uint64_t value) {
    out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n'
        << name << ' ' << value << '\n';
  };
  metric("larder_objects", "gauge", "Objects stored (complete or being written).", stats.objects);
  metric("larder_bytes_used", "gauge", "Bytes allocated in all segments.", stats.bytes_used);
  metric("larder_bytes_capacity", "gauge", "Bytes of all mounted segments.", stats.bytes_capacity);
  metric("larder_segments", "gauge", "Mounted segments.", stats.segments);
  metric("larder_clients", "gauge", "Registered, live clients.", stats.clients);
  metric("larder_puts_total", "counter", "Puts completed.", stats.puts);
  metric("larder_gets_total", "counter", "Leases granted by GetReplicas.", stats.gets);
  metric("larder_get_misses_total", "counter", "GetReplicas of absent or incomplete keys.",
         stats.get_misses);
  metric("larder_removes_total", "counter", "Objects removed by clients.", stats.removes);
  metric("larder_evictions_total", "counter", "Objects evicted.", stats.evictions);
  metric("larder_evicted_bytes_total", "counter", "Bytes evicted.", stats.evicted_bytes);
  metric("larder_lease_expiries_total", "counter",
         "Leases never released that ran out at the lease TTL (a reader died or stalled).",
         stats.lease_expiries);
  metric("larder_lease_releases_total", "counter", "Leases released by their reader.",
         stats.lease_releases);
  metric("larder_lease_releases_unknown_total", "counter",
         "Releases of leases not held: released before, expired, or from an earlier master.",
         stats.lease_releases_unknown);
  metric("larder_lease_releases_refused_total", "counter",
         "Releases refused because another client holds the lease.", stats.lease_releases_refused);
  metric("larder_leases_active", "gauge", "Leases granted and neither released nor expired.",
         stats.leases_active);
  Histogram(out, "larder_lease_hold_seconds",
            "How long read leases were held: grant to release, or the TTL when they expired.",
            state.LeaseHoldTimes());
  out << "# HELP larder_put_refusals_total Puts refused, by reason: no_space (nothing evictable: "
         "every object leased, pinned or being written), invalid (key, size, replicas).\n"
         "# TYPE larder_put_refusals_total counter\n"
      << "larder_put_refusals_total{reason=\"no_space\"} " << stats.put_refusals_no_space << '\n'
      << "larder_put_refusals_total{reason=\"invalid\"} " << stats.put_refusals_invalid << '\n';
  out << "# HELP larder_evictions_per_second Objects evicted per second over the last 10 s.\n"
         "# TYPE larder_evictions_per_second gauge\nlarder_evictions_per_second "
      << stats.evictions_per_second << '\n';
  metric("larder_eviction_runs_total", "counter", "Eviction runs (one per put that needed space).",
         stats.eviction_runs);
  metric("larder_eviction_scanned_total", "counter", "Objects examined by eviction runs.",
         stats.eviction_scanned);
  Histogram(out, "larder_eviction_seconds", "How long each eviction run took.",
            state.EvictionTimes());
  metric("larder_put_revokes_total", "counter", "Puts revoked (by the writer or on timeout).",
         stats.put_revokes);
  metric("larder_client_expiries_total", "counter", "Clients expired for missing heartbeats.",
         stats.client_expiries);
  out << "# HELP larder_segment_bytes_used Bytes allocated per segment.\n"
         "# TYPE larder_segment_bytes_used gauge\n";
  auto segments = state.ListSegments({});
  for (const SegmentView& segment : segments) {
    out << "larder_segment_bytes_used{segment=\"" << LabelValue(segment.name) << "\"} "
        << segment.used << '\n';
  }
  out << "# HELP larder_segment_bytes_capacity Bytes per segment.\n"
         "# TYPE larder_segment_bytes_capacity gauge\n";
  for (const SegmentView& segment : segments) {
    out << "larder_segment_bytes_capacity{segment=\"" << LabelValue(segment.name) << "\"} "
        << segment.size << '\n';
  }
  out << "# HELP larder_segment_page_bytes Page size behind each segment (4 KiB, or huge pages).\n"
         "# TYPE larder_segment_page_bytes gauge\n";
  for (const SegmentView& segment : segments) {
    out << "larder_segment_page_bytes{segment=\"" << LabelValue(segment.name) << "\"} "
        << PageSizeOf(segment) << '\n';
  }
  RenderTraffic(out, state);
  return out.str();
}

namespace {

// True when the request may see the admin routes; otherwise fills the refusal.
bool AdminAllowed(const HttpAuth& auth, const httplib::Request& request,
                  httplib::Response& response) {
  if (!auth.required) return true;
  const std::string header = request.get_header_value("Authorization");
  constexpr std::string_view kBearer = "Bearer ";
  if (header.rfind(kBearer, 0) != 0) {
    response.status = 401;
    response.set_header("WWW-Authenticate", "Bearer");
    response.set_content("this route needs the admin token: Authorization: Bearer TOKEN\n",
                         "text/plain");
    return false;
  }
  std::string_view given = std::string_view(header).substr(kBearer.size());
  if (auth.admin_token.empty() || given.size() != auth.admin_token.size() ||
      CRYPTO_memcmp(given.data(), auth.admin_token.data(), given.size()) != 0) {
    response.status = 403;
    response.set_content(auth.admin_token.empty()
                             ? "this master has no admin token (--admin-token-file)\n"
                             : "wrong admin token\n",
                         "text/plain");
    return false;
  }
  return true;
}

constexpr size_t kMaxKeysListed = 100000;

}  // namespace

void InstallHttpRoutes(httplib::Server& server, MasterState& state, HttpAuth auth) {
  server.Get("/metrics", [&state](const httplib::Request&, httplib::Response& response) {
    response.set_content(RenderMetrics(state), "text/plain; version=0.0.4");
  });
  server.Get("/health", [](const httplib::Request&, httplib::Response& response) {
    response.set_content("ok\n", "text/plain");
  });
  server.Get("/segments", [&state, auth](const httplib::Request& request,
                                         httplib::Response& response) {
    if (!AdminAllowed(auth, request, response)) return;
    nlohmann::json out = nlohmann::json::array();
    for (const SegmentView& segment : state.ListSegments({})) {
      out.push_back({{"segment_id", segment.segment_id},
                     {"name", segment.name},
                     {"client_id", segment.client_id},
                     {"host_id", segment.host_id},
                     {"size", segment.size},
                     {"page_size", PageSizeOf(segment)},
                     {"used", segment.used},
                     {"objects", segment.objects}});
    }
    response.set_content(out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
                         "application/json");
  });
  server.Get("/keys", [&state, auth](const httplib::Request& request, httplib::Response& response) {
    if (!AdminAllowed(auth, request, response)) return;
    size_t limit = 1000;
    if (request.has_param("limit")) {
      try {
        limit = std::stoull(request.get_param_value("limit"));
      } catch (const std::exception&) {
        response.status = 400;
        response.set_content("limit must be a number\n", "text/plain");
        return;
      }
    }
    limit = std::min(limit, kMaxKeysListed);
    nlohmann::json out = nlohmann::json::array();
    for (const auto& [key, size] : state.ListKeys(request.get_param_value("prefix"), limit)) {
      out.push_back({{"key", key}, {"size", size}});
    }
    response.set_content(out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
                         "application/json");
  });
}

}  // namespace larder::master
