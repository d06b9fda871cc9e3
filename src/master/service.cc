// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/service.h"

#include <algorithm>

#include "common/error_detail_wire.h"
#include "common/limits.h"
#include "common/logging.h"
#include "common/segment_descriptor_proto.h"
#include "larder/transfer_engine.h"

namespace larder::master {

grpc::Status ToGrpc(const Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), status.message(),
                      ErrorDetailToWire(status.detail()));
}

namespace {

void SetStatus(proto::ItemStatus* out, const Status& status) {
  out->set_code(static_cast<int32_t>(status.code()));
  if (!status.ok()) out->set_message(status.message());
  if (status.detail() != ErrorDetail::kNone)
    out->set_detail(static_cast<uint32_t>(status.detail()));
}

// A transport's or gauge's name as a heartbeat may give it: it becomes part of a metric's name.
bool IsGaugeName(std::string_view name) {
  return !name.empty() && name.size() <= kMaxGaugeNameBytes &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
         });
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
  ToProto(view.descriptor, out->mutable_segment_descriptor());
}

// A mount as the state takes it, with its checked descriptor; the catalog's keys are copied.
SegmentMount ToMount(const proto::SegmentInfo& segment, SegmentDescriptor descriptor) {
  SegmentMount mount{segment.name(), segment.base(), segment.size(), std::move(descriptor)};
  mount.catalog.reserve(static_cast<size_t>(segment.catalog_size()));
  for (const proto::CatalogEntry& entry : segment.catalog()) {
    mount.catalog.push_back(CatalogEntry{entry.key(), entry.offset(), entry.size(), entry.pinned(),
                                         entry.soft_pin_remaining_ms(), entry.last_access()});
  }
  mount.catalog_incarnation = segment.catalog_incarnation();
  mount.verifies_catalog = segment.verifies_catalog();
  return mount;
}

// A segment belongs to the client that mounts it: its descriptor must be the one that client's
// engine published for this segment. Otherwise a token holder could mount another client's
// descriptor under a name of its own, and every put placed there would be written into that
// client's memory over its objects. Returns the mount of a segment that is the client's own.
Result<SegmentMount> OwnMount(const proto::MountSegmentsRequest& request,
                              const proto::SegmentInfo& segment) {
  const std::string name = QuoteKey(segment.name());
  auto descriptor = FromProto(segment.segment_descriptor());
  if (!descriptor.ok()) {
    return InvalidArgumentError("descriptor of segment " + name +
                                " is not a segment descriptor: " + descriptor.status().message());
  }
  if (descriptor->engine_id != request.client_id()) {
    return PermissionDeniedError("descriptor of segment " + name + " is engine " +
                                 QuoteKey(descriptor->engine_id) + "'s, not the mounting client " +
                                 QuoteKey(request.client_id()) +
                                 "'s: a client mounts only its own segments");
  }
  if (descriptor->host_id != request.host_id()) {
    return PermissionDeniedError("descriptor of segment " + name + " is on host " +
                                 QuoteKey(descriptor->host_id) + ", not the mounting client's " +
                                 QuoteKey(request.host_id()));
  }
  if (descriptor->name != segment.name()) {
    return InvalidArgumentError("descriptor of segment " + name + " describes segment " +
                                QuoteKey(descriptor->name));
  }
  if (descriptor->size != segment.size()) {
    return InvalidArgumentError("descriptor of segment " + name + " says " +
                                std::to_string(descriptor->size) + " bytes, the mount " +
                                std::to_string(segment.size()));
  }
  return ToMount(segment, std::move(descriptor).value());
}

// With `touches_apart`, TOUCHes go into the reply's columns: most changes of a read-mostly pool
// are TOUCHes, and a row of two numbers costs far less to build, send and apply than a message.
void FillCatalogChanges(const SegmentCatalogChanges& changes, bool touches_apart,
                        proto::SegmentCatalogChanges* out) {
  out->set_segment_id(changes.segment_id);
  out->set_reset(changes.reset);
  out->set_more(changes.more);
  out->set_last_seq(changes.last_seq);
  size_t touches = 0;
  if (touches_apart) {
    for (const CatalogChange& change : changes.changes) {
      touches += change.kind == CatalogChangeKind::kTouch ? 1 : 0;
    }
    out->mutable_touch_offset()->Reserve(static_cast<int>(touches));
    out->mutable_touch_last_access()->Reserve(static_cast<int>(touches));
  }
  out->mutable_changes()->Reserve(static_cast<int>(changes.changes.size() - touches));
  for (const CatalogChange& change : changes.changes) {
    if (touches_apart && change.kind == CatalogChangeKind::kTouch) {
      out->add_touch_offset(change.entry.offset);
      out->add_touch_last_access(change.entry.last_access);
      continue;
    }
    proto::CatalogChange* c = out->add_changes();
    c->set_seq(change.seq);
    c->set_kind(static_cast<proto::CatalogChange::Kind>(change.kind));
    proto::CatalogEntry* entry = c->mutable_entry();
    entry->set_key(change.entry.key);
    entry->set_offset(change.entry.offset);
    entry->set_size(change.entry.size);
    entry->set_pinned(change.entry.pinned);
    entry->set_soft_pin_remaining_ms(change.entry.soft_pin_remaining_ms);
    entry->set_last_access(change.entry.last_access);
  }
}

// Bounds a keys request before any vector is built for it.
grpc::Status CheckKeysRequest(const proto::BatchKeysRequest& request) {
  Status status = CheckBatchSize(static_cast<size_t>(request.keys_size()), "keys");
  if (status.ok())
    status = CheckBatchSize(static_cast<size_t>(request.release_leases_size()), "lease ids");
  return ToGrpc(status);
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

DiskHolderReport HolderReport(const proto::DiskHolder& holder) {
  return DiskHolderReport{holder.identity(), holder.capacity_bytes(), holder.used_bytes(),
                          holder.records()};
}

class MasterService final : public proto::Master::Service {
 public:
  MasterService(MasterState* state, SessionTable* sessions, const LocalControl* local)
      : state_(state), sessions_(sessions), local_(local) {}

  // Keys a get found no object of, whose only copy is on a disk: a metadata read answers the
  // copy's size; a read asks the copy's holder to put the object back and answers kOnDisk, so that
  // the reader repeats its get shortly.
  void AnswerFromDisk(const proto::BatchKeysRequest& request, std::vector<GetOutcome>* items) {
    for (size_t i = 0; i < items->size(); ++i) {
      GetOutcome& outcome = (*items)[i];
      // A key being written while it has a disk copy is that copy coming back (any other put of
      // the key dropped the copy when it started), as is one whose promotion has just begun (its
      // copy may have left the disk meanwhile): the reader waits for it as for a promotion.
      const bool being_written = outcome.status.detail() == ErrorDetail::kBeingWritten;
      if (outcome.status.code() != StatusCode::kNotFound &&
          outcome.status.detail() != ErrorDetail::kRebuilding && !being_written) {
        continue;
      }
      const std::string& key = request.keys(static_cast<int>(i));
      std::optional<uint64_t> size = state_->disk().Find(key);
      const bool promoting =
          being_written && !request.metadata_only() &&
          (size || state_->disk().JustPromoted(key) || state_->disk().BeingPromoted(key));
      if (promoting && !size) {
        outcome.status =
            UnavailableError("key " + QuoteKey(key) + " is on disk; its holder is bringing it back")
                .WithDetail(ErrorDetail::kOnDisk);
        continue;
      }
      if (!size) continue;
      outcome.size = *size;
      if (request.metadata_only()) {
        outcome.status = Status::Ok();
      } else if (promoting) {
        outcome.status =
            UnavailableError("key " + QuoteKey(key) + " is on disk; its holder is bringing it back")
                .WithDetail(ErrorDetail::kOnDisk);
      } else if (!request.quiet() && state_->disk().QueuePromote(key)) {
        outcome.status =
            UnavailableError("key " + QuoteKey(key) + " is on disk; its holder is bringing it back")
                .WithDetail(ErrorDetail::kOnDisk);
      }
    }
  }

  grpc::Status Challenge(grpc::ServerContext*, const proto::ChallengeRequest*,
                         proto::ChallengeReply* reply) override {
    reply->set_auth_required(sessions_->enabled());
    if (sessions_->enabled()) {
      reply->set_server_nonce(sessions_->NewChallenge());
      reply->set_proof_in_body(sessions_->offers_proof_in_body());  // see signed_service.cc
    }
    reply->set_master_incarnation(state_->incarnation());
    // A client sends its proofs over the local socket after the request's bytes only.
    if (local_ != nullptr && !local_->socket.empty() &&
        (!sessions_->enabled() || sessions_->offers_proof_in_body())) {
      reply->set_local_socket(local_->socket);
      reply->set_host_id(local_->host_id);
    }
    return grpc::Status::OK;
  }

  grpc::Status OpenSession(grpc::ServerContext* context, const proto::OpenSessionRequest* request,
                           proto::OpenSessionReply* reply) override {
    if (!sessions_->enabled()) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "this master has no cluster token; calls need no session");
    }
    auto opened = sessions_->Open(
        request->client_id(), request->client_nonce(), request->server_nonce(), request->proof(),
        request->admin_proof(),
        SessionTable::EngineProof{request->identity_key(), request->identity_signature()});
    if (!opened.ok()) {
      Log().warn("OpenSession from {} refused: {}", context->peer(), opened.status().ToString());
      return ToGrpc(opened.status());
    }
    reply->set_session_id(opened->session_id);
    reply->set_proof(opened->proof.data(), opened->proof.size());
    reply->set_admin(opened->admin);
    return grpc::Status::OK;
  }

  // Leases released on the back of another call: best effort, like the call they ride on (an
  // unknown client's are dropped with it, and expire at their TTL).
  void ReleaseCarried(const std::string& client_id,
                      const google::protobuf::RepeatedField<uint64_t>& ids) {
    if (ids.empty() || static_cast<size_t>(ids.size()) > kMaxBatchKeys) return;
    state_->ReleaseLeases(client_id, std::span(ids.data(), static_cast<size_t>(ids.size())))
        .status()
        .IgnoreError();
  }

  grpc::Status MountSegments(grpc::ServerContext*, const proto::MountSegmentsRequest* request,
                             proto::MountSegmentsReply* reply) override {
    if (request->client_id().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "empty client id");
    }
    if (request->segments_size() > static_cast<int>(kMaxSegmentsPerMount)) {
      return ToGrpc(InvalidArgumentError(std::to_string(request->segments_size()) +
                                         " segments in one mount; at most " +
                                         std::to_string(kMaxSegmentsPerMount)));
    }
    // Segments that are not the caller's own are refused here; the others mount.
    std::vector<Status> checks;
    std::vector<SegmentMount> mounts;
    checks.reserve(static_cast<size_t>(request->segments_size()));
    for (const proto::SegmentInfo& segment : request->segments()) {
      Result<SegmentMount> mount = OwnMount(*request, segment);
      checks.push_back(mount.status());
      if (mount.ok()) {
        mounts.push_back(std::move(mount).value());
      } else {
        Log().warn("client {} mounts a segment that is not its own: {}",
                   request->client_id().substr(0, 64), checks.back().message());
      }
    }
    MountCaller caller{request->client_id(), request->host_id(), request->pid(),
                       request->take_over_pid()};
    std::vector<MountOutcome> outcomes = state_->MountSegments(caller, mounts);
    size_t next = 0;
    for (const Status& check : checks) {
      MountOutcome refused;
      refused.status = check;
      const MountOutcome& outcome = check.ok() ? outcomes[next++] : refused;
      SetStatus(reply->add_status(), outcome.status);
      reply->add_segment_id(outcome.status.ok() ? outcome.segment_id : 0);
      proto::CatalogRecovery* recovery = reply->add_recovery();
      recovery->set_restored(outcome.recovery.restored);
      recovery->set_dropped(outcome.recovery.dropped);
      reply->add_holder_host_id(outcome.holder_host_id);
      reply->add_holder_pid(outcome.holder_pid);
    }
    reply->set_master_incarnation(state_->incarnation());
    return grpc::Status::OK;
  }

  grpc::Status SyncCatalog(grpc::ServerContext*, const proto::SyncCatalogRequest* request,
                           proto::SyncCatalogReply* reply) override {
    if (request->acks_size() > static_cast<int>(kMaxSegmentsPerMount)) {
      return ToGrpc(InvalidArgumentError(std::to_string(request->acks_size()) +
                                         " catalog acks in one call; at most " +
                                         std::to_string(kMaxSegmentsPerMount)));
    }
    std::vector<CatalogAck> acks;
    acks.reserve(static_cast<size_t>(request->acks_size()));
    for (const proto::CatalogAck& ack : request->acks()) {
      acks.push_back(CatalogAck{ack.segment_id(), ack.seq(), ack.full()});
    }
    auto segments = state_->SyncCatalog(request->client_id(), acks);
    if (!segments.ok()) return ToGrpc(segments.status());
    for (const SegmentCatalogChanges& segment : *segments) {
      FillCatalogChanges(segment, request->touches_apart(), reply->add_segments());
    }
    reply->set_master_incarnation(state_->incarnation());
    return grpc::Status::OK;
  }

  grpc::Status UnmountSegments(grpc::ServerContext*, const proto::UnmountSegmentsRequest* request,
                               proto::UnmountSegmentsReply* reply) override {
    std::vector<PoolSegmentId> ids(request->segment_id().begin(), request->segment_id().end());
    auto results = state_->UnmountSegments(request->client_id(), ids, request->unregister_client());
    if (!results.ok()) return ToGrpc(results.status());
    if (request->unregister_client()) sessions_->CloseClient(request->client_id());
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
    bool reported = entries > 0;
    for (const proto::TransportGauge& gauge : request->gauges()) {
      if (traffic.gauges.size() == kMaxTransportGauges) break;
      if (!IsGaugeName(gauge.name()) || !IsGaugeName(gauge.transport()) ||
          std::any_of(traffic.gauges.begin(), traffic.gauges.end(),
                      [&](const TransportGaugeReport& g) { return g.name == gauge.name(); })) {
        continue;
      }
      traffic.gauges.push_back({gauge.transport(), gauge.name(), gauge.value()});
      reported = reported || gauge.value() > 0;
    }
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
    if (Status size = CheckBatchSize(static_cast<size_t>(request->items_size()), "put items");
        !size.ok()) {
      return ToGrpc(size);
    }
    if (request->preferred_segments_size() > static_cast<int>(kMaxPreferredSegments)) {
      return ToGrpc(InvalidArgumentError(std::to_string(request->preferred_segments_size()) +
                                         " preferred segments; at most " +
                                         std::to_string(kMaxPreferredSegments)));
    }
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
    // The proto's enums are open: a value past the last action the state refuses as unknown, one
    // that is not even a byte here.
    const int32_t action = request->soft_pin_action();
    if (action < 0 || action > UINT8_MAX) {
      return ToGrpc(InvalidArgumentError("unknown soft-pin action " + std::to_string(action)));
    }
    options.soft_pin_action = static_cast<SoftPinAction>(action);
    if (request->has_soft_pin_ttl_ms()) {
      // Clamped, not wrapped: any TTL this large is past the maximum and refused.
      options.soft_pin_ttl = std::chrono::milliseconds(
          static_cast<int64_t>(std::min<uint64_t>(request->soft_pin_ttl_ms(), INT64_MAX)));
    }
    options.upsert = request->upsert();
    auto results = state_->BatchPutStart(request->client_id(), items, options);
    if (!results.ok()) return ToGrpc(results.status());
    if (state_->disk().active()) {
      // A new object of a key replaces its disk copy, unless it is that copy coming back (a
      // promotion by the copy's own holder).
      std::vector<std::string_view> replaced;
      for (size_t i = 0; i < results->size(); ++i) {
        const PutStartOutcome& outcome = (*results)[i];
        std::string_view key = items[i].key;
        if (request->promotion()) {
          // The copy is coming back, or is back already (an object of the key is in memory):
          // either way the promotion is done, and the copy stays.
          const bool own = state_->disk().Promoted(key, request->client_id());
          if (outcome.already_exists || !outcome.status.ok()) {
            state_->disk().PutsEnded(std::span(&key, 1));  // no put to wait for
            continue;
          }
          if (own) continue;
        } else if (!outcome.status.ok() || outcome.already_exists) {
          continue;
        }
        replaced.push_back(key);
      }
      state_->disk().Invalidate(replaced);
      if (request->write_through()) state_->disk().ExpectWriteThrough(replaced);
      // Puts are what turns the pool over: the next demotions are chosen as they come.
      state_->KickDemotions();
    }
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
    if (grpc::Status bad = CheckKeysRequest(*request); !bad.ok()) return bad;
    ReleaseCarried(request->client_id(), request->release_leases());
    const std::vector<std::string_view> keys = Keys(*request);
    auto ends = state_->BatchPutEnd(request->client_id(), keys);
    state_->disk().PutsEnded(keys);
    if (ends.ok() && state_->disk().WriteThroughExpected()) {
      // Puts that asked for write-through: their objects go to disk now.
      for (size_t i = 0; i < keys.size(); ++i) {
        if ((*ends)[i].ok() && state_->disk().TakeWriteThrough(keys[i])) state_->DemoteNow(keys[i]);
      }
    }
    return StatusList(ends, reply);
  }

  grpc::Status BatchPutRevoke(grpc::ServerContext*, const proto::BatchKeysRequest* request,
                              proto::BatchStatusReply* reply) override {
    if (grpc::Status bad = CheckKeysRequest(*request); !bad.ok()) return bad;
    ReleaseCarried(request->client_id(), request->release_leases());
    const std::vector<std::string_view> keys = Keys(*request);
    auto revoked = state_->BatchPutRevoke(request->client_id(), keys);
    state_->disk().PutsEnded(keys);
    return StatusList(revoked, reply);
  }

  grpc::Status BatchGetReplicas(grpc::ServerContext*, const proto::BatchKeysRequest* request,
                                proto::BatchGetReplicasReply* reply) override {
    if (grpc::Status bad = CheckKeysRequest(*request); !bad.ok()) return bad;
    const auto& release = request->release_leases();
    auto batch =
        state_->BatchGetReplicas(request->client_id(), Keys(*request),
                                 request->metadata_only() ? GetMode::kPeek
                                 : request->quiet()       ? GetMode::kLeaseQuiet
                                                          : GetMode::kLease,
                                 std::span(release.data(), static_cast<size_t>(release.size())));
    if (!batch.ok()) return ToGrpc(batch.status());
    if (state_->disk().active()) {
      AnswerFromDisk(*request, &batch->items);
    }
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
    if (grpc::Status bad = CheckKeysRequest(*request); !bad.ok()) return bad;
    ReleaseCarried(request->client_id(), request->release_leases());
    auto results = state_->BatchExist(request->client_id(), Keys(*request));
    if (!results.ok()) return ToGrpc(results.status());
    if (state_->disk().active()) {
      for (size_t i = 0; i < results->size(); ++i) {
        if ((*results)[i].code() == StatusCode::kNotFound &&
            state_->disk().Find(request->keys(static_cast<int>(i)))) {
          (*results)[i] = Status::Ok();
        }
      }
    }
    reply->mutable_exists()->Reserve(static_cast<int>(results->size()));
    for (size_t i = 0; i < results->size(); ++i) {
      const Status& status = (*results)[i];
      reply->add_exists(status.ok());
      if (!status.ok() && status.code() != StatusCode::kNotFound) {
        proto::KeyError* error = reply->add_errors();
        error->set_index(static_cast<uint32_t>(i));
        SetStatus(error->mutable_status(), status);
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status BatchRemove(grpc::ServerContext*, const proto::BatchKeysRequest* request,
                           proto::BatchStatusReply* reply) override {
    if (grpc::Status bad = CheckKeysRequest(*request); !bad.ok()) return bad;
    ReleaseCarried(request->client_id(), request->release_leases());
    std::vector<std::string_view> keys = Keys(*request);
    auto results =
        state_->BatchRemove(request->client_id(), keys, request->force(), request->segment(),
                            std::chrono::milliseconds(request->unused_for_ms()));
    // A whole object's removal takes its disk copy too; a key only on disk is removed by that.
    if (results.ok() && request->segment().empty() && state_->disk().active()) {
      std::vector<std::string_view> gone;
      for (size_t i = 0; i < keys.size(); ++i) {
        Status& status = (*results)[i];
        if (status.code() == StatusCode::kNotFound && state_->disk().Has(keys[i])) {
          status = Status::Ok();
        }
        if (status.ok()) gone.push_back(keys[i]);
      }
      state_->disk().Invalidate(gone);
    }
    return StatusList(results, reply);
  }

  grpc::Status RemoveAll(grpc::ServerContext*, const proto::RemoveAllRequest* request,
                         proto::RemoveAllReply* reply) override {
    auto outcome = state_->RemoveAll(request->client_id(), request->tenant(), request->force());
    if (!outcome.ok()) return ToGrpc(outcome.status());
    reply->set_removed(outcome->removed);
    reply->set_skipped_leased(outcome->skipped_leased);
    return grpc::Status::OK;
  }

  grpc::Status RemoveByRegex(grpc::ServerContext*, const proto::RemoveByRegexRequest* request,
                             proto::RemoveAllReply* reply) override {
    auto outcome = state_->RemoveByRegex(request->client_id(), request->tenant(),
                                         request->pattern(), request->force());
    if (!outcome.ok()) return ToGrpc(outcome.status());
    reply->set_removed(outcome->removed);
    reply->set_skipped_leased(outcome->skipped_leased);
    return grpc::Status::OK;
  }

  grpc::Status DiskPoll(grpc::ServerContext*, const proto::DiskPollRequest* request,
                        proto::DiskPollReply* reply) override {
    auto host = state_->ClientHostId(request->client_id());
    if (!host.ok()) return ToGrpc(host.status());
    // A busy holder polls again as soon as it reported: its next work is chosen now, not at the
    // sweeper's next round.
    state_->KickDemotions();
    auto tasks = state_->disk().Poll(request->client_id(), *host, HolderReport(request->holder()),
                                     std::chrono::milliseconds(request->wait_ms()));
    if (!tasks.ok()) return ToGrpc(tasks.status());
    if (!tasks->replaced_client.empty()) state_->MarkReplaced(tasks->replaced_client);
    reply->mutable_demote()->Assign(tasks->demote.begin(), tasks->demote.end());
    reply->mutable_promote()->Assign(tasks->promote.begin(), tasks->promote.end());
    reply->mutable_drop()->Assign(tasks->drop.begin(), tasks->drop.end());
    reply->set_announce(tasks->announce);
    return grpc::Status::OK;
  }

  grpc::Status DiskReport(grpc::ServerContext*, const proto::DiskReportRequest* request,
                          proto::DiskReportReply* reply) override {
    // An announcement lists a whole disk: bounded by what one message carries, not by the batch
    // limit; the other lists are one batch's.
    for (int size : {request->evicted_size(), request->failed_size()}) {
      if (Status bad = CheckBatchSize(static_cast<size_t>(size), "keys"); !bad.ok()) {
        return ToGrpc(bad);
      }
    }
    if (!request->announce()) {
      if (Status bad = CheckBatchSize(static_cast<size_t>(request->stored_size()), "keys");
          !bad.ok()) {
        return ToGrpc(bad);
      }
    }
    std::vector<DiskCopyReport> stored;
    stored.reserve(static_cast<size_t>(request->stored_size()));
    const size_t max_key = state_->options().max_key_size;
    for (const proto::DiskCopy& copy : request->stored()) {
      if (copy.key().empty() || copy.key().size() > max_key) {
        return ToGrpc(InvalidArgumentError("a disk copy's key of " +
                                           std::to_string(copy.key().size()) + " bytes"));
      }
      // Its size answers Exist and GetSize, and callers size buffers by it.
      if (copy.size() == 0 || copy.size() > kMaxDiskRegionBytes) {
        return ToGrpc(InvalidArgumentError("a disk copy of " + std::to_string(copy.size()) +
                                           " bytes (1 to " + std::to_string(kMaxDiskRegionBytes) +
                                           ")"));
      }
      stored.push_back(DiskCopyReport{copy.key(), copy.size(), copy.generation()});
    }
    std::vector<std::string> evicted(request->evicted().begin(), request->evicted().end());
    std::vector<std::string> failed(request->failed().begin(), request->failed().end());
    auto refused = state_->disk().Report(request->client_id(), HolderReport(request->holder()),
                                         stored, evicted, failed, request->announce(),
                                         [this](std::string_view key, uint64_t) {
                                           // Only for keys with no object in memory: a copy
                                           // announced after a restart may be of an earlier object
                                           // of the key (overwritten while its holder was away),
                                           // and its bytes must never stand in for the current
                                           // one's.
                                           return !state_->HasObject(key);
                                         });
    if (!refused.ok()) return ToGrpc(refused.status());
    reply->mutable_refused()->Assign(refused->begin(), refused->end());
    return grpc::Status::OK;
  }

  grpc::Status ListSegments(grpc::ServerContext*, const proto::ListSegmentsRequest* request,
                            proto::ListSegmentsReply* reply) override {
    std::vector<PoolSegmentId> ids(request->segment_id().begin(), request->segment_id().end());
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
    reply->set_recovered_objects(stats.recovered_objects);
    reply->set_catalog_entries_dropped(stats.catalog_entries_dropped);
    return grpc::Status::OK;
  }

 private:
  MasterState* state_;
  SessionTable* sessions_;
  const LocalControl* local_;
};

}  // namespace

std::unique_ptr<proto::Master::Service> NewMasterHandlers(MasterState* state,
                                                          SessionTable* sessions,
                                                          const LocalControl* local) {
  return std::make_unique<MasterService>(state, sessions, local);
}

}  // namespace larder::master
