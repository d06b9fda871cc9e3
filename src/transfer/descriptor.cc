// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Engine statistics as JSON, and protocol selection. (The JSON form of segment descriptors is in
// src/common/segment_descriptor.cc.)
#include <limits>

#include <nlohmann/json.hpp>

#include "common/env.h"
#include "larder/transfer_engine.h"
#include "transfer/transport_registry.h"

namespace larder {

TransferCounters EngineStats::ByRoute(RouteKind route) const {
  TransferCounters sum;
  for (const PeerTransferStats& peer : peers) {
    if (peer.route != route) continue;
    sum += peer.reads;
    sum += peer.writes;
  }
  return sum;
}

TransferCounters EngineStats::ByPeer(std::string_view engine_id, RouteKind route) const {
  TransferCounters sum;
  for (const PeerTransferStats& peer : peers) {
    if (peer.route != route || peer.engine_id != engine_id) continue;
    sum += peer.reads;
    sum += peer.writes;
  }
  return sum;
}

std::vector<EngineStats::Value> EngineStats::Values() const {
  return {{"shm", "mapped_segments", mapped_segments, true},
          {"shm", "mapped_bytes", mapped_bytes, true},
          {"shm", "mappings_dropped", mappings_dropped, false},
          {"device", "device_imports", device_imports, true},
          {"device", "device_imported_bytes", device_imported_bytes, true},
          {"device", "device_import_calls", device_import_calls, false},
          {"device", "device_import_failures", device_import_failures, false},
          {"device", "device_import_ns", device_import_ns, false},
          {"device", "staging_buffers", staging_buffers, true},
          {"device", "staging_buffers_in_use", staging_buffers_in_use, true},
          {"device", "staging_waits", staging_waits, false},
          {"device", "staged_to_host_bytes", staged_to_host_bytes, false},
          {"device", "staged_to_device_bytes", staged_to_device_bytes, false},
          {"device", "staging_copy_failures", staging_copy_failures, false}};
}

std::string EngineStats::ToJson() const {
  auto counters = [](const TransferCounters& c) {
    return nlohmann::json{{"requests", c.requests}, {"bytes", c.bytes}, {"failures", c.failures}};
  };
  nlohmann::json list = nlohmann::json::array();
  nlohmann::json routes = nlohmann::json::object();
  for (const PeerTransferStats& peer : peers) {
    list.push_back({{"engine_id", peer.engine_id},
                    {"host_id", peer.host_id},
                    {"address", peer.address},
                    {"route", std::string(RouteKindName(peer.route))},
                    {"reads", counters(peer.reads)},
                    {"writes", counters(peer.writes)}});
    routes[std::string(RouteKindName(peer.route))] = counters(ByRoute(peer.route));
  }
  nlohmann::json out{{"peers", list}, {"routes", routes}};
  for (const Value& value : Values()) out[std::string(value.name)] = value.value;
  return out.dump();
}

std::string_view TrafficClassName(TrafficClass traffic_class) {
  switch (traffic_class) {
    case TrafficClass::kLatency:
      return "latency";
    case TrafficClass::kBulk:
      return "bulk";
    case TrafficClass::kDefault:
      break;
  }
  return "default";
}

Result<TrafficClass> ParseTrafficClass(std::string_view name) {
  if (name == "latency") return TrafficClass::kLatency;
  if (name == "bulk") return TrafficClass::kBulk;
  return InvalidArgumentError("traffic class '" + std::string(name) +
                              "' is not one of: latency, bulk");
}

std::string ResolveProtocol(EngineRole role, const std::string& configured) {
  if (!configured.empty()) return configured;
  if (role == EngineRole::kStore) {
    std::string store = GetEnv("LARDER_STORE_PROTOCOL");
    if (!store.empty()) return store;
  }
  std::string standalone = GetEnv("LARDER_PROTOCOL");
  return standalone.empty() ? "auto" : standalone;
}

Result<std::vector<RouteKind>> ParseProtocol(std::string_view protocol) {
  LARDER_ASSIGN_OR_RETURN(auto selected, transfer::TransportRegistry::Global().Select(protocol));
  std::vector<RouteKind> routes;
  for (const auto& s : selected) routes.emplace_back(s.factory->name);
  return routes;
}

int RoutePreference(RouteKind route) {
  const transfer::TransportFactory* f = transfer::TransportRegistry::Global().Find(route.name());
  return f == nullptr ? std::numeric_limits<int>::max() : f->preference;
}

}  // namespace larder
