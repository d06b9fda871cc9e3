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
  // Serves the call of method number `method` (its index in proto/master.proto's service Master)
  // for a client of the local control socket: `bytes` is the request as it arrived, and the
  // reply's bytes go to *reply. Checked as the gRPC method checks it, but for the calls that open
  // a session, which go over gRPC only (UNIMPLEMENTED here).
  virtual grpc::Status ServeLocal(int method, std::string_view bytes, std::string* reply) = 0;
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
