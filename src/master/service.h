// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

// The gRPC service: translates proto/master.proto messages to MasterState calls and back.

#include <grpcpp/impl/service_type.h>

#include <memory>
#include <string>
#include <string_view>

#include "master.grpc.pb.h"
#include "master/master_state.h"
#include "master/sessions.h"

namespace larder::master {

// Whether this master may serve calls now. Without etcd every master serves; with etcd only the
// leader whose lease is current, so that two masters never both accept calls.
class ServingGate {
 public:
  virtual ~ServingGate() = default;
  // OK, or Unavailable saying why not (a standby, naming the leader; a leader whose lease
  // lapsed). Called first in every method; cheap (an atomic load on the hot path).
  virtual Status CheckServing() const = 0;
};

// How clients on this master's host may reach it without gRPC: its local control socket
// (common/local_control.h), named in ChallengeReply.
struct LocalControl {
  std::string socket;   // abstract socket name; empty: none
  std::string host_id;  // this host's id (DefaultHostId())
};

// What larder-master serves (signed_service.cc): each call's proof checked against the bytes that
// arrived, when `sessions` has a cluster token, then the call handled by NewMasterHandlers's.
// `gate` (when not null) says whether calls are served at all. All of them outlive the service.
class ServedMaster : public grpc::Service {
 public:
  // A call on a connection of the local control socket (common/local_control.h).
  struct LocalCall {
    int method = 0;  // its index in proto/master.proto's service Master
    bool proof_after_bytes = false;
    std::string_view bytes;  // the request as it arrived
    // The session the connection is bound to (0: none): set by a proof checked here, which
    // also sets *bound.
    uint64_t* bound_session = nullptr;
    bool* bound = nullptr;
  };
  // Serves a local call, the reply's bytes into *reply. Checked as the gRPC method checks it,
  // with the proof after the bytes or the session the connection is bound to; the calls that
  // open a session go over gRPC only (UNIMPLEMENTED here).
  virtual grpc::Status ServeLocal(const LocalCall& call, std::string* reply) = 0;
};
std::unique_ptr<ServedMaster> NewMasterService(MasterState* state, SessionTable* sessions,
                                               const ServingGate* gate = nullptr,
                                               const LocalControl* local = nullptr);

// The handlers of the calls, typed (service.cc), for a caller that checked the call already:
// NewMasterService, and tests and the fuzzer, which call them directly. `sessions` opens the
// sessions and closes a client's. `local` (when not null) is named in ChallengeReply.
std::unique_ptr<proto::Master::Service> NewMasterHandlers(MasterState* state,
                                                          SessionTable* sessions,
                                                          const LocalControl* local = nullptr);

// `status` as gRPC's, its detail (ErrorDetail) in the error details.
grpc::Status ToGrpc(const Status& status);

}  // namespace larder::master
