// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The `shm` route: same host, other process. Segments are sealed memfds; a peer receives the fd
// through the handoff (shm_handoff.h), maps it MAP_SHARED once and caches the mapping; copies are
// then plain memcpy, inline for small batches and striped over the copy pool for large ones.
#pragma once

#include <memory>

#include "transfer/transport.h"

namespace larder::transfer {

std::unique_ptr<Transport> CreateShmTransport();

}  // namespace larder::transfer
