// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The `tcp` route: any peer reachable over the network (or any peer at all, when forced). Slices
// go to the owner's data server over a small pool of pipelined connections per peer.
#pragma once

#include <memory>

#include "transfer/transport.h"

namespace larder::transfer {

std::unique_ptr<Transport> CreateTcpTransport();

}  // namespace larder::transfer
