// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/http_endpoint.h"

#include <httplib.h>
#include <openssl/crypto.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "larder/version.h"
#include "master/http_routes_internal.h"
#include "master/master_server.h"
#include "master/master_state.h"
#include "master/metrics_text.h"
#include "master/status_history.h"
#include "master/status_page.h"

namespace larder::master {

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

std::string EscapeLine(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f && byte != '\\') {
      out += c;
    } else {
      char escaped[5];
      snprintf(escaped, sizeof(escaped), "\\x%02x", byte);
      out += escaped;
    }
  }
  return out;
}

std::string Dump(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

namespace {

using ordered_json = nlohmann::ordered_json;

// A rate as JSON: finite numbers as they are (JSON has no NaN or infinity).
ordered_json Number(double value) { return ordered_json(std::isfinite(value) ? value : 0.0); }

ordered_json PointJson(const StatusPoint& point) {
  ordered_json routes = ordered_json::object();
  for (const auto& [route, rate] : point.route_bytes_per_s) routes[route] = Number(rate);
  return {
      {"unix_ms", point.unix_ms},
      {"seconds", Number(point.seconds)},
      {"ops_per_s", Number(point.ops_per_s)},
      {"puts_per_s", Number(point.puts_per_s)},
      {"gets_per_s", Number(point.gets_per_s)},
      {"removes_per_s", Number(point.removes_per_s)},
      {"hit_rate", point.hit_rate ? Number(*point.hit_rate) : ordered_json(nullptr)},
      {"get_hit_rate", point.get_hit_rate ? Number(*point.get_hit_rate) : ordered_json(nullptr)},
      {"evictions_per_s", Number(point.evictions_per_s)},
      {"lease_expiries_per_s", Number(point.lease_expiries_per_s)},
      {"objects", point.objects},
      {"bytes_used", point.bytes_used},
      {"bytes_capacity", point.bytes_capacity},
      {"route_bytes_per_s", routes}};
}

void SendJson(httplib::Response& response, const ordered_json& body) {
  response.set_content(Dump(body) + "\n", "application/json");
  response.set_header("Cache-Control", "no-store");
}

void SendError(httplib::Response& response, int status, const std::string& error) {
  response.status = status;
  SendJson(response, {{"error", error}});
}

// A refusal of MasterState as an HTTP answer: NotFound 404, FailedPrecondition 409,
// InvalidArgument 400, anything else 500.
void SendStatusError(httplib::Response& response, const Status& status) {
  int code = 500;
  switch (status.code()) {
    case StatusCode::kNotFound:
      code = 404;
      break;
    case StatusCode::kFailedPrecondition:
      code = 409;
      break;
    case StatusCode::kInvalidArgument:
      code = 400;
      break;
    default:
      break;
  }
  SendError(response, code, status.ToString());
}

// The body of an operator's POST: JSON (Content-Type application/json, which a cross-site form
// cannot send), an object, at most kMaxJsonBody bytes. False, answered, otherwise.
constexpr size_t kMaxJsonBody = 8 * kMaxKeyBytes;
bool ParseJsonBody(const httplib::Request& request, httplib::Response& response,
                   ordered_json* body) {
  if (!request.get_header_value("Content-Type").starts_with("application/json")) {
    SendError(response, 415, "the body must be JSON (Content-Type: application/json)");
    return false;
  }
  if (request.body.size() > kMaxJsonBody) {
    SendError(response, 413, "the body is too large");
    return false;
  }
  *body = ordered_json::parse(request.body, nullptr, false);
  if (!body->is_object()) {
    SendError(response, 400, "the body must be a JSON object");
    return false;
  }
  return true;
}

// Bytes as lowercase hex: keys that JSON strings cannot carry exactly.
std::string Hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes.size());
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

// Most objects one /api/segment_objects answer lists.
constexpr size_t kMaxSegmentObjectsListed = kMaxKeysListed;

// Per client: what its engine reported moving, by route, to every peer together.
struct RouteTotals {
  uint64_t requests = 0, bytes = 0, failures = 0;
};
using TrafficByClient = std::map<std::string, std::map<std::string, RouteTotals>>;

// By reporting client, and by peer (the client at the other end, the owner of what was read or
// written), each summed over the other side.
void SumTraffic(const MasterState& state, TrafficByClient* by_reporter, TrafficByClient* by_peer) {
  for (const auto& [client, traffic] : state.Traffic()) {
    for (const RouteTrafficReport& route : traffic.routes) {
      for (auto [totals, who] :
           {std::pair{by_reporter, &client}, {by_peer, &route.peer_client_id}}) {
        RouteTotals& sum = (*totals)[*who][route.route];
        sum.requests += route.requests;
        sum.bytes += route.bytes;
        sum.failures += route.failures;
      }
    }
  }
}

ordered_json RoutesJson(const TrafficByClient& traffic, const std::string& client) {
  ordered_json out = ordered_json::object();
  auto it = traffic.find(client);
  if (it == traffic.end()) return out;
  for (const auto& [route, sum] : it->second) {
    out[route] = {{"requests", sum.requests}, {"bytes", sum.bytes}, {"failures", sum.failures}};
  }
  return out;
}

void InstallApiRoutes(httplib::Server& server, MasterState& state, const HttpAuth& auth,
                      std::function<std::string()> role, const StatusHistory* history) {
  server.Get("/api/summary", [&state, role, history](const httplib::Request&,
                                                     httplib::Response& response) {
    MasterStats stats = state.Stats();
    std::optional<StatusPoint> latest = history ? history->Latest() : std::nullopt;
    // MasterStats::gets counts the hits (leases granted); the summary's gets are every key asked.
    const uint64_t gets = stats.gets + stats.get_misses;
    auto ratio = [](uint64_t part, uint64_t whole) {
      return whole > 0 ? Number(static_cast<double>(part) / static_cast<double>(whole))
                       : ordered_json(nullptr);
    };
    const TenantCounters::Snapshot tenants = state.TenantStats();
    std::optional<double> serving = ServingHitRate(tenants.tenants, tenants.others);
    // The disk tier (docs/disk-tier.md): its holders' disks, copies, and work by outcome.
    const DiskTierCounters& dc = state.disk().counters();
    const LatencyHistogram::Snapshot promotions = state.disk().PromotionTimes();
    uint64_t holders_online = 0, disk_capacity = 0, disk_used = 0, copy_bytes = 0;
    const std::vector<DiskHolderView> holders = state.disk().Holders();
    for (const DiskHolderView& holder : holders) {
      holders_online += holder.online ? 1 : 0;
      disk_capacity += holder.report.capacity_bytes;
      disk_used += holder.report.used_bytes;
      copy_bytes += holder.copy_bytes;
    }
    const ordered_json disk = {
        {"holders", holders.size()},
        {"holders_online", holders_online},
        {"capacity_bytes", disk_capacity},
        {"used_bytes", disk_used},
        {"copies", state.disk().copies()},
        {"copy_bytes", copy_bytes},
        {"demoted", dc.demoted.load()},
        {"demote_failed", dc.demote_failed.load() + dc.demote_timed_out.load()},
        {"demote_refused", dc.demote_refused.load()},
        {"queue_full", dc.queue_full.load()},
        {"evicted_with_copy", dc.evicted_with_copy.load()},
        {"evicted_without_copy", dc.evicted_dropped.load()},
        {"disk_hits", dc.disk_hits.load()},
        {"promotions", dc.promotions_queued.load()},
        {"promotion_failures", dc.promote_failed.load()},
        {"promotion_p50_ms", Number(promotions.Quantile(0.5) / 1e6)},
        {"promotion_p99_ms", Number(promotions.Quantile(0.99) / 1e6)}};
    SendJson(response,
             {{"version", Version()},
              {"role", role ? role() : std::string("single")},
              {"incarnation", std::to_string(stats.incarnation)},  // exact in JavaScript too
              {"objects", stats.objects},
              {"bytes_used", stats.bytes_used},
              {"bytes_capacity", stats.bytes_capacity},
              {"segments", stats.segments},
              {"clients", stats.clients},
              {"puts", stats.puts},
              {"gets", gets},
              {"get_misses", stats.get_misses},
              {"lookups", stats.lookups},
              {"lookup_misses", stats.lookup_misses},
              {"hit_rate", serving ? Number(*serving) : ordered_json(nullptr)},
              {"get_hit_rate", ratio(stats.gets, gets)},
              {"lookup_hit_rate", ratio(stats.lookups - stats.lookup_misses, stats.lookups)},
              {"removes", stats.removes},
              {"ops_per_s", Number(latest ? latest->ops_per_s : 0.0)},
              {"recent_hit_rate",
               latest && latest->hit_rate ? Number(*latest->hit_rate) : ordered_json(nullptr)},
              {"evictions", stats.evictions},
              {"evictions_per_s", Number(stats.evictions_per_second)},
              {"lease_expiries", stats.lease_expiries},
              {"leases_active", stats.leases_active},
              {"put_refusals", stats.put_refusals_no_space + stats.put_refusals_invalid},
              {"client_expiries", stats.client_expiries},
              {"disk", disk}});
  });
  server.Get("/api/history", [history](const httplib::Request&, httplib::Response& response) {
    ordered_json points = ordered_json::array();
    if (history) {
      for (const StatusPoint& point : history->Points()) points.push_back(PointJson(point));
    }
    SendJson(response, {{"points", points}});
  });
  server.Get("/api/tenants",
             [&state, auth](const httplib::Request& request, httplib::Response& response) {
               if (!AdminAllowed(auth, request, response)) return;
               const TenantCounters::Snapshot snapshot = state.TenantStats();
               auto row = [](const TenantTraffic& t) {
                 auto ratio = [](uint64_t part, uint64_t whole) {
                   return whole > 0 ? Number(static_cast<double>(part) / static_cast<double>(whole))
                                    : ordered_json(nullptr);
                 };
                 return ordered_json{{"lookups", t.lookups},
                                     {"lookup_misses", t.lookup_misses},
                                     {"gets", t.gets},
                                     {"get_misses", t.get_misses},
                                     {"hit_rate", ratio(t.found(), t.asked())},
                                     {"hit_rate_of", t.lookups > 0 ? "lookups" : "gets"}};
               };
               ordered_json out = ordered_json::array();
               for (const auto& [tenant, traffic] : snapshot.tenants) {
                 ordered_json entry = {{"tenant", tenant}};
                 entry.update(row(traffic));
                 out.push_back(std::move(entry));
               }
               ordered_json body = {{"tenants", out}};
               if (snapshot.others.lookups + snapshot.others.gets > 0) {
                 body["other_tenants"] = row(snapshot.others);
               }
               SendJson(response, body);
             });
  server.Get("/api/segments",
             [&state, auth](const httplib::Request& request, httplib::Response& response) {
               if (!AdminAllowed(auth, request, response)) return;
               TrafficByClient by_reporter, by_peer;
               SumTraffic(state, &by_reporter, &by_peer);
               ordered_json out = ordered_json::array();
               for (const SegmentView& segment : state.ListSegments({})) {
                 out.push_back({{"segment_id", segment.segment_id},
                                {"name", segment.name},
                                {"owner", segment.client_id},
                                {"host_id", segment.host_id},
                                {"size", segment.size},
                                {"used", segment.used},
                                {"objects", segment.objects},
                                {"page_size", segment.descriptor.page_size},
                                {"draining", segment.draining},
                                {"routes_to_owner", RoutesJson(by_peer, segment.client_id)}});
               }
               SendJson(response, {{"segments", out}});
             });
  server.Get("/api/clients",
             [&state, auth](const httplib::Request& request, httplib::Response& response) {
               if (!AdminAllowed(auth, request, response)) return;
               TrafficByClient by_reporter, by_peer;
               SumTraffic(state, &by_reporter, &by_peer);
               std::map<std::string, uint64_t> segments;
               for (const SegmentView& segment : state.ListSegments({}))
                 ++segments[segment.client_id];
               std::map<std::string, ClientTraffic> traffic;
               for (auto& [client, report] : state.Traffic()) traffic[client] = std::move(report);
               const auto gauges = GaugeNames(traffic);
               ordered_json out = ordered_json::array();
               for (const ClientView& client : state.ListClients()) {
                 const ClientTraffic& report = traffic[client.client_id];
                 ordered_json entry{{"client_id", client.client_id},
                                    {"host_id", client.host_id},
                                    {"pid", client.pid},
                                    {"alive", client.alive},
                                    {"last_heartbeat_ms_ago", client.since_last_seen_ms},
                                    {"segments", segments[client.client_id]}};
                 for (const auto& [name, transport] : gauges) entry[name] = report.Gauge(name);
                 entry["routes"] = RoutesJson(by_reporter, client.client_id);
                 out.push_back(std::move(entry));
               }
               SendJson(response, {{"clients", out}});
             });
  // Removal for operators: by key prefix (larder-ctl remove) or of what a draining segment
  // holds (larder-ctl drain). The body is JSON, so that a page elsewhere cannot send it from a
  // browser (a cross-site form cannot set that content type).
  server.Post(
      "/api/remove", [&state, auth](const httplib::Request& request, httplib::Response& response) {
        if (!AdminAllowed(auth, request, response)) return;
        ordered_json body;
        if (!ParseJsonBody(request, response, &body)) return;
        const bool by_prefix = body.contains("prefix") && body["prefix"].is_string();
        const bool by_segment = body.contains("segment") && body["segment"].is_string();
        if (by_prefix == by_segment || (body.contains("force") && !body["force"].is_boolean())) {
          return SendError(response, 400,
                           R"(expected {"prefix": "...", "force": false} or )"
                           R"({"segment": "...", "force": false})");
        }
        const bool force = body.value("force", false);
        if (by_prefix) {
          const std::string prefix = body["prefix"];
          RemoveAllOutcome outcome = state.RemoveByPrefix(prefix, force);
          return SendJson(response, {{"prefix", prefix},
                                     {"removed", outcome.removed},
                                     {"skipped_leased", outcome.skipped_leased}});
        }
        const std::string segment = body["segment"];
        Result<RemoveAllOutcome> outcome = state.RemoveOnSegment(segment, force);
        if (!outcome.ok()) return SendStatusError(response, outcome.status());
        SendJson(response, {{"segment", segment},
                            {"removed", outcome->removed},
                            {"skipped_leased", outcome->skipped_leased}});
      });
  // An operator's drain of a segment: {"segment": NAME, "draining": true|false}.
  server.Post("/api/drain", [&state, auth](const httplib::Request& request,
                                           httplib::Response& response) {
    if (!AdminAllowed(auth, request, response)) return;
    ordered_json body;
    if (!ParseJsonBody(request, response, &body)) return;
    if (!body.contains("segment") || !body["segment"].is_string() ||
        (body.contains("draining") && !body["draining"].is_boolean())) {
      return SendError(response, 400, R"(expected {"segment": "...", "draining": true})");
    }
    Result<SegmentView> segment = state.SetDraining(body["segment"], body.value("draining", true));
    if (!segment.ok()) return SendStatusError(response, segment.status());
    SendJson(response, {{"segment", segment->name},
                        {"segment_id", segment->segment_id},
                        {"draining", segment->draining},
                        {"used", segment->used},
                        {"objects", segment->objects}});
  });
  // A segment's objects, the most recently used first: what a drain moves first.
  server.Get("/api/segment_objects", [&state, auth](const httplib::Request& request,
                                                    httplib::Response& response) {
    if (!AdminAllowed(auth, request, response)) return;
    const std::string segment = request.get_param_value("segment");
    size_t limit = 1000;
    if (request.has_param("limit")) {
      const std::string text = request.get_param_value("limit");
      auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), limit);
      if (error != std::errc() || end != text.data() + text.size() || limit == 0 ||
          limit > kMaxSegmentObjectsListed) {
        return SendError(
            response, 400,
            "limit must be a number from 1 to " + std::to_string(kMaxSegmentObjectsListed));
      }
    }
    Result<MasterState::SegmentObjects> listing = state.ListSegmentObjects(segment, limit);
    if (!listing.ok()) return SendStatusError(response, listing.status());
    ordered_json objects = ordered_json::array();
    for (const SegmentObject& object : listing->objects) {
      objects.push_back({{"key", EscapeLine(object.key)},
                         {"key_hex", Hex(object.key)},
                         {"size", object.size},
                         {"replicas", object.replicas},
                         {"pinned", object.pinned}});
    }
    SendJson(
        response,
        {{"segment", segment}, {"objects", std::move(objects)}, {"truncated", listing->truncated}});
  });
  server.Get("/", [](const httplib::Request&, httplib::Response& response) {
    response.set_content(std::string(StatusPageHtml()), "text/html; charset=utf-8");
    response.set_header("Cache-Control", "no-store");
  });
}

}  // namespace

void InstallHttpRoutes(httplib::Server& server, MasterState& state, HttpAuth auth,
                       std::function<std::string()> role, const StatusHistory* history) {
  InstallApiRoutes(server, state, auth, role, history);
  server.Get("/metrics", [&state](const httplib::Request&, httplib::Response& response) {
    response.set_content(RenderMetrics(state), "text/plain; version=0.0.4");
  });
  server.Get("/health", [role](const httplib::Request&, httplib::Response& response) {
    const std::string now = role ? role() : std::string("single");
    if (now == "single") {
      response.set_content("ok\n", "text/plain");
      return;
    }
    const bool serving = now == "leader" || now == "standby";
    if (!serving) response.status = 503;
    response.set_content(Dump({{"status", serving ? "ok" : "unavailable"}, {"role", now}}) + "\n",
                         "application/json");
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
                     {"page_size", segment.descriptor.page_size},
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
  InstallMooncakeRoutes(server, state, auth);
}

}  // namespace larder::master
