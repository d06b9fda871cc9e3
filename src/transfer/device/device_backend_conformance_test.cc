// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The device backends' conformance suite (transfer/testing/device_backend_conformance.h) over the
// emulator; cuda_device_test.cc runs the same suite over CUDA in builds with it.
#include "transfer/testing/device_backend_conformance.h"
#include "transfer/device/emulated_device.h"

namespace larder::testutil {
namespace {

INSTANTIATE_TEST_SUITE_P(Emulated, DeviceBackendConformanceTest,
                         ::testing::Values(DeviceBackendUnderTest{
                             "emulated",
                             [] { return std::make_shared<transfer::EmulatedDevice>(); },
                             /*device=*/1, /*exporter_device=*/0}),
                         DeviceBackendCaseName);

}  // namespace
}  // namespace larder::testutil
