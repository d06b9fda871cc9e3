// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Engine construction with explicit transports, for tests (fault injection) and for components
// that bring their own transports. Not part of the public API.
#pragma once

#include <memory>
#include <vector>

#include "larder/transfer_engine.h"
#include "transfer/transport.h"

namespace larder::transfer {

// Like TransferEngine::Create, but the routes are exactly `transports`, in preference order,
// instead of the registry's transports for options.protocol.
Result<std::unique_ptr<TransferEngine>> CreateEngineWithTransports(
    const TransferEngineOptions& options, std::vector<std::unique_ptr<Transport>> transports);

// The registry's transports for `routes`, in the same order.
Result<std::vector<std::unique_ptr<Transport>>> CreateTransports(
    const std::vector<RouteKind>& routes);

}  // namespace larder::transfer
