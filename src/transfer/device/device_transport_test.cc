// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The device transport against the strict emulated backend, one test per point of the
// device-transport RFC's validation list: allocation lifetime, deferred init, device ownership,
// local buffers without registration, aligned registration reuse, partial-failure retry, and
// boundary-safe READ and WRITE.
#include "transfer/device/device_transport.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "transfer/device/emulated_device.h"
#include "transfer/engine_internal.h"
#include "transfer/testing/device_engine.h"

namespace larder::transfer {
namespace {

using namespace std::chrono_literals;
constexpr uint64_t kMiB = 1 << 20;

using testutil::DeviceEngine;
using testutil::OnNewThread;

DeviceEngine MakeEngine(EmulatedDeviceOptions device_options = {}) {
  return testutil::MakeDeviceEngine(std::move(device_options));
}

// Allocates and exports a device segment, returning its handle.
SegmentHandle ExportSegment(TransferEngine& engine, uint64_t size,
                            std::shared_ptr<MemoryRegion>* memory) {
  auto region = engine.AllocateSegmentMemory(size);
  EXPECT_TRUE(region.ok()) << region.status();
  if (!region.ok()) return 0;
  *memory = *region;
  EXPECT_EQ((*region)->kind(), MemoryKind::kDevice);
  EXPECT_TRUE(engine.RegisterSegment("dev", *region).ok());
  auto handle = engine.OpenSegment(engine.ListSegments().front());
  EXPECT_TRUE(handle.ok()) << handle.status();
  return handle.ok() ? *handle : 0;
}

Status Transfer(TransferEngine& engine, TransferOp op, void* local, SegmentHandle segment,
                uint64_t offset, uint64_t length, RouteKind* route = nullptr) {
  return testutil::TransferOne(engine, op, local, segment, offset, length, route);
}

TEST(DeviceTransportTest, NativeInitIsDeferredToTheFirstAllocationOnTheCallersDevice) {
  auto d = OnNewThread([] { return MakeEngine(); });  // installed on a helper thread, no device
  ASSERT_TRUE(d.engine);
  EXPECT_EQ(d.backend->init_device(), -1) << "native init ran at install time";
  // A thread without a current device cannot be the one to initialize.
  auto refused = OnNewThread([&] { return d.engine->AllocateSegmentMemory(4 * kMiB).status(); });
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused;
  EXPECT_EQ(d.backend->init_device(), -1);
  auto region = OnNewThread([&] {
    d.backend->SetCurrentDevice(2).IgnoreError();
    return d.engine->AllocateSegmentMemory(4 * kMiB);
  });
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_EQ(d.backend->init_device(), 2);
}

TEST(DeviceTransportTest, EveryLaterCallIsBoundToTheRecordedDeviceFromAnyThread) {
  auto d = MakeEngine();
  ASSERT_TRUE(d.backend->SetCurrentDevice(2).ok());
  std::shared_ptr<MemoryRegion> memory;
  SegmentHandle segment = ExportSegment(*d.engine, 8 * kMiB, &memory);
  ASSERT_NE(segment, 0u);
  // A thread bound to another device, and one bound to none: both transfer, and keep their own
  // current device afterwards.
  for (int thread_device : {5, -1}) {
    auto outcome = OnNewThread([&]() -> std::pair<Status, int> {
      if (thread_device >= 0) d.backend->SetCurrentDevice(thread_device).IgnoreError();
      std::vector<uint8_t> out(3 * kMiB, 0x42), in(3 * kMiB);
      Status s = Transfer(*d.engine, TransferOp::kWrite, out.data(), segment, kMiB, out.size());
      if (s.ok()) s = Transfer(*d.engine, TransferOp::kRead, in.data(), segment, kMiB, in.size());
      if (s.ok() && in != out) s = DataLossError("read back different bytes");
      return {s, d.backend->CurrentDevice().value_or(-1)};
    });
    EXPECT_TRUE(outcome.first.ok()) << outcome.first;
    EXPECT_EQ(outcome.second, thread_device);
  }
}

TEST(DeviceTransportTest, RegionsOutliveTheEngineAndAreFreedByTheNativeAllocator) {
  auto d = MakeEngine();
  ASSERT_TRUE(d.backend->SetCurrentDevice(1).ok());
  auto region = d.engine->AllocateSegmentMemory(3 * kMiB);
  ASSERT_TRUE(region.ok());
  EXPECT_EQ(d.backend->live_allocations(), 1u);
  d.engine.reset();
  std::memset((*region)->data(), 7, (*region)->size());  // still valid memory
  EXPECT_EQ(d.backend->live_allocations(), 1u);
  // Freed through the backend, bound to its device, even from a thread with none.
  OnNewThread([&] {
    region->reset();
    return 0;
  });
  EXPECT_EQ(d.backend->live_allocations(), 0u);
}

TEST(DeviceTransportTest, HostBuffersNeedNoRegistrationWhenTheCopyEngineReadsThem) {
  auto d = MakeEngine();
  ASSERT_TRUE(d.backend->SetCurrentDevice(0).ok());
  std::shared_ptr<MemoryRegion> memory;
  SegmentHandle segment = ExportSegment(*d.engine, 4 * kMiB, &memory);
  uint64_t native_before = d.backend->register_calls();
  std::vector<uint8_t> host(kMiB, 9);
  RouteKind route;
  EXPECT_TRUE(
      Transfer(*d.engine, TransferOp::kWrite, host.data(), segment, 0, host.size(), &route).ok());
  EXPECT_EQ(route, RouteKind::kDevice);
  EXPECT_TRUE(d.engine->RegisterLocalMemory(host.data(), host.size()).ok());
  EXPECT_EQ(d.backend->register_calls(), native_before) << "a bypassed host buffer was registered";
}

TEST(DeviceTransportTest, WithoutTheBypassUnregisteredHostBuffersAreRefused) {
  auto d = MakeEngine({.reads_unregistered_host_memory = false});
  ASSERT_TRUE(d.backend->SetCurrentDevice(0).ok());
  std::shared_ptr<MemoryRegion> memory;
  SegmentHandle segment = ExportSegment(*d.engine, 4 * kMiB, &memory);
  // Host memory aligned to the granularity so that its native registration can exist.
  auto host = d.backend->Allocate(2 * kMiB);  // device-kind memory stands in for pinned host memory
  ASSERT_TRUE(host.ok());
  Status refused = Transfer(*d.engine, TransferOp::kRead, *host, segment, 0, kMiB);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused;
  ASSERT_TRUE(d.engine->RegisterLocalMemory(*host, 2 * kMiB).ok());
  EXPECT_TRUE(Transfer(*d.engine, TransferOp::kRead, *host, segment, 0, kMiB).ok());
}

TEST(DeviceTransportTest, AdjacentBuffersReuseAlignedRegistrations) {
  auto d = MakeEngine();
  ASSERT_TRUE(d.backend->SetCurrentDevice(0).ok());
  auto init = d.engine->AllocateSegmentMemory(2 * kMiB);  // the first allocation initializes
  ASSERT_TRUE(init.ok()) << init.status();
  auto raw = d.backend->Allocate(8 * kMiB);  // 2 MiB aligned: the RFC's 0x200000-style layout
  ASSERT_TRUE(raw.ok());
  auto* base = static_cast<uint8_t*>(*raw);
  uint64_t before = d.backend->register_calls();
  // A = [base + 2M, base + 5M) and B = [base + 5M, base + 8M): aligned, they overlap at [4M, 6M).
  ASSERT_TRUE(d.engine->RegisterLocalMemory(base + 2 * kMiB, 3 * kMiB).ok());
  ASSERT_TRUE(d.engine->RegisterLocalMemory(base + 5 * kMiB, 3 * kMiB).ok());
  EXPECT_EQ(d.backend->register_calls() - before, 2u);  // [2M,6M) then only [6M,8M)
  // Logical deregistration keeps native coverage: registering again costs no native call.
  ASSERT_TRUE(d.engine->UnregisterLocalMemory(base + 2 * kMiB).ok());
  ASSERT_TRUE(d.engine->RegisterLocalMemory(base + 2 * kMiB, 3 * kMiB).ok());
  EXPECT_EQ(d.backend->register_calls() - before, 2u);
}

TEST(DeviceTransportTest, PartialRegistrationFailureIsRetriedForTheRemainderOnly) {
  auto d = MakeEngine();
  ASSERT_TRUE(d.backend->SetCurrentDevice(0).ok());
  auto init = d.engine->AllocateSegmentMemory(2 * kMiB);  // the first allocation initializes
  ASSERT_TRUE(init.ok()) << init.status();
  auto raw = d.backend->Allocate(16 * kMiB);
  ASSERT_TRUE(raw.ok());
  auto* base = static_cast<uint8_t*>(*raw);
  // Cover [4M, 6M) natively first (the logical buffer is removed again, the native coverage
  // stays), so that [0, 12M) has two gaps: [0, 4M) and [6M, 12M).
  ASSERT_TRUE(d.engine->RegisterLocalMemory(base + 4 * kMiB, 2 * kMiB).ok());
  ASSERT_TRUE(d.engine->UnregisterLocalMemory(base + 4 * kMiB).ok());
  d.backend->FailRegistrationAt(2);  // the second gap fails
  uint64_t before = d.backend->register_calls();
  Status failed = d.engine->RegisterLocalMemory(base, 12 * kMiB);
  EXPECT_EQ(failed.code(), StatusCode::kUnavailable) << failed;
  EXPECT_EQ(d.backend->register_calls() - before, 2u);
  ASSERT_TRUE(d.engine->RegisterLocalMemory(base, 12 * kMiB).ok());
  EXPECT_EQ(d.backend->register_calls() - before, 3u) << "the retry re-registered the first gap";
}

// Local device buffers registered as two adjacent logical buffers (two native registrations that
// meet at a boundary), a segment offset misaligned differently: every copy straddles a boundary on
// the local side at one place and on the segment side at another. The emulator rejects any native
// copy that crosses a registration, so success proves the split.
TEST(DeviceTransportTest, ReadsAndWritesAreSplitAtBoundariesOfBothSides) {
  auto d = MakeEngine();
  ASSERT_TRUE(d.backend->SetCurrentDevice(0).ok());
  std::shared_ptr<MemoryRegion> memory;
  SegmentHandle segment = ExportSegment(*d.engine, 16 * kMiB, &memory);
  uint8_t* local = testutil::SplitRegisteredDeviceMemory(d);
  ASSERT_NE(local, nullptr);
  const uint64_t length = 5 * kMiB + 12345;
  for (uint64_t i = 0; i < length; ++i) local[kMiB + i] = static_cast<uint8_t>(i * 13 + 1);
  const uint64_t offset = 3 * kMiB / 2 + 4096;  // segment side crosses 2M, 4M, 6M elsewhere
  ASSERT_TRUE(Transfer(*d.engine, TransferOp::kWrite, local + kMiB, segment, offset, length).ok());
  auto* seg = static_cast<uint8_t*>(memory->data());
  EXPECT_EQ(std::memcmp(seg + offset, local + kMiB, length), 0);
  std::memset(local, 0, 8 * kMiB);
  ASSERT_TRUE(
      Transfer(*d.engine, TransferOp::kRead, local + kMiB + 777, segment, offset, length - 777 * 2)
          .ok());
  EXPECT_EQ(std::memcmp(local + kMiB + 777, seg + offset, length - 777 * 2), 0);
  // A copy that the native layer fails is reported on its request, with the full byte count
  // missing.
  d.backend->FailCopyAt(1);
  Status failed = Transfer(*d.engine, TransferOp::kRead, local, segment, 0, kMiB);
  EXPECT_EQ(failed.code(), StatusCode::kUnavailable) << failed;
}

TEST(DeviceTransportTest, CpuRoutesNeverTouchDeviceSegments) {
  std::vector<std::unique_ptr<Transport>> transports;
  auto backend = std::make_shared<EmulatedDevice>();
  ASSERT_TRUE(backend->SetCurrentDevice(0).ok());
  auto created = CreateTransports({RouteKind::kLocal, RouteKind::kTcp});
  ASSERT_TRUE(created.ok());
  transports = std::move(created).value();
  transports.push_back(CreateDeviceTransport(backend));
  TransferEngineOptions options;
  auto engine = CreateEngineWithTransports(options, std::move(transports));
  ASSERT_TRUE(engine.ok());
  auto region = (*engine)->AllocateSegmentMemory(2 * kMiB);  // device wins the allocation
  ASSERT_TRUE(region.ok());
  EXPECT_EQ((*region)->kind(), MemoryKind::kDevice);
  ASSERT_TRUE((*engine)->RegisterSegment("dev", *region).ok());
  auto handle = (*engine)->OpenSegment((*engine)->ListSegments().front());
  ASSERT_TRUE(handle.ok());
  EXPECT_EQ((*engine)->SegmentRoute(*handle).value(), RouteKind::kDevice);
}

}  // namespace
}  // namespace larder::transfer
