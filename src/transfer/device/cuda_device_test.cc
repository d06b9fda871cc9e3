// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The device backends' conformance suite (transfer/testing/device_backend_conformance.h) over
// CUDA: built with -DLARDER_WITH_CUDA=ON only. Every test skips, saying why, where the driver
// sees no GPU. With two GPUs or more, the other process exports from device 1 and this one
// imports on device 0 (peer access permitting); with one, both use device 0.
#include "transfer/device/cuda_device.h"
#include "transfer/testing/device_backend_conformance.h"

namespace larder::testutil {
namespace {

std::string CudaSkipReason() {
  std::string why;
  return transfer::CudaDevice::DeviceCount(&why) > 0 ? std::string() : "no CUDA device: " + why;
}

INSTANTIATE_TEST_SUITE_P(
    Cuda, DeviceBackendConformanceTest,
    ::testing::Values(DeviceBackendUnderTest{
        "cuda", [] { return std::make_shared<transfer::CudaDevice>(); }, /*device=*/0,
        /*exporter_device=*/transfer::CudaDevice::DeviceCount() > 1 ? 1 : 0, CudaSkipReason}),
    DeviceBackendCaseName);

}  // namespace
}  // namespace larder::testutil
