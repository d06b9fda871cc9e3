// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The client side of proto/master.proto: one gRPC channel to larder-master, calls with a deadline,
// and gRPC errors mapped to Status with the master's address as context.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

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

// A per-item status from a reply.
inline Status FromItemStatus(const proto::ItemStatus& status) {
  if (status.code() == 0) return Status::Ok();
  return Status(static_cast<StatusCode>(status.code()), status.message());
}

}  // namespace larder::client
