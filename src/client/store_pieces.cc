// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "client/store_pieces.h"

#include <unordered_map>

#include "client/master_client.h"

namespace larder::client {

Status BatchTooLarge(size_t items) {
  return InvalidArgumentError("a batch of " + std::to_string(items) +
                              " keys exceeds the maximum of " + std::to_string(kMaxBatchKeys) +
                              "; split it");
}

std::string ScopedKey(const std::string& tenant, std::string_view key) {
  if (tenant.empty() && !key.starts_with('\0')) return std::string(key);
  std::string scoped;
  scoped.reserve(tenant.size() + 2 + key.size());
  scoped.push_back('\0');
  scoped += tenant;
  scoped.push_back('\0');
  scoped += key;
  return scoped;
}

Status ValidateTenant(const std::string& tenant) {
  if (tenant.size() > 128) {
    return InvalidArgumentError("tenant_id has " + std::to_string(tenant.size()) +
                                " bytes; at most 128");
  }
  if (tenant.find('\0') != std::string::npos) {
    return InvalidArgumentError("tenant_id contains a NUL byte");
  }
  return Status::Ok();
}

std::vector<Result<ObjectInfo>> ObjectInfos(const proto::BatchGetReplicasReply& reply,
                                            const proto::ListSegmentsReply& segments) {
  const size_t n = static_cast<size_t>(reply.size_size());
  std::vector<Result<ObjectInfo>> results;
  results.reserve(n);
  std::unordered_map<uint64_t, const proto::SegmentInfo*> by_id;
  std::unordered_map<uint64_t, std::string> endpoint_of;
  for (const proto::SegmentInfo& info : segments.segments()) {
    by_id[info.segment_id()] = &info;
    endpoint_of[info.segment_id()] = info.segment_descriptor().address();
  }
  std::vector<Status> statuses = ItemStatuses(n, reply.errors());
  int first = 0;
  for (size_t i = 0; i < n; ++i) {
    const int count = static_cast<int>(reply.replica_count(static_cast<int>(i)));
    if (!statuses[i].ok()) {
      results.emplace_back(statuses[i]);
      first += count;
      continue;
    }
    ObjectInfo info;
    info.size = reply.size(static_cast<int>(i));
    for (int r = first; r < first + count; ++r) {
      ReplicaInfo replica;
      replica.offset = reply.offset(r);
      auto it = by_id.find(reply.segment_id(r));
      if (it == by_id.end()) continue;  // unmounted between the two calls
      replica.segment_name = it->second->name();
      replica.address = it->second->base() + replica.offset;
      replica.endpoint = endpoint_of[reply.segment_id(r)];
      info.replicas.push_back(std::move(replica));
    }
    first += count;
    results.emplace_back(std::move(info));
  }
  return results;
}

void AddTrafficReport(const EngineStats& stats, proto::HeartbeatRequest* request) {
  for (const PeerTransferStats& peer : stats.peers) {
    if (request->traffic_size() >= 1024) break;
    proto::RouteTraffic* t = request->add_traffic();
    t->set_peer_client_id(peer.engine_id);
    t->set_route(std::string(RouteKindName(peer.route)));
    t->set_requests(peer.reads.requests + peer.writes.requests);
    t->set_bytes(peer.reads.bytes + peer.writes.bytes);
    t->set_failures(peer.reads.failures + peer.writes.failures);
  }
  for (const EngineStats::Value& value : stats.Values()) {
    if (!value.gauge) continue;
    proto::TransportGauge* gauge = request->add_gauges();
    gauge->set_transport(std::string(value.transport));
    gauge->set_name(std::string(value.name));
    gauge->set_value(value.value);
  }
}

}  // namespace larder::client
