// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The client side of proto/master.proto: one gRPC channel to larder-master, calls with a deadline,
// and gRPC errors mapped to Status with the master's address as context.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "larder/status.h"
#include "master.grpc.pb.h"

namespace larder::client {

// Thread-safe: gRPC stubs may be shared between threads.
class MasterClient {
 public:
  MasterClient(std::string address, std::chrono::milliseconds timeout);

  const std::string& address() const { return address_; }

  // Calls `method` on the stub. Errors: Unavailable "larder-master <address> unreachable" when the
  // master cannot be reached; otherwise the master's status, prefixed with the call's name.
  template <typename Request, typename Reply>
  Status Call(const char* name,
              grpc::Status (proto::Master::Stub::*method)(grpc::ClientContext*, const Request&,
                                                          Reply*),
              const Request& request, Reply* reply) const {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + timeout_);
    return FromGrpc(name, (stub_.get()->*method)(&context, request, reply));
  }

 private:
  Status FromGrpc(const char* name, const grpc::Status& status) const;

  std::string address_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::Master::Stub> stub_;
};

// A per-item status from a reply. A code outside the canonical set becomes Unknown.
inline Status FromItemStatus(const proto::ItemStatus& status) {
  if (status.code() == 0) return Status::Ok();
  if (status.code() < 0 || status.code() > 15)
    return Status(StatusCode::kUnknown, status.message());
  return Status(static_cast<StatusCode>(status.code()), status.message());
}

// The statuses of a batch of `count` items from a reply's error list: OK for every item the list
// does not name. A list that names an item outside the batch, or an OK error, cannot be trusted:
// every item is then Internal.
std::vector<Status> ItemStatuses(size_t count,
                                 const google::protobuf::RepeatedPtrField<proto::KeyError>& errors);

// OK when a GetReplicas reply has the shape of an answer to `count` keys (one size and one
// replica count per key, one segment and one offset per replica); Internal otherwise.
Status CheckReplicaColumns(const proto::BatchGetReplicasReply& reply, size_t count);

}  // namespace larder::client
