// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Builds without the CUDA backend (LARDER_WITH_CUDA off).
#include "transfer/device/device_transport.h"

namespace larder::transfer {

std::shared_ptr<DeviceBackend> CreateCudaBackend() { return nullptr; }

}  // namespace larder::transfer
