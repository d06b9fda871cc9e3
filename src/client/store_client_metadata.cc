// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
// StoreClientImpl: calls that read or change the master's metadata only (exist, sizes, removal,
// object info, routes).

#include "client/store_client_impl.h"
#include "common/logging.h"

namespace larder::client {

std::vector<Result<bool>> StoreClientImpl::BatchExist(std::span<const std::string> keys) {
  proto::BatchKeysRequest request;
  proto::BatchExistReply reply;
  AddKeys(keys, request.mutable_keys());
  Status status = Rpc("BatchExist", &Stub::BatchExist, &request, &reply);
  if (status.ok() && static_cast<size_t>(reply.exists_size()) != keys.size()) {
    status = InternalError(
        "larder-master sent a malformed Exist reply: " + std::to_string(reply.exists_size()) +
        " answers for " + std::to_string(keys.size()) + " keys");
  }
  std::vector<Result<bool>> results;
  results.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (status.ok()) {
      results.emplace_back(reply.exists(static_cast<int>(i)));
    } else {
      results.emplace_back(status);
    }
  }
  if (!status.ok()) return results;
  // A key the master could not ask about (oversize, say) is an error, not an absent key.
  for (const proto::KeyError& error : reply.errors()) {
    if (error.index() >= keys.size()) continue;  // a malformed reply names no key of ours
    Status item = FromItemStatus(error.status());
    results[error.index()] = item.ok() ? InternalError("larder-master sent an OK error") : item;
  }
  return results;
}

Result<uint64_t> StoreClientImpl::GetSize(std::string_view key) {
  proto::BatchKeysRequest request;
  proto::BatchGetReplicasReply reply;
  request.add_keys(ScopedKey(options_.tenant_id, key));
  request.set_metadata_only(true);  // no lease: nothing is copied
  LARDER_RETURN_IF_ERROR(Rpc("BatchGetReplicas", &Stub::BatchGetReplicas, &request, &reply));
  LARDER_RETURN_IF_ERROR(CheckReplicaColumns(reply, 1));
  LARDER_RETURN_IF_ERROR(ItemStatuses(1, reply.errors())[0]);
  return reply.size(0);
}

std::vector<Status> StoreClientImpl::BatchRemoveReplicas(std::span<const std::string> keys,
                                                         const RemoveScope& scope) {
  if (Status bad = scope.Validate(); !bad.ok()) {
    return std::vector<Status>(keys.size(), bad);
  }
  proto::BatchKeysRequest request;
  proto::BatchStatusReply reply;
  AddKeys(keys, request.mutable_keys());
  request.set_force(scope.force);
  request.set_segment(scope.segment);
  request.set_unused_for_ms(static_cast<uint32_t>(scope.unused_for.count()));
  Status status = Rpc("BatchRemove", &Stub::BatchRemove, &request, &reply);
  if (!status.ok()) return std::vector<Status>(keys.size(), status);
  return ItemStatuses(keys.size(), reply.errors());
}

Result<uint64_t> StoreClientImpl::RemoveAll(bool force) {
  proto::RemoveAllRequest request;
  proto::RemoveAllReply reply;
  request.set_tenant(options_.tenant_id);
  request.set_force(force);
  LARDER_RETURN_IF_ERROR(Rpc("RemoveAll", &Stub::RemoveAll, &request, &reply));
  return reply.removed();
}

Result<uint64_t> StoreClientImpl::RemoveByRegex(std::string_view pattern, bool force) {
  proto::RemoveByRegexRequest request;
  proto::RemoveAllReply reply;
  request.set_tenant(options_.tenant_id);
  request.set_pattern(std::string(pattern));
  request.set_force(force);
  LARDER_RETURN_IF_ERROR(Rpc("RemoveByRegex", &Stub::RemoveByRegex, &request, &reply));
  return reply.removed();
}

std::vector<Result<ObjectInfo>> StoreClientImpl::BatchGetObjectInfo(
    std::span<const std::string> keys) {
  const size_t n = keys.size();
  if (n == 0) return {};
  proto::BatchKeysRequest request;
  proto::BatchGetReplicasReply reply;
  AddKeys(keys, request.mutable_keys());
  request.set_metadata_only(true);
  Status status = Rpc("BatchGetReplicas", &Stub::BatchGetReplicas, &request, &reply);
  if (status.ok()) status = CheckReplicaColumns(reply, n);
  proto::ListSegmentsReply segments;
  if (status.ok() && reply.segment_id_size() > 0) {
    proto::ListSegmentsRequest list;
    list.mutable_segment_id()->Add(reply.segment_id().begin(), reply.segment_id().end());
    status = master_.Call("ListSegments", &Stub::ListSegments, list, &segments);
  }
  if (!status.ok()) return std::vector<Result<ObjectInfo>>(n, status);
  return ObjectInfos(reply, segments);
}

Result<RouteKind> StoreClientImpl::RouteTo(std::string_view segment_name) {
  proto::ListSegmentsRequest request;
  proto::ListSegmentsReply reply;
  LARDER_RETURN_IF_ERROR(master_.Call("ListSegments", &Stub::ListSegments, request, &reply));
  for (const proto::SegmentInfo& info : reply.segments()) {
    if (info.name() != segment_name) continue;
    uint64_t id = info.segment_id();
    SegmentHandles opened;
    std::vector<Status> failed;
    OpenSegments(std::span(&id, 1), &opened, &failed);
    const SegmentHandleRank* segment = opened.Find(id);
    if (segment == nullptr) {
      return UnavailableError("segment '" + info.name() + "' cannot be opened" +
                              (failed.empty() ? std::string() : ": " + failed.back().ToString()));
    }
    return engine_->SegmentRoute(segment->handle);
  }
  return NotFoundError("no segment named '" + std::string(segment_name) + "' is mounted");
}

}  // namespace larder::client
