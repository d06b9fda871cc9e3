// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The client side of proto/master.proto: one gRPC channel to larder-master, calls with a deadline,
// gRPC errors mapped to Status with the master's address as context, and, with a cluster token,
// the session every call proves (src/common/control_auth.h, docs/security.md).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "larder/status.h"
#include "master.grpc.pb.h"

namespace larder::client {

struct MasterClientOptions {
  std::string address;
  std::chrono::milliseconds timeout{10000};
  // The id the session acts for (the client's engine id). Empty: a random one.
  std::string client_id;
  // Cluster token. Empty: no session (the master must have no token either).
  std::string auth_token;
  // Operator token, for RemoveAll. Empty: a client session only.
  std::string admin_token;
  // PEM CA that the master's TLS certificate must chain to. Empty: plaintext gRPC.
  std::string tls_ca_file;
};

// Thread-safe: gRPC stubs may be shared between threads.
class MasterClient {
 public:
  explicit MasterClient(MasterClientOptions options);
  MasterClient(std::string address, std::chrono::milliseconds timeout);

  const std::string& address() const { return options_.address; }

  // Calls `method` on the stub. Errors: Unavailable "larder-master <address> unreachable" when the
  // master cannot be reached; Unauthenticated / PermissionDenied when either side lacks the
  // token; otherwise the master's status, prefixed with the call's name. `name` is the method's
  // name (the proof covers it). A session the master no longer knows (it restarted) is opened
  // again and the call repeated once.
  template <typename Request, typename Reply>
  Status Call(const char* name,
              grpc::Status (proto::Master::Stub::*method)(grpc::ClientContext*, const Request&,
                                                          Reply*),
              const Request& request, Reply* reply) const {
    for (int attempt = 0;; ++attempt) {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + options_.timeout);
      uint64_t session = 0;
      if (Status signed_call = Sign(name, request, &context, &session); !signed_call.ok()) {
        return signed_call;
      }
      grpc::Status status = (stub_.get()->*method)(&context, request, reply);
      if (attempt == 0 && IsUnknownSession(status)) {
        ForgetSession(session);
        reply->Clear();
        continue;
      }
      return FromGrpc(name, status);
    }
  }

 private:
  struct Session {
    uint64_t id = 0;
    std::string key;
  };

  // Adds the call's proof to `context` (opening a session first when there is none), and says
  // which session it used.
  Status Sign(const char* name, const google::protobuf::MessageLite& request,
              grpc::ClientContext* context, uint64_t* session_id) const;
  Result<std::shared_ptr<const Session>> CurrentSession() const;
  Result<std::shared_ptr<const Session>> OpenSession() const;
  void ForgetSession(uint64_t session_id) const;
  static bool IsUnknownSession(const grpc::Status& status);
  Status FromGrpc(const char* name, const grpc::Status& status) const;

  MasterClientOptions options_;
  Status init_status_;  // why the channel could not be made (e.g. an unreadable CA file)
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::Master::Stub> stub_;
  mutable std::mutex session_mu_;
  mutable std::shared_ptr<const Session> session_;  // guarded by session_mu_
  mutable std::atomic<uint64_t> sequence_{0};
};

// A per-item status from a reply. A code outside the canonical set becomes Unknown.
inline Status FromItemStatus(const proto::ItemStatus& status) {
  if (status.code() == 0) return Status::Ok();
  if (status.code() < 0 || status.code() > 16)
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
