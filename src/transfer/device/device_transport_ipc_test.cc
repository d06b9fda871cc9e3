// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The device-transport RFC's rules when the segment's owner is another process: each owner is a
// larder-e2e-peer serving a patterned segment in its (emulated) device memory, exported with the
// backend's handle; this process's engine imports it through a device transport over a backend
// the test holds. One test per rule: deferred, device-bound init; copies bound to the recorded
// device from any thread; the import's lifetime; the local bypass and its absence; aligned
// registration reuse beside imports; boundary splitting on both sides; bounds; an exporter
// killed while copies run; separate protocol settings for PD and store engines.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/child_process.h"
#include "transfer/testing/device_engine.h"
#include "transfer/testing/test_util.h"

namespace larder::transfer {
namespace {

using namespace std::chrono_literals;
using testutil::OnNewThread;
using testutil::TransferOne;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kSegmentBytes = 16 * kMiB;

// Byte i of a segment that larder-e2e-peer serves.
uint8_t PatternByte(uint64_t i) { return static_cast<uint8_t>((i * 131) ^ (i >> 12)); }

// A larder-e2e-peer exporting a device segment "e2e" of device `device`.
ChildProcess ServeDevice(int device, std::map<std::string, std::string> env = {}) {
  const char* dir = std::getenv("LARDER_BIN_DIR");
  std::vector<std::string> argv = {std::string(dir ? dir : ".") + "/larder-e2e-peer",
                                   "serve",
                                   "--protocol",
                                   "device",
                                   "--device",
                                   std::to_string(device),
                                   "--segment-size",
                                   std::to_string(kSegmentBytes)};
  env.emplace("LARDER_LOG_LEVEL", "error");
  auto child = ChildProcess::Spawn(argv, env, 60s);
  EXPECT_TRUE(child.ok()) << child.status();
  return child.ok() ? std::move(child).value() : ChildProcess();
}

// Opens the peer's segment from a fresh thread bound to `device` (-1: none).
Result<SegmentHandle> OpenFrom(TransferEngine& engine, const ChildProcess& peer,
                               EmulatedDevice& backend, int device) {
  return OnNewThread([&]() -> Result<SegmentHandle> {
    if (device >= 0) LARDER_RETURN_IF_ERROR(backend.SetCurrentDevice(device));
    return engine.OpenSegment(peer.address(), "e2e");
  });
}

// Whether `bytes` are the peer's pattern from segment offset `offset` on.
::testing::AssertionResult IsPattern(const uint8_t* bytes, uint64_t offset, uint64_t length) {
  for (uint64_t i = 0; i < length; ++i) {
    if (bytes[i] != PatternByte(offset + i)) {
      return ::testing::AssertionFailure() << "byte " << i << " of the range at " << offset;
    }
  }
  return ::testing::AssertionSuccess();
}

// The owner's memory as the owner sees it: its allocation, imported by a second backend of this
// process (the same pages the owner writes).
class OwnerView {
 public:
  OwnerView(TransferEngine& engine, SegmentHandle segment) {
    auto info = engine.SegmentInfo(segment);
    EXPECT_TRUE(info.ok()) << info.status();
    const std::string* handle = info.ok() ? info->TransportBlob("device") : nullptr;
    EXPECT_NE(handle, nullptr);
    if (handle == nullptr) return;
    imported_ = OnNewThread([&]() -> Result<ImportedAllocation> {
      LARDER_RETURN_IF_ERROR(viewer_.SetCurrentDevice(0));
      LARDER_RETURN_IF_ERROR(viewer_.Init());
      return viewer_.ImportAllocation(*handle);
    });
    EXPECT_TRUE(imported_.ok()) << imported_.status();
  }
  uint8_t* bytes() const {
    return imported_.ok() ? static_cast<uint8_t*>(imported_->base) : nullptr;
  }

 private:
  EmulatedDevice viewer_;
  Result<ImportedAllocation> imported_ = NotFoundError("not imported");
};

TEST(DeviceTransportIpcTest, TheImportIsDeferredToTheFirstOpenOnTheCallersDevice) {
  auto peer = ServeDevice(1);
  auto d = OnNewThread([] { return testutil::MakeDeviceEngine(); });  // no device: no native call
  ASSERT_TRUE(d.engine);
  EXPECT_EQ(d.backend->init_device(), -1);
  // A thread without a current device cannot be the one to initialize (and import).
  Result<SegmentHandle> refused = OpenFrom(*d.engine, peer, *d.backend, -1);
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("this thread has none"), std::string::npos)
      << refused.status();
  EXPECT_EQ(d.backend->init_device(), -1);
  EXPECT_EQ(d.backend->import_calls(), 0u);
  // The first open from a thread bound to device 3 initializes there and imports for device 3.
  Result<SegmentHandle> segment = OpenFrom(*d.engine, peer, *d.backend, 3);
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(d.backend->init_device(), 3);
  EXPECT_EQ(d.engine->SegmentRoute(*segment).value(), RouteKind::kDevice);
  EXPECT_EQ(d.backend->import_calls(), 1u);
  EXPECT_EQ(d.backend->live_imports(), 1u);
  EngineStats stats = d.engine->Stats();
  EXPECT_EQ(stats.device_imports, 1u);
  EXPECT_GE(stats.device_imported_bytes, kSegmentBytes);
  EXPECT_EQ(stats.device_import_calls, 1u);
  EXPECT_EQ(stats.device_import_failures, 0u);
  EXPECT_GT(stats.device_import_ns, 0u);
}

TEST(DeviceTransportIpcTest, CopiesThroughAnImportRunOnTheRecordedDeviceFromAnyThread) {
  // Devices 0-3 reach each other, 4-7 too: a thread bound to device 6 could not reach the owner's
  // device 1 itself, and still moves bytes, because every native call runs on device 3.
  Result<std::vector<int>> groups = ParsePeerGroups("0-3,4-7", 8);
  ASSERT_TRUE(groups.ok()) << groups.status();
  auto peer = ServeDevice(1);
  auto d = testutil::MakeDeviceEngine({.peer_groups = *groups});
  Result<SegmentHandle> segment = OpenFrom(*d.engine, peer, *d.backend, 3);
  ASSERT_TRUE(segment.ok()) << segment.status();
  for (int thread_device : {6, -1}) {
    SCOPED_TRACE("thread on device " + std::to_string(thread_device));
    auto outcome = OnNewThread([&]() -> std::pair<Status, int> {
      if (thread_device >= 0) d.backend->SetCurrentDevice(thread_device).IgnoreError();
      std::vector<uint8_t> in(3 * kMiB);
      Status s = TransferOne(*d.engine, TransferOp::kRead, in.data(), *segment, 12345, in.size());
      if (s.ok() && !IsPattern(in.data(), 12345, in.size())) s = DataLossError("wrong bytes");
      return {s, d.backend->CurrentDevice().value_or(-1)};
    });
    EXPECT_TRUE(outcome.first.ok()) << outcome.first;
    EXPECT_EQ(outcome.second, thread_device) << "the thread's own device was not restored";
  }
  EXPECT_EQ(d.backend->init_device(), 3);
}

TEST(DeviceTransportIpcTest, TheImportIsHeldWhileTheSegmentIsOpenAndUnmappedAfter) {
  auto peer = ServeDevice(0);
  auto d = testutil::MakeDeviceEngine();
  Result<SegmentHandle> segment = OpenFrom(*d.engine, peer, *d.backend, 1);
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(d.backend->live_imports(), 1u);
  // Copies through it, in line and striped over the copy pool, let go of it before they complete:
  // closing the segment unmaps it at once.
  for (uint64_t length : {kMiB / 16, 12 * kMiB}) {
    std::vector<uint8_t> in(length);
    Status read = OnNewThread(
        [&] { return TransferOne(*d.engine, TransferOp::kRead, in.data(), *segment, 0, length); });
    ASSERT_TRUE(read.ok()) << read;
    EXPECT_TRUE(IsPattern(in.data(), 0, length));
  }
  ASSERT_TRUE(d.engine->CloseSegment(*segment).ok());
  EXPECT_EQ(d.engine->Stats().device_imports, 0u);
  EXPECT_EQ(d.backend->live_imports(), 0u);
  EXPECT_EQ(d.engine->Stats().device_imported_bytes, 0u);
  EXPECT_EQ(d.engine->Stats().device_import_calls, 1u);
  // Opened again, then the engine goes with the segment open: the mapping goes with it, and the
  // owner's memory is untouched.
  segment = OpenFrom(*d.engine, peer, *d.backend, 1);
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(d.backend->live_imports(), 1u);
  OwnerView owner(*d.engine, *segment);
  d.engine.reset();
  EXPECT_EQ(d.backend->live_imports(), 0u);
  ASSERT_NE(owner.bytes(), nullptr);
  EXPECT_TRUE(IsPattern(owner.bytes(), 0, kSegmentBytes));
}

TEST(DeviceTransportIpcTest, HostBuffersNeedNoRegistrationForCopiesIntoAnImport) {
  auto peer = ServeDevice(0);
  auto d = testutil::MakeDeviceEngine();
  Result<SegmentHandle> segment = OpenFrom(*d.engine, peer, *d.backend, 2);
  ASSERT_TRUE(segment.ok()) << segment.status();
  OwnerView owner(*d.engine, *segment);
  ASSERT_NE(owner.bytes(), nullptr);
  const uint64_t native_before = d.backend->register_calls();
  std::vector<uint8_t> host(kMiB + 3, 0x5c);
  RouteKind route = RouteKind::kNone;
  Status written = OnNewThread([&] {
    return TransferOne(*d.engine, TransferOp::kWrite, host.data(), *segment, 7 * kMiB, host.size(),
                       &route);
  });
  ASSERT_TRUE(written.ok()) << written;
  EXPECT_EQ(route, RouteKind::kDevice);
  EXPECT_EQ(std::memcmp(owner.bytes() + 7 * kMiB, host.data(), host.size()), 0);
  EXPECT_TRUE(d.engine->RegisterLocalMemory(host.data(), host.size()).ok());
  EXPECT_EQ(d.backend->register_calls(), native_before) << "a bypassed host buffer was registered";
}

TEST(DeviceTransportIpcTest, WithoutTheBypassUnregisteredLocalBuffersAreRefused) {
  auto peer = ServeDevice(0);
  auto d = testutil::MakeDeviceEngine({.reads_unregistered_host_memory = false});
  Result<SegmentHandle> segment = OpenFrom(*d.engine, peer, *d.backend, 0);
  ASSERT_TRUE(segment.ok()) << segment.status();
  ASSERT_TRUE(d.backend->SetCurrentDevice(0).ok());
  auto local = d.backend->Allocate(2 * kMiB);  // device-kind memory stands in for pinned host
  ASSERT_TRUE(local.ok()) << local.status();
  Status refused = TransferOne(*d.engine, TransferOp::kRead, *local, *segment, 0, kMiB);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused;
  ASSERT_TRUE(d.engine->RegisterLocalMemory(*local, 2 * kMiB).ok());
  ASSERT_TRUE(TransferOne(*d.engine, TransferOp::kRead, *local, *segment, 4096, kMiB).ok());
  EXPECT_TRUE(IsPattern(static_cast<uint8_t*>(*local), 4096, kMiB));
  d.backend->SetCurrentDevice(-1).IgnoreError();
}

TEST(DeviceTransportIpcTest, LocalRegistrationsAreAlignedAndReusedBesideImports) {
  auto peer = ServeDevice(0);
  auto d = testutil::MakeDeviceEngine();
  ASSERT_TRUE(d.backend->SetCurrentDevice(0).ok());
  const uint64_t before_open = d.backend->register_calls();
  auto segment = d.engine->OpenSegment(peer.address(), "e2e");
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(d.backend->register_calls(), before_open) << "an import was registered natively";
  auto raw = d.backend->Allocate(8 * kMiB);
  ASSERT_TRUE(raw.ok());
  auto* base = static_cast<uint8_t*>(*raw);
  const uint64_t before = d.backend->register_calls();
  // [2M, 5M) and [5M, 8M): aligned to 2 MiB they share [4M, 6M), registered once.
  ASSERT_TRUE(d.engine->RegisterLocalMemory(base + 2 * kMiB, 3 * kMiB).ok());
  ASSERT_TRUE(d.engine->RegisterLocalMemory(base + 5 * kMiB, 3 * kMiB).ok());
  EXPECT_EQ(d.backend->register_calls() - before, 2u);
  ASSERT_TRUE(d.engine->UnregisterLocalMemory(base + 2 * kMiB).ok());
  ASSERT_TRUE(d.engine->RegisterLocalMemory(base + 2 * kMiB, 3 * kMiB).ok());
  EXPECT_EQ(d.backend->register_calls() - before, 2u);
  // Both buffers move bytes from the other process's memory.
  ASSERT_TRUE(
      TransferOne(*d.engine, TransferOp::kRead, base + 2 * kMiB, *segment, 99, 6 * kMiB).ok());
  EXPECT_TRUE(IsPattern(base + 2 * kMiB, 99, 6 * kMiB));
  d.backend->SetCurrentDevice(-1).IgnoreError();
}

// Local device buffers registered as two adjacent registrations, the segment offset misaligned
// differently: each copy straddles a boundary on the local side at one place and on the imported
// side at another. The emulator refuses any native copy that leaves a registration or an import,
// so success proves the split; the owner's view proves where the bytes went.
TEST(DeviceTransportIpcTest, CopiesAreSplitAtBoundariesOfTheLocalBuffersAndTheImport) {
  auto peer = ServeDevice(0);
  auto d = testutil::MakeDeviceEngine();
  ASSERT_TRUE(d.backend->SetCurrentDevice(0).ok());
  auto segment = d.engine->OpenSegment(peer.address(), "e2e");
  ASSERT_TRUE(segment.ok()) << segment.status();
  OwnerView owner(*d.engine, *segment);
  ASSERT_NE(owner.bytes(), nullptr);
  uint8_t* local = testutil::SplitRegisteredDeviceMemory(d);
  ASSERT_NE(local, nullptr);
  const uint64_t length = 5 * kMiB + 12345;
  const uint64_t offset = 3 * kMiB / 2 + 4096;  // the segment side crosses 2M, 4M and 6M
  for (uint64_t i = 0; i < length; ++i) local[kMiB + i] = static_cast<uint8_t>(i * 13 + 1);
  const uint64_t copies_before = d.backend->copy_calls();
  ASSERT_TRUE(
      TransferOne(*d.engine, TransferOp::kWrite, local + kMiB, *segment, offset, length).ok());
  EXPECT_GE(d.backend->copy_calls() - copies_before, 6u) << "too few pieces to respect both sides";
  EXPECT_EQ(std::memcmp(owner.bytes() + offset, local + kMiB, length), 0);
  std::memset(local, 0, 8 * kMiB);
  ASSERT_TRUE(TransferOne(*d.engine, TransferOp::kRead, local + kMiB + 777, *segment, offset,
                          length - 777 * 2)
                  .ok());
  EXPECT_EQ(std::memcmp(local + kMiB + 777, owner.bytes() + offset, length - 777 * 2), 0);
  // A request past the segment's end is refused before any native copy.
  const uint64_t copies = d.backend->copy_calls();
  Status past =
      TransferOne(*d.engine, TransferOp::kRead, local, *segment, kSegmentBytes - 4096, 8192);
  EXPECT_FALSE(past.ok());
  EXPECT_EQ(d.backend->copy_calls(), copies);
  d.backend->SetCurrentDevice(-1).IgnoreError();
}

TEST(DeviceTransportIpcTest, AnExporterKilledWhileCopiesRunFailsThemAndNothingElse) {
  auto dying = ServeDevice(0);
  auto living = ServeDevice(2);
  auto d = testutil::MakeDeviceEngine();
  ASSERT_TRUE(d.backend->SetCurrentDevice(1).ok());
  auto dead = d.engine->OpenSegment(dying.address(), "e2e");
  auto alive = d.engine->OpenSegment(living.address(), "e2e");
  ASSERT_TRUE(dead.ok() && alive.ok());
  // A reader loops over the dying owner's segment until a read fails.
  std::atomic<int> reads{0};
  Status last;
  std::thread reader([&] {
    std::vector<uint8_t> in(4 * kMiB);
    for (;;) {
      last = TransferOne(*d.engine, TransferOp::kRead, in.data(), *dead, 0, in.size());
      if (!last.ok()) return;
      if (!IsPattern(in.data(), 0, in.size())) {
        last = DataLossError("wrong bytes before the owner died");
        return;
      }
      reads.fetch_add(1);
    }
  });
  ASSERT_TRUE(testutil::WaitUntil([&] { return reads.load() >= 2; }, 20s));
  dying.Kill(SIGKILL);
  dying.Stop(5s);
  reader.join();
  EXPECT_EQ(last.code(), StatusCode::kFailedPrecondition) << last;
  EXPECT_NE(last.message().find("exited"), std::string::npos) << last;
  // The other owner's segment, and this engine, go on.
  std::vector<uint8_t> in(3 * kMiB);
  ASSERT_TRUE(TransferOne(*d.engine, TransferOp::kRead, in.data(), *alive, 5, in.size()).ok());
  EXPECT_TRUE(IsPattern(in.data(), 5, in.size()));
  ASSERT_TRUE(d.engine->CloseSegment(*dead).ok());
  EXPECT_EQ(d.backend->live_imports(), 1u);
  d.backend->SetCurrentDevice(-1).IgnoreError();
}

// LARDER_PROTOCOL=device for PD engines and LARDER_STORE_PROTOCOL=shm,tcp for store engines, in
// one process: the PD engine imports the other process's device segment, the store engine never
// touches device memory (it says why) and reaches host memory over shm.
TEST(DeviceTransportIpcTest, PdAndStoreEnginesTakeTheirOwnProtocolsAcrossProcesses) {
  testutil::ScopedEnv pd_protocol("LARDER_PROTOCOL", "device");
  testutil::ScopedEnv store_protocol("LARDER_STORE_PROTOCOL", "shm,tcp");
  auto device_peer = ServeDevice(0);
  const char* dir = std::getenv("LARDER_BIN_DIR");
  auto host_peer = ChildProcess::Spawn(
      {std::string(dir ? dir : ".") + "/larder-e2e-peer", "serve", "--protocol", "shm,tcp"},
      {{"LARDER_LOG_LEVEL", "error"}}, 60s);
  ASSERT_TRUE(host_peer.ok()) << host_peer.status();
  EmulatedDevice binder;  // the emulator's current device is per thread, for every instance
  ASSERT_TRUE(binder.SetCurrentDevice(1).ok());
  TransferEngineOptions pd_options;
  pd_options.role = EngineRole::kPd;
  auto pd = TransferEngine::Create(pd_options);
  TransferEngineOptions store_options;
  store_options.role = EngineRole::kStore;
  auto store = TransferEngine::Create(store_options);
  ASSERT_TRUE(pd.ok() && store.ok());
  auto pd_segment = (*pd)->OpenSegment(device_peer.address(), "e2e");
  ASSERT_TRUE(pd_segment.ok()) << pd_segment.status();
  EXPECT_EQ((*pd)->SegmentRoute(*pd_segment).value(), RouteKind::kDevice);
  std::vector<uint8_t> in(kMiB);
  ASSERT_TRUE(TransferOne(**pd, TransferOp::kRead, in.data(), *pd_segment, 3, in.size()).ok());
  EXPECT_TRUE(IsPattern(in.data(), 3, in.size()));
  EXPECT_EQ((*pd)->Stats().device_imports, 1u);

  auto store_device = (*store)->OpenSegment(device_peer.address(), "e2e");
  ASSERT_FALSE(store_device.ok());
  EXPECT_NE(store_device.status().message().find("device memory; this engine's routes: shm, tcp"),
            std::string::npos)
      << store_device.status().ToString();
  auto store_host = (*store)->OpenSegment(host_peer->address(), "e2e");
  ASSERT_TRUE(store_host.ok()) << store_host.status();
  EXPECT_EQ((*store)->SegmentRoute(*store_host).value(), RouteKind::kSameHostShm);
  EXPECT_EQ((*store)->Stats().device_imports, 0u);
  binder.SetCurrentDevice(-1).IgnoreError();
}

}  // namespace
}  // namespace larder::transfer
