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

}  // namespace larder::client
