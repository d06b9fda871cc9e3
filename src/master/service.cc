// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/service.h"

#include "common/logging.h"

namespace larder::master {
namespace {

void SetStatus(proto::ItemStatus* out, const Status& status) {
  out->set_code(static_cast<int32_t>(status.code()));
  if (!status.ok()) out->set_message(status.message());
}

grpc::Status ToGrpc(const Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), status.message());
}

void FillReplicas(const ReplicaLocations& replicas,
                  google::protobuf::RepeatedPtrField<proto::Replica>* out) {
  out->Reserve(static_cast<int>(replicas.size()));
  for (const ReplicaLocation& replica : replicas) {
    proto::Replica* r = out->Add();
    r->set_segment_id(replica.segment_id);
    r->set_offset(replica.offset);
  }
}

void FillSegment(const SegmentView& view, proto::SegmentInfo* out) {
  out->set_segment_id(view.segment_id);
  out->set_name(view.name);
  out->set_client_id(view.client_id);
  out->set_host_id(view.host_id);
  out->set_base(view.base);
  out->set_size(view.size);
  out->set_used(view.used);
  out->set_objects(view.objects);
  out->set_descriptor_json(view.descriptor);
}

// Views of the request's keys, valid while the request is.
std::vector<std::string_view> Keys(const proto::BatchKeysRequest& request) {
  return {request.keys().begin(), request.keys().end()};
}

void AddError(uint32_t index, const Status& status,
              google::protobuf::RepeatedPtrField<proto::KeyError>* errors) {
  proto::KeyError* error = errors->Add();
  error->set_index(index);
  SetStatus(error->mutable_status(), status);
}

// Fills reply->errors with the items that failed.
template <typename Reply>
grpc::Status StatusList(const Result<std::vector<Status>>& results, Reply* reply) {
  if (!results.ok()) return ToGrpc(results.status());
  for (size_t i = 0; i < results->size(); ++i) {
    if (!(*results)[i].ok()) {
      AddError(static_cast<uint32_t>(i), (*results)[i], reply->mutable_errors());
    }
  }
  return grpc::Status::OK;
}

class MasterService final : public proto::Master::Service {
 public:
  explicit MasterService(MasterState* state) : state_(state) {}

  // Leases released on the back of another call: best effort, like the call they ride on (an
  // unknown client's are dropped with it, and expire at their TTL).
  void ReleaseCarried(const std::string& client_id,
                      const google::protobuf::RepeatedField<uint64_t>& ids) {
    if (ids.empty()) return;
    state_->ReleaseLeases(client_id, std::span(ids.data(), static_cast<size_t>(ids.size())))
        .status()
        .IgnoreError();
  }

  grpc::Status MountSegments(grpc::ServerContext*, const proto::MountSegmentsRequest* request,
                             proto::MountSegmentsReply* reply) override {
    if (request->client_id().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "empty client id");
    }
    std::vector<SegmentMount> mounts;
    for (const proto::SegmentInfo& segment : request->segments()) {
      mounts.push_back(
          SegmentMount{segment.name(), segment.base(), segment.size(), segment.descriptor_json()});
    }
    auto results = state_->MountSegments(request->client_id(), request->host_id(), mounts);
    for (const Result<SegmentId>& result : results) {
      SetStatus(reply->add_status(), result.status());
      reply->add_segment_id(result.ok() ? *result : 0);
    }
    reply->set_master_incarnation(state_->incarnation());
    return grpc::Status::OK;
  }

  grpc::Status UnmountSegments(grpc::ServerContext*, const proto::UnmountSegmentsRequest* request,
                               proto::UnmountSegmentsReply* reply) override {
    std::vector<SegmentId> ids(request->segment_id().begin(), request->segment_id().end());
    auto results = state_->UnmountSegments(request->client_id(), ids, request->unregister_client());
    if (!results.ok()) return ToGrpc(results.status());
    for (const Status& status : *results) SetStatus(reply->add_status(), status);
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext*, const proto::HeartbeatRequest* request,
                         proto::HeartbeatReply* reply) override {
    ClientTraffic traffic;
    const int entries = std::min<int>(request->traffic_size(), kMaxTrafficEntries);
    traffic.routes.reserve(static_cast<size_t>(entries));
    for (int i = 0; i < entries; ++i) {
      const proto::RouteTraffic& t = request->traffic(i);
      traffic.routes.push_back(
          {t.peer_client_id(), t.route(), t.requests(), t.bytes(), t.failures()});
    }
    traffic.mapped_segments = request->mapped_segments();
    traffic.mapped_bytes = request->mapped_bytes();
    const bool reported = entries > 0 || traffic.mapped_segments > 0;
    HeartbeatOutcome outcome =
        state_->Heartbeat(request->client_id(), reported ? &traffic : nullptr);
    reply->set_remount_required(outcome.remount_required);
    reply->set_segments_version(outcome.segments_version);
    reply->set_master_incarnation(state_->incarnation());
    reply->set_client_ttl_ms(static_cast<uint64_t>(state_->options().client_ttl.count()));
    return grpc::Status::OK;
  }

  grpc::Status BatchPutStart(grpc::ServerContext*, const proto::BatchPutStartRequest* request,
                             proto::BatchPutStartReply* reply) override {
    ReleaseCarried(request->client_id(), request->release_leases());
    std::vector<PutStartItem> items;
    items.reserve(static_cast<size_t>(request->items_size()));
    for (const proto::PutItem& item : request->items()) {
      items.push_back(PutStartItem{item.key(), item.size()});
    }
    PutOptions options;
    options.replica_num = std::max<uint32_t>(request->replica_num(), 1);
    options.preferred_segments.assign(request->preferred_segments().begin(),
                                      request->preferred_segments().end());
    const int avoid = std::min(request->avoid_segments_size(), 64);
    options.avoid_segments.assign(request->avoid_segments().begin(),
                                  request->avoid_segments().begin() + avoid);
    options.pin = request->pin();
    auto results = state_->BatchPutStart(request->client_id(), items, options);
    if (!results.ok()) return ToGrpc(results.status());
    reply->mutable_results()->Reserve(static_cast<int>(results->size()));
    for (const PutStartOutcome& outcome : *results) {
      proto::PutStartResult* out = reply->add_results();
      SetStatus(out->mutable_status(), outcome.status);
      out->set_already_exists(outcome.already_exists);
      FillReplicas(outcome.replicas, out->mutable_replicas());
    }
    return grpc::Status::OK;
  }

  grpc::Status BatchPutEnd(grpc::ServerContext*, const proto::BatchKeysRequest* request,
                           proto::BatchStatusReply* reply) override {
    ReleaseCarried(request->client_id(), request->release_leases());
    return StatusList(state_->BatchPutEnd(request->client_id(), Keys(*request)), reply);
  }

  grpc::Status BatchPutRevoke(grpc::ServerContext*, const proto::BatchKeysRequest* request,
                              proto::BatchStatusReply* reply) override {
    ReleaseCarried(request->client_id(), request->release_leases());
    return StatusList(state_->BatchPutRevoke(request->client_id(), Keys(*request)), reply);
  }

  grpc::Status BatchGetReplicas(grpc::ServerContext*, const proto::BatchKeysRequest* request,
                                proto::BatchGetReplicasReply* reply) override {
    const auto& release = request->release_leases();
    auto batch =
        state_->BatchGetReplicas(request->client_id(), Keys(*request),
                                 request->metadata_only() ? GetMode::kPeek : GetMode::kLease,
                                 std::span(release.data(), static_cast<size_t>(release.size())));
    if (!batch.ok()) return ToGrpc(batch.status());
    const int n = static_cast<int>(batch->items.size());
    reply->mutable_size()->Reserve(n);
    reply->mutable_replica_count()->Reserve(n);
    reply->mutable_segment_id()->Reserve(n);
    reply->mutable_offset()->Reserve(n);
    reply->set_lease_ms(static_cast<uint64_t>(state_->options().lease_ttl.count()));
    reply->set_lease_id(batch->lease_id);
    for (int i = 0; i < n; ++i) {
      const GetOutcome& outcome = batch->items[static_cast<size_t>(i)];
      if (!outcome.status.ok())
        AddError(static_cast<uint32_t>(i), outcome.status, reply->mutable_errors());
      reply->add_size(outcome.size);
      reply->add_replica_count(static_cast<uint32_t>(outcome.replicas.size()));
      for (const ReplicaLocation& replica : outcome.replicas) {
        reply->add_segment_id(replica.segment_id);
        reply->add_offset(replica.offset);
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status ReleaseLeases(grpc::ServerContext*, const proto::ReleaseLeasesRequest* request,
                             proto::ReleaseLeasesReply* reply) override {
    return StatusList(
        state_->ReleaseLeases(
            request->client_id(),
            std::span(request->lease_id().data(), static_cast<size_t>(request->lease_id_size()))),
        reply);
  }

  grpc::Status BatchExist(grpc::ServerContext*, const proto::BatchKeysRequest* request,
                          proto::BatchExistReply* reply) override {
    ReleaseCarried(request->client_id(), request->release_leases());
    auto results = state_->BatchExist(request->client_id(), Keys(*request));
    if (!results.ok()) return ToGrpc(results.status());
    reply->mutable_exists()->Reserve(static_cast<int>(results->size()));
    for (const Status& status : *results) reply->add_exists(status.ok());
    return grpc::Status::OK;
  }

  grpc::Status BatchRemove(grpc::ServerContext*, const proto::BatchKeysRequest* request,
                           proto::BatchStatusReply* reply) override {
    ReleaseCarried(request->client_id(), request->release_leases());
    return StatusList(state_->BatchRemove(request->client_id(), Keys(*request)), reply);
  }

  grpc::Status RemoveAll(grpc::ServerContext*, const proto::RemoveAllRequest* request,
                         proto::RemoveAllReply* reply) override {
    auto outcome = state_->RemoveAll(request->client_id());
    if (!outcome.ok()) return ToGrpc(outcome.status());
    reply->set_removed(outcome->removed);
    reply->set_skipped_leased(outcome->skipped_leased);
    return grpc::Status::OK;
  }

  grpc::Status ListSegments(grpc::ServerContext*, const proto::ListSegmentsRequest* request,
                            proto::ListSegmentsReply* reply) override {
    std::vector<SegmentId> ids(request->segment_id().begin(), request->segment_id().end());
    for (const SegmentView& view : state_->ListSegments(ids)) {
      FillSegment(view, reply->add_segments());
    }
    return grpc::Status::OK;
  }

  grpc::Status GetStats(grpc::ServerContext*, const proto::StatsRequest*,
                        proto::StatsReply* reply) override {
    MasterStats stats = state_->Stats();
    reply->set_objects(stats.objects);
    reply->set_bytes_used(stats.bytes_used);
    reply->set_bytes_capacity(stats.bytes_capacity);
    reply->set_segments(stats.segments);
    reply->set_clients(stats.clients);
    reply->set_evictions(stats.evictions);
    reply->set_lease_expiries(stats.lease_expiries);
    reply->set_master_incarnation(stats.incarnation);
    reply->set_lease_releases(stats.lease_releases);
    reply->set_leases_active(stats.leases_active);
    return grpc::Status::OK;
  }

 private:
  MasterState* state_;
};

}  // namespace

std::unique_ptr<proto::Master::Service> NewMasterService(MasterState* state) {
  return std::make_unique<MasterService>(state);
}

}  // namespace larder::master
