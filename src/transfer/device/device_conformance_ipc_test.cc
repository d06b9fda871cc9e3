// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The conformance suite (transfer/testing/conformance.h) over the device route between processes:
// the segment's owner is a larder-e2e-peer process holding it in (emulated) device memory of
// device 0 and exporting its handle; the initiator is an engine of this process on device 1 that
// imports it. The suite checks the owner's bytes through a second import of the same allocation.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/child_process.h"
#include "transfer/device/emulated_device.h"
#include "transfer/testing/conformance.h"

namespace larder::testutil {
namespace {

// The owner process and this process's view of its memory.
struct OwnerProcess {
  ChildProcess process;
  transfer::EmulatedDevice viewer;
  void* base = nullptr;
  ~OwnerProcess() {
    if (base != nullptr) viewer.CloseImport(base).IgnoreError();
  }
};

Result<ConformanceEngines> StartDeviceOwnerAndInitiator(TransferEngineOptions options) {
  auto owner = std::make_shared<OwnerProcess>();
  const char* dir = std::getenv("LARDER_BIN_DIR");
  LARDER_ASSIGN_OR_RETURN(
      owner->process,
      ChildProcess::Spawn({std::string(dir ? dir : ".") + "/larder-e2e-peer", "serve", "--protocol",
                           "device", "--device", "0", "--name", "conformance", "--segment-size",
                           std::to_string(kSegmentBytes)},
                          {{"LARDER_LOG_LEVEL", "error"}}, std::chrono::seconds(60)));
  // This thread's device (the emulator's current device is per thread, for every instance): the
  // initiator initializes on it when it first imports.
  LARDER_RETURN_IF_ERROR(owner->viewer.SetCurrentDevice(1));
  options.protocol = "device";
  ConformanceEngines engines;
  LARDER_ASSIGN_OR_RETURN(engines.initiator, TransferEngine::Create(options));
  LARDER_ASSIGN_OR_RETURN(SegmentHandle probe,
                          engines.initiator->OpenSegment(owner->process.address(), "conformance"));
  LARDER_ASSIGN_OR_RETURN(SegmentDescriptor descriptor, engines.initiator->SegmentInfo(probe));
  LARDER_RETURN_IF_ERROR(engines.initiator->CloseSegment(probe));
  const std::string* handle = descriptor.TransportBlob("device");
  if (handle == nullptr) return InternalError("the owner's segment carries no device handle");
  LARDER_RETURN_IF_ERROR(owner->viewer.Init());
  LARDER_ASSIGN_OR_RETURN(transfer::ImportedAllocation view,
                          owner->viewer.ImportAllocation(*handle));
  owner->base = view.base;
  engines.external = ExternalOwner{std::move(descriptor), static_cast<uint8_t*>(view.base), owner};
  return engines;
}

INSTANTIATE_TEST_SUITE_P(DeviceAcrossProcesses, ConformanceTest,
                         ::testing::Values(TransportUnderTest{
                             "device_across_processes",
                             RouteKind::kDevice,
                             {.completes_small_batches_inline = true,
                              .segment_memory = MemoryKind::kDevice},
                             StartDeviceOwnerAndInitiator}),
                         TransportCaseName);

}  // namespace
}  // namespace larder::testutil
