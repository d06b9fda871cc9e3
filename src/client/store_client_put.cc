// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
// StoreClientImpl: the put path (BatchPutStart, writes into the replicas, BatchPutEnd or
// BatchPutRevoke).

#include <algorithm>

#include "client/store_client_impl.h"
#include "common/limits.h"
#include "common/logging.h"

namespace larder::client {

std::vector<Status> StoreClientImpl::PutImpl(std::span<const std::string> keys,
                                             std::span<const std::span<const BufferSlice>> pieces,
                                             const PutConfig& config, const CallScope& scope) {
  std::vector<Status> results(keys.size());
  if (keys.empty()) return results;
  if (keys.size() > kMaxBatchKeys)
    return std::vector<Status>(keys.size(), BatchTooLarge(keys.size()));
  std::vector<uint64_t> sizes(keys.size(), 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    for (const BufferSlice& slice : pieces[i]) sizes[i] += slice.size;
  }
  proto::BatchPutStartRequest request;
  proto::BatchPutStartReply reply;
  request.mutable_items()->Reserve(static_cast<int>(keys.size()));
  for (size_t i = 0; i < keys.size(); ++i) {
    proto::PutItem* item = request.add_items();
    item->set_key(MasterKey(keys[i], scope));
    item->set_size(sizes[i]);
  }
  request.set_replica_num(config.replica_num != 0 ? config.replica_num : options_.replica_num);
  request.mutable_preferred_segments()->Add(config.preferred_segments.begin(),
                                            config.preferred_segments.end());
  request.set_pin(config.pin);
  request.set_soft_pin_action(static_cast<proto::SoftPinAction>(config.soft_pin_action));
  if (config.soft_pin_ttl) {
    request.set_soft_pin_ttl_ms(static_cast<uint64_t>(std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(*config.soft_pin_ttl).count())));
  }
  request.set_upsert(config.overwrite);
  request.set_promotion(scope.promotion);
  request.set_write_through(config.disk_write_through);
  AddUnreachable(&request);
  Status status = Rpc("BatchPutStart", &Stub::BatchPutStart, &request, &reply);
  if (status.ok()) status = CheckPutStartReply(reply, keys.size());
  if (!status.ok()) return std::vector<Status>(keys.size(), status);

  std::vector<uint64_t> segment_ids;
  for (const proto::PutStartResult& result : reply.results()) {
    for (const proto::Replica& replica : result.replicas()) {
      segment_ids.push_back(replica.segment_id());
    }
  }
  SegmentHandles opened;
  OpenSegments(segment_ids, &opened);

  std::vector<TransferRequest> transfers;
  std::vector<size_t> owner;        // transfers[j] writes a replica of keys[owner[j]]
  std::vector<uint64_t> target_of;  // ... into master segment target_of[j]
  std::vector<bool> started(keys.size(), false);
  for (size_t i = 0; i < keys.size(); ++i) {
    const proto::PutStartResult& result = reply.results(static_cast<int>(i));
    results[i] = FromItemStatus(result.status());
    if (!results[i].ok() || result.already_exists()) continue;
    started[i] = true;
    for (const proto::Replica& replica : result.replicas()) {
      const SegmentHandleRank* segment = opened.Find(replica.segment_id());
      if (segment == nullptr) {
        results[i] = UnavailableError("key '" + keys[i] + "': segment " +
                                      std::to_string(replica.segment_id()) + " is unreachable");
        MarkUnreachable(replica.segment_id());
        break;
      }
      uint64_t offset = replica.offset();
      for (const BufferSlice& slice : pieces[i]) {
        if (slice.size == 0) continue;
        transfers.push_back(
            TransferRequest{TransferOp::kWrite, slice.ptr, segment->handle, offset, slice.size});
        owner.push_back(i);
        target_of.push_back(replica.segment_id());
        offset += slice.size;
      }
    }
  }
  if (!transfers.empty()) {
    auto done = engine_->TransferSync(transfers, options_.transfer_timeout);
    for (size_t j = 0; j < transfers.size(); ++j) {
      Status transfer = done.ok() ? (*done)[j].status : done.status();
      if (transfer.code() == StatusCode::kUnavailable) MarkUnreachable(target_of[j]);
      if (!transfer.ok() && results[owner[j]].ok()) {
        results[owner[j]] = transfer.WithContext("writing key '" + keys[owner[j]] + "'");
      }
    }
  }
  // What went into this client's own segment is hashed for its catalog while still in cache.
  if (membership_ && membership_->catalog().verifies()) {
    const uint64_t own = membership_->segment_id();
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!started[i] || !results[i].ok()) continue;
      for (const proto::Replica& replica : reply.results(static_cast<int>(i)).replicas()) {
        if (replica.segment_id() == own) {
          membership_->NoteWritten(replica.offset(), MasterKey(keys[i], scope), sizes[i]);
        }
      }
    }
  }
  // One RPC commits the written objects, one abandons the failed ones.
  proto::BatchKeysRequest end, revoke;
  std::vector<size_t> ended;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!started[i]) continue;
    if (results[i].ok()) {
      end.add_keys(MasterKey(keys[i], scope));
      ended.push_back(i);
    } else {
      revoke.add_keys(MasterKey(keys[i], scope));
    }
  }
  if (end.keys_size() > 0) {
    proto::BatchStatusReply end_reply;
    Status end_status = Rpc("BatchPutEnd", &Stub::BatchPutEnd, &end, &end_reply);
    std::vector<Status> end_results = end_status.ok()
                                          ? ItemStatuses(ended.size(), end_reply.errors())
                                          : std::vector<Status>(ended.size(), end_status);
    for (size_t j = 0; j < ended.size(); ++j) results[ended[j]] = std::move(end_results[j]);
  }
  if (revoke.keys_size() > 0) {
    proto::BatchStatusReply revoke_reply;
    Status revoked = Rpc("BatchPutRevoke", &Stub::BatchPutRevoke, &revoke, &revoke_reply);
    if (!revoked.ok()) Log().debug("revoke failed: {}", revoked.ToString());
  }
  return results;
}

}  // namespace larder::client
