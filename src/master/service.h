// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

// The gRPC service: translates proto/master.proto messages to MasterState calls and back.

#include <grpcpp/impl/service_type.h>

#include <memory>

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

// What larder-master serves (signed_service.cc): each call's proof checked against the bytes that
// arrived, when `sessions` has a cluster token, then the call handled by NewMasterHandlers's.
// `gate` (when not null) says whether calls are served at all. All three outlive the service.
std::unique_ptr<grpc::Service> NewMasterService(MasterState* state, SessionTable* sessions,
                                                const ServingGate* gate = nullptr);

// The handlers of the calls, typed (service.cc), for a caller that checked the call already:
// NewMasterService, and tests and the fuzzer, which call them directly. `sessions` opens the
// sessions and closes a client's.
std::unique_ptr<proto::Master::Service> NewMasterHandlers(MasterState* state,
                                                          SessionTable* sessions);

// `status` as gRPC's, its detail (ErrorDetail) in the error details.
grpc::Status ToGrpc(const Status& status);

}  // namespace larder::master
