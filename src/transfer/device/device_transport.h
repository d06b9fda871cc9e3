// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The `device` route: a registration-aware transport over a DeviceBackend (device_backend.h). It
// owns the rules that make a device fabric safe under a store (the device-transport RFC):
//  - allocation by transport: segment memory comes from the backend's allocator, and each region
//    holds the backend alive, so it stays valid after the engine is gone;
//  - deferred, device-bound init: nothing native runs when the transport starts; the first call
//    that needs the library (allocation or registration) initializes it on the calling thread's
//    current device, which is recorded; every later native call, from any thread, runs with that
//    device made current and the thread's own device restored afterwards;
//  - registration coverage: native registrations go through RegistrationCoverage, so aligned
//    ranges are registered once and survive partial failures and logical deregistration;
//  - boundary-safe copies: every slice is split at each granularity boundary of both its source
//    and its destination, so each native copy stays inside one registration on each side;
//  - local bypass: when the backend reads unregistered host memory, initiator host buffers need
//    no native registration.
//  - device memory across processes: a segment allocated by the backend is exported with the
//    backend's handle (the transport's blob in the descriptor); an engine of the same host opens
//    it by importing the handle on its own device (peer access, staleness and bounds are the
//    backend's rules), keeps the mapping while the segment is open and copies into it with the
//    same coverage and splitting rules.
//  - device memory across hosts: the transport's staging (device_staging.h) gives the engine's
//    CPU routes pinned host buffers, so that tcp serves this engine's device segments to other
//    hosts and the engine moves its own device buffers over any CPU route.
#pragma once

#include <memory>

#include "transfer/device/device_backend.h"
#include "transfer/device/device_staging.h"
#include "transfer/transport.h"

namespace larder::transfer {

// A device transport over `backend`, staging through pools of `staging` size.
std::unique_ptr<Transport> CreateDeviceTransport(std::shared_ptr<DeviceBackend> backend,
                                                 DeviceStagingOptions staging = {});

// The backend of the registry's "device" transport, chosen by LARDER_DEVICE_BACKEND: "cuda" (the
// default in builds with -DLARDER_WITH_CUDA=ON) or "emulated" (the default otherwise; its peer
// topology from LARDER_EMULATED_DEVICE_PEERS). A backend that this build lacks, or an unknown
// name, gives a backend whose every call fails saying so: device memory is never emulated
// silently where real memory was asked for.
std::shared_ptr<DeviceBackend> DefaultDeviceBackend();

// The CUDA backend in builds with it (cuda_device.h); null in builds without.
std::shared_ptr<DeviceBackend> CreateCudaBackend();

}  // namespace larder::transfer
