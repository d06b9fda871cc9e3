// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The `ucx` route: segments reached through UCX (OpenUCX) one-sided RMA, ucp_get/ucp_put on the
// owner's memory, over whatever transports UCX finds (InfiniBand/RoCE where there is a NIC; tcp
// and shared memory otherwise). Built only when libucx is found. "auto" uses it only for peers on
// other hosts where both sides have an RDMA lane; naming "ucx" in the protocol uses it for every
// peer that exports through it. See docs/transfer-engine.md#ucx.
#pragma once

#include <memory>

#include "transfer/transport.h"

namespace larder::transfer {

std::unique_ptr<Transport> CreateUcxTransport(const TransportSelection& selection);

}  // namespace larder::transfer
