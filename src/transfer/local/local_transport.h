// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The `local` route: segments exported by this same engine, moved with memcpy.
#pragma once

#include <memory>

#include "transfer/transport.h"

namespace larder::transfer {

std::unique_ptr<Transport> CreateLocalTransport();

}  // namespace larder::transfer
