// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

// The gRPC service: translates proto/master.proto messages to MasterState calls and back.

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

// `sessions` checks every call's proof when it has a cluster token; `gate` (when not null) says
// whether calls are served at all. All three outlive the service.
std::unique_ptr<proto::Master::Service> NewMasterService(MasterState* state, SessionTable* sessions,
                                                         const ServingGate* gate = nullptr);

}  // namespace larder::master
