// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The client side of proto/master.proto: one gRPC channel to larder-master, calls with a deadline,
// gRPC errors mapped to Status with the master's address as context, and, with a cluster token,
// the session every call proves (src/common/control_auth.h, docs/security.md). With an
// `etcd://` address the channel goes to the cluster's leader, found in etcd, and follows it when
// it changes.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/error_detail_wire.h"
#include "common/mutex.h"
#include "common/net.h"
#include "etcd/etcd_client.h"
#include "larder/status.h"
#include "larder/transfer_engine.h"
#include "master.grpc.pb.h"

namespace larder::client {

struct MasterClientOptions {
  // "host:port", or "etcd://HOST:PORT[,HOST:PORT...]/CLUSTER_ID": the leader of that cluster.
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
  // The engine whose id client_id is: its key signs the session's opening, which a master needs
  // for an id of the engine form (common/engine_key.h). Null: none (an id of another form).
  const TransferEngine* engine = nullptr;
};

// Thread-safe: gRPC stubs may be shared between threads.
class MasterClient {
 public:
  explicit MasterClient(MasterClientOptions options);
  MasterClient(std::string address, std::chrono::milliseconds timeout);

  // The master's address as given ("host:port" or "etcd://.../CLUSTER_ID").
  const std::string& address() const { return options_.address; }
  // For messages: the address, and with etcd the leader's address now.
  std::string Describe() const;

  // Calls `method` on the stub. Errors: Unavailable "larder-master <address> unreachable" when the
  // master cannot be reached (with etcd: no leader is known, or the leader found cannot be
  // reached); Unauthenticated / PermissionDenied when either side lacks the token; otherwise the
  // master's status, prefixed with the call's name. `name` is the method's name (the proof covers
  // it). Every master call is safe to repeat, and this is the one place that repeats them:
  //   - a session the master no longer knows (it restarted) is opened again, and the call
  //     repeated once;
  //   - with etcd, a call that cannot reach the master (or reaches a standby) looks up the leader
  //     again and, when it changed, is repeated there (at most kMaxFollows times);
  //   - a call whose connection broke (UNAVAILABLE: e.g. the master restarted on its address) is
  //     repeated once, after waiting up to kReconnectWait for the channel to connect again
  //     (AwaitReconnect), so that a master back on its address is reached at once; once such a
  //     wait lasted kReconnectWait without a connection, calls skip it until one reaches the
  //     master (with the master down, calls fail without waiting).
  template <typename Request, typename Reply>
  Status Call(const char* name,
              grpc::Status (proto::Master::Stub::*method)(grpc::ClientContext*, const Request&,
                                                          Reply*),
              const Request& request, Reply* reply) const {
    bool session_renewed = false;
    bool reconnected = false;
    for (int followed = 0;;) {
      LARDER_ASSIGN_OR_RETURN(std::shared_ptr<const Connection> connection, CurrentConnection());
      std::shared_ptr<const Session> session;  // with a cluster token
      if (Status opened = SessionFor(*connection, &session); !opened.ok()) {
        if (opened.code() == StatusCode::kUnavailable && followed < kMaxFollows &&
            FollowLeader(*connection)) {
          ++followed;
          continue;
        }
        if (opened.code() == StatusCode::kUnavailable && !reconnected) {
          reconnected = true;
          AwaitReconnectUnlessGone();
          continue;
        }
        return opened;
      }
      // On the master's local control socket when this client is on its host, else over gRPC.
      grpc::Status status;
      if (!CallLocal(*connection, name, request, session.get(), reply, &status)) {
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + options_.timeout);
        // A signed request goes out as the bytes its proof covers, serialized once.
        grpc::ByteBuffer signed_body;
        if (session != nullptr) {
          LARDER_RETURN_IF_ERROR(Sign(*session, name, request, &context, &signed_body));
        }
        status = signed_body.Valid()
                     ? grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, Reply, grpc::ByteBuffer,
                                                         google::protobuf::MessageLite>(
                           connection->channel.get(), connection->Method(name), &context,
                           signed_body, reply)
                     : (connection->stub.get()->*method)(&context, request, reply);
      }
      if (!session_renewed && IsUnknownSession(status)) {
        session_renewed = true;
        ForgetSession(*connection, session != nullptr ? session->id : 0);
        reply->Clear();
        continue;
      }
      if (IsUnreachable(status) && followed < kMaxFollows && FollowLeader(*connection)) {
        ++followed;
        reply->Clear();
        continue;
      }
      if (status.error_code() == grpc::StatusCode::UNAVAILABLE && !reconnected) {
        reconnected = true;
        AwaitReconnectUnlessGone();
        reply->Clear();
        continue;
      }
      if (status.error_code() != grpc::StatusCode::UNAVAILABLE) unreachable_.store(false);
      return FromGrpc(*connection, name, status);
    }
  }

 private:
  enum class Reconnect { kConnected, kAttemptFailed, kTimedOut };
  // After a call found the master unreachable: waits until the channel is connected again, or
  // its next connection attempt fails (gRPC retries with a backoff of 100 ms growing to 1 s), at
  // most `bound`; says which came first. Connected: a call repeated now can reach the master (a
  // master restarted on its address is found as soon as it listens, not after a fixed pause).
  Reconnect AwaitReconnect(std::chrono::milliseconds bound) const;
  // Waits for a reconnect unless an earlier wait found the master gone (see Call).
  void AwaitReconnectUnlessGone() const;

  struct Session {
    uint64_t id = 0;
    std::string key;
    bool proof_in_body = false;  // the master takes a call's proof after its request's bytes
  };
  // A connection to a master's local control socket, and the session it is bound to there (0:
  // none yet).
  struct LocalLink {
    Fd fd;
    uint64_t bound_session = 0;
  };
  // A channel to one master, and the session opened there.
  struct Connection {
    // The method `name` of the Master service on this channel, registered at its first use.
    const grpc::internal::RpcMethod& Method(const char* name) const;

    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<proto::Master::Stub> stub;
    struct RegisteredMethod {
      std::string name;
      std::string path;  // "/larder.proto.Master/<name>": the RpcMethod points into it
      std::unique_ptr<grpc::internal::RpcMethod> method;
    };
    mutable Mutex methods_mu;
    mutable std::vector<std::unique_ptr<RegisteredMethod>> methods LARDER_GUARDED_BY(methods_mu);
    mutable Mutex session_mu;
    mutable std::shared_ptr<const Session> session LARDER_GUARDED_BY(session_mu);
    // The master's local control socket (common/local_control.h): learned from its challenge
    // at the first call, then connections to it kept for the calls that follow.
    enum class LocalState { kUnknown, kLearning, kUsable, kNone };
    mutable Mutex local_mu;
    mutable LocalState local_state LARDER_GUARDED_BY(local_mu) = LocalState::kUnknown;
    mutable std::string local_socket LARDER_GUARDED_BY(local_mu);
    // kUnknown after a challenge that failed: not asked again before this.
    mutable std::chrono::steady_clock::time_point local_retry LARDER_GUARDED_BY(local_mu);
    mutable std::vector<LocalLink> local_idle LARDER_GUARDED_BY(local_mu);  // no call in flight
    // The process that connected them: a child forked since sends its calls over gRPC and
    // never writes on its parent's connections.
    const pid_t local_owner = getpid();
    mutable size_t local_open LARDER_GUARDED_BY(local_mu) = 0;  // idle and in use
  };
  // Connections to a master's local socket one client keeps at most: calls beyond as many at
  // once go over gRPC.
  static constexpr size_t kMaxLocalConnections = 16;
  static constexpr int kMaxFollows = 2;
  static constexpr std::chrono::milliseconds kReconnectWait{2000};

  // With a cluster token: the session calls to `connection` go in (opened first when there is
  // none). Without one: none, and OK.
  Status SessionFor(const Connection& connection, std::shared_ptr<const Session>* session) const;
  // Serializes the request into *body with its proof under `session`: after the bytes where the
  // master takes it there, else in the call's metadata.
  Status Sign(const Session& session, const char* name,
              const google::protobuf::MessageLite& request, grpc::ClientContext* context,
              grpc::ByteBuffer* body) const;
  // Writes the request's `size` bytes (its ByteSizeLong, just computed) and, after them, its
  // proof under `session` (control_auth::kTrailerBytes) into `out`. False when the request did
  // not serialize whole.
  bool SignInto(const Session& session, const char* name,
                const google::protobuf::MessageLite& request, size_t size, uint8_t* out) const;
  // Makes the call on the master's local control socket when this client may (see
  // MasterServerOptions::local_control_socket): true, with the call's outcome in *status, when it
  // went there; false when it is for gRPC (no local socket, all connections busy, or the master
  // left the socket before answering: the call is safe to repeat).
  // With a cluster token (`session`), the first call on a connection carries its proof, which
  // binds the connection to the session in the master; the calls after it on that connection
  // carry none (no other process can write on it).
  bool CallLocal(const Connection& connection, const char* name,
                 const google::protobuf::MessageLite& request, const Session* session,
                 google::protobuf::MessageLite* reply, grpc::Status* status) const;
  // A connection to the local socket for one call: an idle one, or a new one (`fresh`). Invalid
  // when the call is for gRPC.
  LocalLink TakeLocal(const Connection& connection, bool* fresh) const;
  // Asks the master (Challenge, over gRPC) for its local socket.
  void LearnLocal(const Connection& connection) const;
  // Takes the local socket a challenge names (`challenge`), or none, while none is known yet.
  void AdoptLocal(const Connection& connection, const proto::ChallengeReply& challenge) const;
  Result<std::shared_ptr<const Session>> CurrentSession(const Connection& connection) const;
  Result<std::shared_ptr<const Session>> OpenSession(const Connection& connection) const;
  void ForgetSession(const Connection& connection, uint64_t session_id) const;
  static bool IsUnknownSession(const grpc::Status& status);
  static bool IsUnreachable(const grpc::Status& status);
  Status FromGrpc(const Connection& connection, const char* name, const grpc::Status& status) const;
  std::shared_ptr<const Connection> Connect(const std::string& address) const;
  // The channel calls go to now; with etcd, the leader's (looked up when none is known yet).
  Result<std::shared_ptr<const Connection>> CurrentConnection() const;
  // With etcd: looks up the leader, and when it is not at `stale`'s address, moves calls there.
  // True when it moved (the call is worth repeating).
  bool FollowLeader(const Connection& stale) const;
  Result<std::shared_ptr<const Connection>> LookUpLeader() const;

  MasterClientOptions options_;
  Status init_status_;  // why no channel can be made (an unreadable CA file, a bad etcd address)
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  std::optional<etcd::EtcdTarget> etcd_target_;
  std::unique_ptr<etcd::EtcdClient> etcd_;
  mutable Mutex connection_mu_;
  mutable std::shared_ptr<const Connection> connection_ LARDER_GUARDED_BY(connection_mu_);
  mutable std::atomic<uint64_t> sequence_{0};
  // True from a reconnect wait that lasted its whole bound until a call reaches the master again:
  // while the master is down, calls fail without waiting.
  mutable std::atomic<bool> unreachable_{false};
};

// A per-item status from a reply. A code outside the canonical set becomes Unknown.
inline Status FromItemStatus(const proto::ItemStatus& status) {
  if (status.code() == 0) return Status::Ok();
  if (status.code() < 0 || status.code() > 16)
    return Status(StatusCode::kUnknown, status.message());
  return Status(static_cast<StatusCode>(status.code()), status.message())
      .WithDetail(ErrorDetailFromNumber(status.detail()));
}

// The statuses of a batch of `count` items from a reply's error list: OK for every item the list
// does not name. A list that names an item outside the batch, or an OK error, cannot be trusted:
// every item is then Internal.
std::vector<Status> ItemStatuses(size_t count,
                                 const google::protobuf::RepeatedPtrField<proto::KeyError>& errors);

// OK when a GetReplicas reply has the shape of an answer to `count` keys (one size and one
// replica count per key, one segment and one offset per replica); Internal otherwise.
Status CheckReplicaColumns(const proto::BatchGetReplicasReply& reply, size_t count);

// OK when a PutStart reply has one result per key of a batch of `count`; Internal otherwise.
Status CheckPutStartReply(const proto::BatchPutStartReply& reply, size_t count);

}  // namespace larder::client
