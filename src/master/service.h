// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

// The gRPC service: translates proto/master.proto messages to MasterState calls and back.

#include <memory>

#include "master.grpc.pb.h"
#include "master/master_state.h"
#include "master/sessions.h"

namespace larder::master {

// `sessions` checks every call's proof when it has a cluster token; both outlive the service.
std::unique_ptr<proto::Master::Service> NewMasterService(MasterState* state,
                                                         SessionTable* sessions);

}  // namespace larder::master
