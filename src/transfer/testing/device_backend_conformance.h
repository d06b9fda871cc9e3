// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The conformance suite of device backends (device_backend.h): the contract every backend keeps,
// checked the same way over each one, in this process and with another process exporting device
// memory. A test binary takes part by including this header in one file and instantiating the
// suite with its backend:
//
//   INSTANTIATE_TEST_SUITE_P(Cuda, DeviceBackendConformanceTest,
//       ::testing::Values(DeviceBackendUnderTest{"cuda", MakeCuda, 0, 0, CudaSkipReason}),
//       DeviceBackendCaseName);
//
// The other process is larder-e2e-peer serving a device segment with LARDER_DEVICE_BACKEND set
// to the backend's name. Test-only.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/child_process.h"
#include "transfer/device/device_backend.h"
#include "transfer/device/device_transport.h"
#include "transfer/engine_internal.h"
#include "transfer/testing/device_engine.h"
#include "transfer/testing/test_util.h"

namespace larder::testutil {

struct DeviceBackendUnderTest {
  std::string name;  // LARDER_DEVICE_BACKEND's value for this backend
  std::function<std::shared_ptr<transfer::DeviceBackend>()> make;
  int device = 0;           // the device this process binds
  int exporter_device = 0;  // the device of the other process
  // Why the backend cannot run here ("" when it can): the tests skip, saying so.
  std::function<std::string()> skip_reason = [] { return std::string(); };
};

inline std::string DeviceBackendCaseName(
    const ::testing::TestParamInfo<DeviceBackendUnderTest>& info) {
  return info.param.name;
}

inline void PrintTo(const DeviceBackendUnderTest& backend, std::ostream* os) {
  *os << backend.name;
}

class DeviceBackendConformanceTest : public ::testing::TestWithParam<DeviceBackendUnderTest> {
 protected:
  static constexpr uint64_t kMiB = 1 << 20;
  static constexpr uint64_t kPeerSegmentBytes = 16 * kMiB;

  void SetUp() override {
    if (std::string why = GetParam().skip_reason(); !why.empty()) {
      GTEST_SKIP() << GetParam().name << ": " << why;
    }
    backend_ = GetParam().make();
    ASSERT_NE(backend_, nullptr);
    ASSERT_TRUE(backend_->SetCurrentDevice(GetParam().device).ok());
  }
  void TearDown() override {
    if (backend_) backend_->SetCurrentDevice(-1).IgnoreError();
  }

  // Runs a copy to its end.
  Status Copy(void* dst, const void* src, uint64_t length) {
    LARDER_ASSIGN_OR_RETURN(uint64_t id, backend_->SubmitCopy(dst, src, length));
    for (;;) {
      LARDER_ASSIGN_OR_RETURN(bool done, backend_->QueryCopy(id));
      if (done) return Status();
    }
  }

  // A larder-e2e-peer holding a patterned device segment "e2e" with this backend.
  ChildProcess ServeDeviceSegment() {
    const char* dir = std::getenv("LARDER_BIN_DIR");
    auto child = ChildProcess::Spawn(
        {std::string(dir ? dir : ".") + "/larder-e2e-peer", "serve", "--protocol", "device",
         "--device", std::to_string(GetParam().exporter_device), "--segment-size",
         std::to_string(kPeerSegmentBytes)},
        {{"LARDER_LOG_LEVEL", "error"}, {"LARDER_DEVICE_BACKEND", GetParam().name}},
        std::chrono::seconds(60));
    EXPECT_TRUE(child.ok()) << child.status();
    return child.ok() ? std::move(child).value() : ChildProcess();
  }

  // Starts a peer serving a device segment and an engine over the backend under test that opens
  // it (importing its handle on this thread's device).
  Result<SegmentHandle> OpenPeerSegment(ChildProcess* peer,
                                        std::unique_ptr<TransferEngine>* engine) {
    *peer = ServeDeviceSegment();
    if (peer->pid() <= 0) return UnavailableError("the peer did not start");
    *engine = MakeEngineOver(backend_);
    if (*engine == nullptr) return UnavailableError("the engine did not start");
    return (*engine)->OpenSegment(peer->address(), "e2e");
  }

  static uint8_t PatternByte(uint64_t i) { return static_cast<uint8_t>((i * 131) ^ (i >> 12)); }

  std::shared_ptr<transfer::DeviceBackend> backend_;
};

TEST_P(DeviceBackendConformanceTest, AllocationsAreAlignedDeviceMemory) {
  ASSERT_TRUE(backend_->Init().ok());
  EXPECT_FALSE(backend_->Init().ok()) << "initialized twice";
  Result<void*> memory = backend_->Allocate(3 * kMiB);
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_EQ(reinterpret_cast<uint64_t>(*memory) % backend_->registration_granularity(), 0u);
  EXPECT_TRUE(backend_->IsDeviceMemory(*memory, 3 * kMiB));
  std::vector<uint8_t> host(4096);
  EXPECT_FALSE(backend_->IsDeviceMemory(host.data(), host.size()));
  EXPECT_EQ(backend_->Free(host.data()).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(backend_->Free(*memory).ok());
}

TEST_P(DeviceBackendConformanceTest, RegistrationsAreAlignedAndMayNotOverlap) {
  ASSERT_TRUE(backend_->Init().ok());
  const uint64_t g = backend_->registration_granularity();
  Result<void*> memory = backend_->Allocate(4 * g);
  ASSERT_TRUE(memory.ok()) << memory.status();
  const auto base = reinterpret_cast<uint64_t>(*memory);
  EXPECT_EQ(backend_->Register(base + 4096, g).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(backend_->Register(base, 2 * g).ok());
  EXPECT_EQ(backend_->Register(base + g, 2 * g).code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(backend_->Register(base + 2 * g, 2 * g).ok());
  EXPECT_TRUE(backend_->Deregister(base).ok());
  EXPECT_EQ(backend_->Deregister(base).code(), StatusCode::kNotFound);
  EXPECT_TRUE(backend_->Deregister(base + 2 * g).ok());
  EXPECT_TRUE(backend_->Free(*memory).ok());
}

TEST_P(DeviceBackendConformanceTest, CopiesMoveBytesBetweenHostAndDevice) {
  ASSERT_TRUE(backend_->Init().ok());
  const uint64_t g = backend_->registration_granularity();
  Result<void*> a = backend_->Allocate(g);
  Result<void*> b = backend_->Allocate(g);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(backend_->Register(reinterpret_cast<uint64_t>(*a), g).ok());
  ASSERT_TRUE(backend_->Register(reinterpret_cast<uint64_t>(*b), g).ok());
  std::vector<uint8_t> out(g - 4096), in(g - 4096, 0);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 7 + 1);
  ASSERT_TRUE(Copy(*a, out.data(), out.size()).ok());                        // host -> device
  ASSERT_TRUE(Copy(static_cast<uint8_t*>(*b) + 4096, *a, out.size()).ok());  // device -> device
  ASSERT_TRUE(Copy(in.data(), static_cast<uint8_t*>(*b) + 4096, in.size()).ok());  // -> host
  EXPECT_EQ(in, out);
  EXPECT_EQ(backend_->QueryCopy(987654321).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(backend_->Deregister(reinterpret_cast<uint64_t>(*a)).ok());
  EXPECT_TRUE(backend_->Deregister(reinterpret_cast<uint64_t>(*b)).ok());
  EXPECT_TRUE(backend_->Free(*a).ok());
  EXPECT_TRUE(backend_->Free(*b).ok());
}

TEST_P(DeviceBackendConformanceTest, ExportsWholeAllocationsAndRefusesBadHandles) {
  ASSERT_TRUE(backend_->Init().ok());
  Result<void*> memory = backend_->Allocate(2 * kMiB);
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_EQ(backend_->ExportAllocation(static_cast<uint8_t*>(*memory) + 4096).status().code(),
            StatusCode::kInvalidArgument);
  Result<std::string> handle = backend_->ExportAllocation(*memory);
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_LE(handle->size(), transfer::kMaxDeviceHandleBytes);
  // This process's own handle: imports map another process's memory only.
  EXPECT_EQ(backend_->ImportAllocation(*handle).status().code(), StatusCode::kFailedPrecondition);
  for (const std::string& bad : {std::string(), std::string("garbage"), handle->substr(0, 9),
                                 std::string(transfer::kMaxDeviceHandleBytes + 1, 'x')}) {
    EXPECT_EQ(backend_->ImportAllocation(bad).status().code(), StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(backend_->CloseImport(*memory).code(), StatusCode::kNotFound);
  EXPECT_TRUE(backend_->Free(*memory).ok());
}

// The device route over this backend: another process's device segment is imported on this
// process's device, read and written through it, and unmapped when closed.
TEST_P(DeviceBackendConformanceTest, AnotherProcessesDeviceSegmentMovesBytesBothWays) {
  ChildProcess peer;
  std::unique_ptr<TransferEngine> engine;
  Result<SegmentHandle> segment = OpenPeerSegment(&peer, &engine);
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(engine->SegmentRoute(*segment).value(), RouteKind::kDevice);
  EXPECT_EQ(engine->Stats().device_imports, 1u);
  constexpr uint64_t kOffset = 3 * kMiB / 2 + 77, kLength = 5 * kMiB + 3;
  std::vector<uint8_t> in(kLength);
  ASSERT_TRUE(TransferOne(*engine, TransferOp::kRead, in.data(), *segment, kOffset, kLength).ok());
  for (uint64_t i = 0; i < kLength; ++i) {
    ASSERT_EQ(in[i], PatternByte(kOffset + i)) << "byte " << i;
  }
  std::vector<uint8_t> out(kLength), back(kLength);
  for (uint64_t i = 0; i < kLength; ++i) out[i] = static_cast<uint8_t>(i * 29 + 5);
  ASSERT_TRUE(
      TransferOne(*engine, TransferOp::kWrite, out.data(), *segment, 9 * kMiB + 1, kLength).ok());
  ASSERT_TRUE(
      TransferOne(*engine, TransferOp::kRead, back.data(), *segment, 9 * kMiB + 1, kLength).ok());
  EXPECT_EQ(back, out);
  ASSERT_TRUE(engine->CloseSegment(*segment).ok());
  // Unmapped once the copies that ran through it have let go of it.
  EXPECT_TRUE(
      WaitUntil([&] { return engine->Stats().device_imports == 0; }, std::chrono::seconds(10)));
}

// A handle whose exporter exited no longer opens, and the importer goes on.
TEST_P(DeviceBackendConformanceTest, AHandleOfAnExporterThatExitedIsRefused) {
  ChildProcess peer;
  std::unique_ptr<TransferEngine> engine;
  Result<SegmentHandle> segment = OpenPeerSegment(&peer, &engine);
  ASSERT_TRUE(segment.ok()) << segment.status();
  auto info = engine->SegmentInfo(*segment);
  ASSERT_TRUE(info.ok());
  const std::string* handle = info->TransportBlob("device");
  ASSERT_NE(handle, nullptr);
  const std::string saved = *handle;
  ASSERT_TRUE(engine->CloseSegment(*segment).ok());
  peer.Kill(SIGKILL);
  peer.Stop(std::chrono::seconds(5));
  Result<transfer::ImportedAllocation> stale = backend_->ImportAllocation(saved);
  EXPECT_EQ(stale.status().code(), StatusCode::kFailedPrecondition) << stale.status();
  // The backend still works.
  Result<void*> memory = backend_->Allocate(2 * kMiB);
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_TRUE(backend_->Free(*memory).ok());
}

// Pinned host memory (staging buffers) and copies that are waited for, not polled.
TEST_P(DeviceBackendConformanceTest, PinnedHostMemoryAndWaitedCopies) {
  ASSERT_TRUE(backend_->Init().ok());
  Result<void*> pinned = backend_->AllocateHost(3 * kMiB);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  EXPECT_EQ(reinterpret_cast<uint64_t>(*pinned) % backend_->registration_granularity(), 0u);
  EXPECT_FALSE(backend_->IsDeviceMemory(*pinned, 3 * kMiB));
  Result<void*> device = backend_->Allocate(4 * kMiB);
  ASSERT_TRUE(device.ok()) << device.status();
  ASSERT_TRUE(backend_->Register(reinterpret_cast<uint64_t>(*device), 4 * kMiB).ok());
  auto* host = static_cast<uint8_t*>(*pinned);
  for (uint64_t i = 0; i < kMiB; ++i) host[i] = static_cast<uint8_t>(i * 13 + 1);
  // Pinned -> device -> the pinned buffer's second MiB, each copy waited for.
  Result<uint64_t> in = backend_->SubmitCopy(static_cast<uint8_t*>(*device) + 7, host, kMiB);
  ASSERT_TRUE(in.ok()) << in.status();
  ASSERT_TRUE(backend_->WaitCopy(*in).ok());
  Result<uint64_t> out =
      backend_->SubmitCopy(host + kMiB, static_cast<uint8_t*>(*device) + 7, kMiB);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE(backend_->WaitCopy(*out).ok());
  EXPECT_EQ(std::memcmp(host, host + kMiB, kMiB), 0);
  EXPECT_EQ(backend_->WaitCopy(*out).code(), StatusCode::kNotFound) << "a copy waited twice";
  std::vector<uint8_t> plain(4096);
  EXPECT_EQ(backend_->FreeHost(plain.data()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->FreeHost(*device).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(backend_->FreeHost(*pinned).ok());
  EXPECT_TRUE(backend_->Deregister(reinterpret_cast<uint64_t>(*device)).ok());
  EXPECT_TRUE(backend_->Free(*device).ok());
}

// Device memory of another host: the owner serves its device segment over tcp through pinned
// staging, and this side stages its own device buffers, over this backend on both ends.
TEST_P(DeviceBackendConformanceTest, AnotherHostsDeviceSegmentOverTcpThroughStaging) {
  const char* dir = std::getenv("LARDER_BIN_DIR");
  auto peer =
      ChildProcess::Spawn({std::string(dir ? dir : ".") + "/larder-e2e-peer", "serve", "--protocol",
                           "device,tcp", "--device", std::to_string(GetParam().exporter_device),
                           "--segment-size", std::to_string(kPeerSegmentBytes)},
                          {{"LARDER_LOG_LEVEL", "error"},
                           {"LARDER_DEVICE_BACKEND", GetParam().name},
                           {"LARDER_HOST_ID", "conformance-other-host"}},
                          std::chrono::seconds(60));
  ASSERT_TRUE(peer.ok()) << peer.status();
  std::vector<std::unique_ptr<transfer::Transport>> transports;
  transports.push_back(transfer::CreateDeviceTransport(backend_));
  auto tcp = transfer::CreateTransports({RouteKind::kTcp});
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  transports.push_back(std::move(tcp->front()));
  TransferEngineOptions options;
  options.protocol = "device,tcp";
  auto engine = transfer::CreateEngineWithTransports(options, std::move(transports));
  ASSERT_TRUE(engine.ok()) << engine.status();
  Result<SegmentHandle> segment = (*engine)->OpenSegment(peer->address(), "e2e");
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ((*engine)->SegmentRoute(*segment).value(), RouteKind("tcp-staged"));
  // Host buffers here: only the owner stages.
  constexpr uint64_t kOffset = 3 * kMiB / 2 + 77, kLength = 5 * kMiB + 3;
  std::vector<uint8_t> in(kLength);
  ASSERT_TRUE(TransferOne(**engine, TransferOp::kRead, in.data(), *segment, kOffset, kLength).ok());
  for (uint64_t i = 0; i < kLength; ++i) {
    ASSERT_EQ(in[i], PatternByte(kOffset + i)) << "byte " << i;
  }
  // Device buffers here too: out of one, into the owner, back into another.
  auto buffers = (*engine)->AllocateSegmentMemory(2 * kLength);
  ASSERT_TRUE(buffers.ok()) << buffers.status();
  ASSERT_EQ((*buffers)->kind(), MemoryKind::kDevice);
  auto* device = static_cast<uint8_t*>((*buffers)->data());
  std::vector<uint8_t> out(kLength), back(kLength);
  for (uint64_t i = 0; i < kLength; ++i) out[i] = static_cast<uint8_t>(i * 29 + 5);
  ASSERT_TRUE(Copy(device, out.data(), kLength).ok());
  RouteKind route;
  ASSERT_TRUE(
      TransferOne(**engine, TransferOp::kWrite, device, *segment, 9 * kMiB + 1, kLength, &route)
          .ok());
  EXPECT_EQ(route, RouteKind("tcp-staged"));
  ASSERT_TRUE(
      TransferOne(**engine, TransferOp::kRead, device + kLength, *segment, 9 * kMiB + 1, kLength)
          .ok());
  ASSERT_TRUE(Copy(back.data(), device + kLength, kLength).ok());
  EXPECT_EQ(back, out);
  EngineStats stats = (*engine)->Stats();
  EXPECT_EQ(stats.staged_to_host_bytes, kLength);
  EXPECT_EQ(stats.staged_to_device_bytes, kLength);
  EXPECT_TRUE(WaitUntil([&] { return (*engine)->Stats().staging_buffers_in_use == 0; },
                        std::chrono::seconds(10)));
}

}  // namespace larder::testutil
