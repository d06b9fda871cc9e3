// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Names of the public enums, the JSON form of segment descriptors, and protocol selection.
#include <nlohmann/json.hpp>

#include "common/env.h"
#include "larder/transfer_engine.h"

namespace larder {

std::string_view RouteKindName(RouteKind route) {
  switch (route) {
    case RouteKind::kLocal:
      return "local";
    case RouteKind::kSameHostShm:
      return "shm";
    case RouteKind::kTcp:
      return "tcp";
    case RouteKind::kDevice:
      return "device";
    case RouteKind::kNone:
      break;
  }
  return "none";
}

std::string_view MemoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kMemfd:
      return "memfd";
    case MemoryKind::kDevice:
      return "device";
    case MemoryKind::kAnonymous:
      break;
  }
  return "anonymous";
}

std::string SegmentDescriptor::ToJson() const {
  nlohmann::json j = {
      {"segment_id", segment_id},
      {"name", name},
      {"epoch", epoch},
      {"engine_id", engine_id},
      {"host_id", host_id},
      {"tcp_endpoint", tcp_endpoint},
      {"shm_socket", shm_socket},
      {"size", size},
      {"memory_kind", std::string(MemoryKindName(memory_kind))},
      {"page_size", page_size},
  };
  return j.dump();
}

Result<SegmentDescriptor> SegmentDescriptor::FromJson(std::string_view json) {
  auto j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return InvalidArgumentError("segment descriptor is not a JSON object");
  SegmentDescriptor d;
  auto get_u64 = [&](const char* key, uint64_t* out) -> Status {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_unsigned()) {
      return InvalidArgumentError(std::string("segment descriptor lacks unsigned '") + key + "'");
    }
    *out = it->get<uint64_t>();
    return Status();
  };
  auto get_str = [&](const char* key, std::string* out) -> Status {
    auto it = j.find(key);
    if (it == j.end() || !it->is_string()) {
      return InvalidArgumentError(std::string("segment descriptor lacks string '") + key + "'");
    }
    *out = it->get<std::string>();
    return Status();
  };
  LARDER_RETURN_IF_ERROR(get_u64("segment_id", &d.segment_id));
  LARDER_RETURN_IF_ERROR(get_u64("epoch", &d.epoch));
  LARDER_RETURN_IF_ERROR(get_u64("size", &d.size));
  LARDER_RETURN_IF_ERROR(get_str("name", &d.name));
  LARDER_RETURN_IF_ERROR(get_str("engine_id", &d.engine_id));
  LARDER_RETURN_IF_ERROR(get_str("host_id", &d.host_id));
  LARDER_RETURN_IF_ERROR(get_str("tcp_endpoint", &d.tcp_endpoint));
  LARDER_RETURN_IF_ERROR(get_str("shm_socket", &d.shm_socket));
  // Descriptors from engines that predate page sizes describe normal pages.
  if (j.contains("page_size")) {
    LARDER_RETURN_IF_ERROR(get_u64("page_size", &d.page_size));
    if (d.page_size < 4096 || (d.page_size & (d.page_size - 1)) != 0) {
      return InvalidArgumentError("segment descriptor has page_size " +
                                  std::to_string(d.page_size) + ", not a power of two >= 4096");
    }
  }
  std::string kind;
  LARDER_RETURN_IF_ERROR(get_str("memory_kind", &kind));
  if (kind == "memfd") {
    d.memory_kind = MemoryKind::kMemfd;
  } else if (kind == "anonymous") {
    d.memory_kind = MemoryKind::kAnonymous;
  } else if (kind == "device") {
    d.memory_kind = MemoryKind::kDevice;
  } else {
    return InvalidArgumentError("unknown memory_kind '" + kind + "' in segment descriptor");
  }
  return d;
}

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

std::string EngineStats::ToJson() const {
  auto counters = [](const TransferCounters& c) {
    return nlohmann::json{{"requests", c.requests}, {"bytes", c.bytes}, {"failures", c.failures}};
  };
  nlohmann::json list = nlohmann::json::array();
  nlohmann::json routes = nlohmann::json::object();
  for (const PeerTransferStats& peer : peers) {
    list.push_back({{"engine_id", peer.engine_id},
                    {"host_id", peer.host_id},
                    {"tcp_endpoint", peer.tcp_endpoint},
                    {"route", std::string(RouteKindName(peer.route))},
                    {"reads", counters(peer.reads)},
                    {"writes", counters(peer.writes)}});
    routes[std::string(RouteKindName(peer.route))] = counters(ByRoute(peer.route));
  }
  return nlohmann::json{{"peers", list},
                        {"routes", routes},
                        {"mapped_segments", mapped_segments},
                        {"mapped_bytes", mapped_bytes},
                        {"mappings_dropped", mappings_dropped}}
      .dump();
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
  bool enabled[5] = {false, false, false, false, false};
  size_t start = 0;
  bool any = false;
  while (start <= protocol.size()) {
    size_t comma = protocol.find(',', start);
    std::string_view name = protocol.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
    while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
    if (name == "auto") {
      enabled[1] = enabled[2] = enabled[3] = true;
    } else if (name == "local") {
      enabled[1] = true;
    } else if (name == "shm") {
      enabled[2] = true;
    } else if (name == "tcp") {
      enabled[3] = true;
    } else if (name == "device") {
      enabled[4] = true;
    } else {
      return InvalidArgumentError("unknown protocol '" + std::string(name) + "' in '" +
                                  std::string(protocol) +
                                  "' (use auto, local, shm, tcp, device or a comma list)");
    }
    any = true;
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  if (!any) return InvalidArgumentError("empty protocol");
  std::vector<RouteKind> routes;
  // Preference is fixed: the closest route that reaches a peer always wins.
  for (int r = 1; r <= 4; ++r) {
    if (enabled[r]) routes.push_back(static_cast<RouteKind>(r));
  }
  return routes;
}

}  // namespace larder
