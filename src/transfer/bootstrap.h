// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The engine's bootstrap service: how a peer learns the descriptors of this engine's segments
// (and with them every transport's blob). It answers kDescribe on the engine's frame server, so
// it is reached at the engine's address() with the same TLS and token proof as everything else
// there; no transport owns it.
#pragma once

#include <vector>

#include "common/net.h"
#include "larder/transfer_engine.h"
#include "transfer/transport.h"
#include "transfer/wire/server.h"

namespace larder::transfer {

// Registers the describe handler for `exports` on `server`. REQUIRES: before server->Serve().
void ServeDescriptors(wire::FrameServer* server, const SegmentExports* exports);

// The descriptors of every segment exported by the engine at `address`, fetched with the
// credentials of `context` (token, CA). Unavailable when unreachable; PermissionDenied on a
// token or TLS mismatch; DataLoss for a malformed reply (a descriptor that does not parse
// included).
Result<std::vector<SegmentDescriptor>> FetchDescriptors(const HostPort& address,
                                                        const EngineContext& context,
                                                        Deadline deadline);

}  // namespace larder::transfer
