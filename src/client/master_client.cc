// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "client/master_client.h"

namespace larder::client {

MasterClient::MasterClient(std::string address, std::chrono::milliseconds timeout)
    : address_(std::move(address)), timeout_(timeout) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  // Reconnect quickly to a restarted master (gRPC's default backoff grows to two minutes).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  channel_ = grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args);
  stub_ = proto::Master::NewStub(channel_);
}

Status MasterClient::FromGrpc(const char* name, const grpc::Status& status) const {
  if (status.ok()) return Status::Ok();
  auto code = static_cast<StatusCode>(status.error_code());
  if (code == StatusCode::kUnavailable || code == StatusCode::kDeadlineExceeded) {
    return Status(code, std::string("larder-master ") + address_ + " unreachable (" + name +
                            "): " + status.error_message());
  }
  if (static_cast<int>(code) < 0 || static_cast<int>(code) > 15) code = StatusCode::kUnknown;
  return Status(code, std::string(name) + ": " + status.error_message());
}

std::vector<Status> ItemStatuses(
    size_t count, const google::protobuf::RepeatedPtrField<proto::KeyError>& errors) {
  std::vector<Status> statuses(count);
  for (const proto::KeyError& error : errors) {
    if (error.index() >= count || error.status().code() == 0) {
      return std::vector<Status>(
          count,
          InternalError("larder-master sent a malformed reply: error for item " +
                        std::to_string(error.index()) + " of a batch of " + std::to_string(count)));
    }
    statuses[error.index()] = FromItemStatus(error.status());
  }
  return statuses;
}

Status CheckReplicaColumns(const proto::BatchGetReplicasReply& reply, size_t count) {
  uint64_t replicas = 0;
  for (uint32_t n : reply.replica_count()) replicas += n;
  if (static_cast<size_t>(reply.size_size()) != count ||
      static_cast<size_t>(reply.replica_count_size()) != count ||
      static_cast<uint64_t>(reply.segment_id_size()) != replicas ||
      static_cast<uint64_t>(reply.offset_size()) != replicas) {
    return InternalError(
        "larder-master sent a malformed GetReplicas reply: " + std::to_string(reply.size_size()) +
        " sizes and " + std::to_string(reply.replica_count_size()) + " replica counts for " +
        std::to_string(count) + " keys, " + std::to_string(reply.segment_id_size()) +
        " segments and " + std::to_string(reply.offset_size()) + " offsets for " +
        std::to_string(replicas) + " replicas");
  }
  return Status::Ok();
}

}  // namespace larder::client
