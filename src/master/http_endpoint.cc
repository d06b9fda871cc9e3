// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/http_endpoint.h"

#include <httplib.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "master/master_server.h"
#include "master/master_state.h"

namespace larder::master {

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
         "Leases found expired when their object was leased again.", stats.lease_expiries);
  metric("larder_put_revokes_total", "counter", "Puts revoked (by the writer or on timeout).",
         stats.put_revokes);
  metric("larder_client_expiries_total", "counter", "Clients expired for missing heartbeats.",
         stats.client_expiries);
  out << "# HELP larder_segment_bytes_used Bytes allocated per segment.\n"
         "# TYPE larder_segment_bytes_used gauge\n";
  auto segments = state.ListSegments({});
  for (const SegmentView& segment : segments) {
    out << "larder_segment_bytes_used{segment=\"" << segment.name << "\"} " << segment.used << '\n';
  }
  out << "# HELP larder_segment_bytes_capacity Bytes per segment.\n"
         "# TYPE larder_segment_bytes_capacity gauge\n";
  for (const SegmentView& segment : segments) {
    out << "larder_segment_bytes_capacity{segment=\"" << segment.name << "\"} " << segment.size
        << '\n';
  }
  return out.str();
}

void InstallHttpRoutes(httplib::Server& server, MasterState& state) {
  server.Get("/metrics", [&state](const httplib::Request&, httplib::Response& response) {
    response.set_content(RenderMetrics(state), "text/plain; version=0.0.4");
  });
  server.Get("/health", [](const httplib::Request&, httplib::Response& response) {
    response.set_content("ok\n", "text/plain");
  });
  server.Get("/segments", [&state](const httplib::Request&, httplib::Response& response) {
    nlohmann::json out = nlohmann::json::array();
    for (const SegmentView& segment : state.ListSegments({})) {
      out.push_back({{"segment_id", segment.segment_id},
                     {"name", segment.name},
                     {"client_id", segment.client_id},
                     {"host_id", segment.host_id},
                     {"size", segment.size},
                     {"used", segment.used},
                     {"objects", segment.objects}});
    }
    response.set_content(out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
                         "application/json");
  });
  server.Get("/keys", [&state](const httplib::Request& request, httplib::Response& response) {
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
    nlohmann::json out = nlohmann::json::array();
    for (const auto& [key, size] : state.ListKeys(request.get_param_value("prefix"), limit)) {
      out.push_back({{"key", key}, {"size", size}});
    }
    response.set_content(out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
                         "application/json");
  });
}

}  // namespace larder::master
