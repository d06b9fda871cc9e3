// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The conformance suite (testing/conformance.h) over the transports every build has: "local" (an
// engine reading its own segment), "shm" (a second engine in this process that maps the owner's
// memfd after a real handoff over the abstract socket), "tcp" (a second engine that goes through
// the owner's frame server) and "device" (the device transport over the emulated device backend,
// in one engine).
#include <gtest/gtest.h>

#include "transfer/device/emulated_device.h"
#include "transfer/testing/conformance.h"

namespace larder::testutil {
namespace {

// An engine of protocol `protocol` that transfers to its own segments.
TransportUnderTest SameEngineCase(std::string name, RouteKind route,
                                  TransportUnderTest::Caps caps) {
  return {name, route, caps, [name](TransferEngineOptions options) -> Result<ConformanceEngines> {
            if (name == "device") {
              // The device transport initializes on the allocating thread's current device. The
              // emulated backend's current device is per thread, whichever instance sets it.
              LARDER_RETURN_IF_ERROR(transfer::EmulatedDevice().SetCurrentDevice(0));
            }
            options.protocol = name;
            ConformanceEngines engines;
            LARDER_ASSIGN_OR_RETURN(engines.target, TransferEngine::Create(options));
            return engines;
          }};
}

INSTANTIATE_TEST_SUITE_P(Routes, ConformanceTest,
                         ::testing::Values(SameEngineCase("local", RouteKind::kLocal,
                                                          {.completes_small_batches_inline = true,
                                                           .segment_memory = std::nullopt}),
                                           TwoEngineCase("shm", "shm", RouteKind::kSameHostShm,
                                                         {.completes_small_batches_inline = true,
                                                          .segment_memory = MemoryKind::kMemfd}),
                                           TwoEngineCase("tcp", "tcp", RouteKind::kTcp,
                                                         {.completes_small_batches_inline = false,
                                                          .segment_memory = MemoryKind::kMemfd}),
                                           // The device transport on the emulated backend.
                                           SameEngineCase("device", RouteKind::kDevice,
                                                          {.completes_small_batches_inline = true,
                                                           .segment_memory = MemoryKind::kDevice})),
                         TransportCaseName);

}  // namespace
}  // namespace larder::testutil
