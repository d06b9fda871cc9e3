// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Device memory across hosts: the CPU's routes move device memory through pinned host staging
// buffers. Two engines of this process stand for two hosts (distinct host ids, so the device
// route cannot import between them and tcp carries the bytes); the owner of a device segment
// stages on its tcp server, an initiator stages its own device buffers around the route. One
// test per promise: the bytes arrive on both sides and both ways; routes and counters say
// "tcp-staged"; a full pool is back-pressure; a failed device copy, a range past the segment's
// end, a forged descriptor and an owner killed mid-transfer are clear errors that leak no pinned
// buffer.
#include "transfer/device/device_staging.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "common/child_process.h"
#include "transfer/device/device_transport.h"
#include "transfer/device/emulated_device.h"
#include "transfer/engine_internal.h"
#include "transfer/testing/device_engine.h"
#include "transfer/testing/test_util.h"

namespace larder::transfer {
namespace {

using namespace std::chrono_literals;
using testutil::TransferOne;

constexpr uint64_t kMiB = 1 << 20;
const RouteKind kTcpStaged("tcp-staged");

uint8_t PatternByte(uint64_t i, uint8_t seed) {
  return static_cast<uint8_t>((i * 131) ^ (i >> 11) ^ seed);
}
void Fill(uint8_t* bytes, uint64_t n, uint8_t seed) {
  for (uint64_t i = 0; i < n; ++i) bytes[i] = PatternByte(i, seed);
}
::testing::AssertionResult HasPattern(const uint8_t* bytes, uint64_t n, uint8_t seed) {
  for (uint64_t i = 0; i < n; ++i) {
    if (bytes[i] != PatternByte(i, seed)) {
      return ::testing::AssertionFailure() << "byte " << i << " of " << n << " differs";
    }
  }
  return ::testing::AssertionSuccess();
}

// An engine standing for one host: local, a device transport over an emulated backend the test
// holds (bound to device 0 on the test's thread) when `device`, and tcp.
struct Host {
  std::shared_ptr<EmulatedDevice> backend;
  std::unique_ptr<TransferEngine> engine;
};

Host MakeHost(const std::string& host_id, bool device, DeviceStagingOptions staging = {}) {
  Host h;
  std::vector<std::unique_ptr<Transport>> transports;
  auto local = CreateTransports({RouteKind::kLocal});
  EXPECT_TRUE(local.ok()) << local.status();
  if (local.ok()) transports.push_back(std::move(local->front()));
  TransferEngineOptions options;
  options.host_id = host_id;
  options.listen_address = "127.0.0.1:0";
  if (device) {
    h.backend = std::make_shared<EmulatedDevice>(EmulatedDeviceOptions{.host_id = host_id});
    EXPECT_TRUE(h.backend->SetCurrentDevice(0).ok());
    transports.push_back(CreateDeviceTransport(h.backend, staging));
  }
  auto tcp = CreateTransports({RouteKind::kTcp});
  EXPECT_TRUE(tcp.ok()) << tcp.status();
  if (tcp.ok()) {
    for (auto& t : *tcp) transports.push_back(std::move(t));
  }
  options.protocol = device ? "local,device,tcp" : "local,tcp";
  auto engine = CreateEngineWithTransports(options, std::move(transports));
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (engine.ok()) h.engine = std::move(engine).value();
  return h;
}

// `owner`'s segment `name`, opened by `reader` from the owner's listing.
Result<SegmentHandle> OpenOn(TransferEngine& reader, TransferEngine& owner,
                             const std::string& name) {
  for (const SegmentDescriptor& d : owner.ListSegments()) {
    if (d.name == name) return reader.OpenSegment(d);
  }
  return NotFoundError("no segment " + name);
}

// Waits until both engines lease no staging buffer (a server lets go of its buffer right after
// its reply, which may reach the reader first).
void ExpectBuffersBack(const std::vector<TransferEngine*>& engines) {
  bool back = testutil::WaitUntil(
      [&] {
        for (TransferEngine* e : engines) {
          if (e->Stats().staging_buffers_in_use != 0) return false;
        }
        return true;
      },
      10s);
  EXPECT_TRUE(back) << "a pinned staging buffer was not given back";
}

TEST(DeviceStagingTest, ADeviceSegmentIsReadAndWrittenFromAnotherHostOverTcp) {
  Host owner = MakeHost("host-a", true);
  Host reader = MakeHost("host-b", false);
  ASSERT_TRUE(owner.engine && reader.engine);
  auto memory = owner.engine->AllocateSegmentMemory(16 * kMiB);
  ASSERT_TRUE(memory.ok()) << memory.status();
  ASSERT_EQ((*memory)->kind(), MemoryKind::kDevice);
  ASSERT_TRUE(owner.engine->RegisterSegment("kv", *memory).ok());
  Result<SegmentHandle> segment = OpenOn(*reader.engine, *owner.engine, "kv");
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(reader.engine->SegmentRoute(*segment).value(), kTcpStaged);

  // 6 MiB at an odd offset: two 2 MiB boundaries inside, more than one staging chunk.
  const uint64_t offset = kMiB - 3, length = 6 * kMiB + 5;
  std::vector<uint8_t> out(length), in(length);
  Fill(out.data(), length, 7);
  RouteKind route;
  ASSERT_TRUE(
      TransferOne(*reader.engine, TransferOp::kWrite, out.data(), *segment, offset, length, &route)
          .ok());
  EXPECT_EQ(route, kTcpStaged);
  // The owner's device memory (host memory in the emulator) holds the bytes.
  EXPECT_TRUE(HasPattern(static_cast<uint8_t*>((*memory)->data()) + offset, length, 7));
  ASSERT_TRUE(
      TransferOne(*reader.engine, TransferOp::kRead, in.data(), *segment, offset, length).ok());
  EXPECT_EQ(in, out);

  EngineStats reads = reader.engine->Stats();
  EXPECT_EQ(reads.ByRoute(kTcpStaged).bytes, 2 * length);
  EXPECT_EQ(reads.ByRoute(RouteKind::kTcp).bytes, 0u);
  ExpectBuffersBack({owner.engine.get()});
  EngineStats served = owner.engine->Stats();
  EXPECT_EQ(served.staged_to_device_bytes, length);
  EXPECT_EQ(served.staged_to_host_bytes, length);
  EXPECT_GE(served.staging_buffers, 1u);
  EXPECT_EQ(served.staging_copy_failures, 0u);
}

TEST(DeviceStagingTest, AnInitiatorsDeviceBuffersGoThroughStagingOnEveryCpuRoute) {
  // The segments' memory outlives the engines that serve it.
  std::vector<uint8_t> host_segment(8 * kMiB);
  std::vector<uint8_t> own(kMiB);
  Host owner = MakeHost("host-a", false);
  Host initiator = MakeHost("host-b", true);
  ASSERT_TRUE(owner.engine && initiator.engine);
  ASSERT_TRUE(owner.engine->RegisterSegment("host", host_segment.data(), host_segment.size()).ok());
  Result<SegmentHandle> segment = OpenOn(*initiator.engine, *owner.engine, "host");
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(initiator.engine->SegmentRoute(*segment).value(), RouteKind::kTcp);
  // The initiator's buffers are its device memory (allocated, not exported).
  auto out = initiator.engine->AllocateSegmentMemory(8 * kMiB);
  auto in = initiator.engine->AllocateSegmentMemory(8 * kMiB);
  ASSERT_TRUE(out.ok() && in.ok());
  auto* out_bytes = static_cast<uint8_t*>((*out)->data());
  auto* in_bytes = static_cast<uint8_t*>((*in)->data());
  const uint64_t length = 5 * kMiB + 11;
  Fill(out_bytes + 3, length, 21);
  const uint64_t copies_before = initiator.backend->copy_calls();
  RouteKind route;
  ASSERT_TRUE(TransferOne(*initiator.engine, TransferOp::kWrite, out_bytes + 3, *segment, 17,
                          length, &route)
                  .ok());
  EXPECT_EQ(route, kTcpStaged);
  EXPECT_TRUE(HasPattern(host_segment.data() + 17, length, 21));
  ASSERT_TRUE(
      TransferOne(*initiator.engine, TransferOp::kRead, in_bytes + 1, *segment, 17, length, &route)
          .ok());
  EXPECT_EQ(route, kTcpStaged);
  EXPECT_TRUE(HasPattern(in_bytes + 1, length, 21));
  // Every byte crossed the device boundary through the backend's copies, not the CPU's.
  EXPECT_GT(initiator.backend->copy_calls(), copies_before);
  EngineStats stats = initiator.engine->Stats();
  EXPECT_EQ(stats.ByRoute(kTcpStaged).bytes, 2 * length);
  EXPECT_EQ(stats.staged_to_host_bytes, length);
  EXPECT_EQ(stats.staged_to_device_bytes, length);
  ExpectBuffersBack({initiator.engine.get()});

  // The local route (a host segment of the initiator itself) stages the same way.
  ASSERT_TRUE(initiator.engine->RegisterSegment("own", own.data(), own.size()).ok());
  Result<SegmentHandle> local = OpenOn(*initiator.engine, *initiator.engine, "own");
  ASSERT_TRUE(local.ok()) << local.status();
  ASSERT_TRUE(
      TransferOne(*initiator.engine, TransferOp::kWrite, out_bytes + 3, *local, 0, kMiB, &route)
          .ok());
  EXPECT_EQ(route, RouteKind("local-staged"));
  EXPECT_TRUE(HasPattern(own.data(), kMiB, 21));
}

TEST(DeviceStagingTest, DeviceMemoryOnBothEndsMovesBothWays) {
  Host owner = MakeHost("host-a", true);
  Host initiator = MakeHost("host-b", true);
  ASSERT_TRUE(owner.engine && initiator.engine);
  const uint64_t length = 64 * kMiB;
  auto memory = owner.engine->AllocateSegmentMemory(length);
  ASSERT_TRUE(memory.ok()) << memory.status();
  ASSERT_TRUE(owner.engine->RegisterSegment("kv", *memory).ok());
  Result<SegmentHandle> segment = OpenOn(*initiator.engine, *owner.engine, "kv");
  ASSERT_TRUE(segment.ok()) << segment.status();
  auto local = initiator.engine->AllocateSegmentMemory(length);
  ASSERT_TRUE(local.ok());
  auto* bytes = static_cast<uint8_t*>((*local)->data());
  Fill(bytes, length, 3);
  ASSERT_TRUE(TransferOne(*initiator.engine, TransferOp::kWrite, bytes, *segment, 0, length).ok());
  EXPECT_TRUE(HasPattern(static_cast<uint8_t*>((*memory)->data()), length, 3));
  std::memset(bytes, 0, length);
  RouteKind route;
  ASSERT_TRUE(
      TransferOne(*initiator.engine, TransferOp::kRead, bytes, *segment, 0, length, &route).ok());
  EXPECT_EQ(route, kTcpStaged);
  EXPECT_TRUE(HasPattern(bytes, length, 3));
  ExpectBuffersBack({owner.engine.get(), initiator.engine.get()});
  // At most the pools' sizes were pinned, whatever the transfer's size.
  EXPECT_LE(owner.engine->Stats().staging_buffers, DeviceStagingOptions{}.serve_buffers);
  EXPECT_LE(initiator.engine->Stats().staging_buffers, DeviceStagingOptions{}.initiate_buffers);
}

TEST(DeviceStagingTest, AnExhaustedPoolIsBackPressureNotAnError) {
  // One buffer on each side for 24 slices in flight at once.
  Host owner = MakeHost("host-a", true, {.serve_buffers = 1, .initiate_buffers = 1});
  Host initiator = MakeHost("host-b", true, {.serve_buffers = 1, .initiate_buffers = 1});
  ASSERT_TRUE(owner.engine && initiator.engine);
  auto memory = owner.engine->AllocateSegmentMemory(24 * kMiB);
  ASSERT_TRUE(memory.ok());
  ASSERT_TRUE(owner.engine->RegisterSegment("kv", *memory).ok());
  Result<SegmentHandle> segment = OpenOn(*initiator.engine, *owner.engine, "kv");
  ASSERT_TRUE(segment.ok()) << segment.status();
  auto local = initiator.engine->AllocateSegmentMemory(24 * kMiB);
  ASSERT_TRUE(local.ok());
  auto* bytes = static_cast<uint8_t*>((*local)->data());
  Fill(bytes, 24 * kMiB, 9);
  std::vector<TransferRequest> writes;
  for (uint64_t i = 0; i < 24; ++i) {
    writes.push_back({TransferOp::kWrite, bytes + i * kMiB, *segment, i * kMiB, kMiB});
  }
  auto results = initiator.engine->TransferSync(writes, 30s);
  ASSERT_TRUE(results.ok()) << results.status();
  for (const TransferResult& r : *results) EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_TRUE(HasPattern(static_cast<uint8_t*>((*memory)->data()), 24 * kMiB, 9));
  EXPECT_GT(initiator.engine->Stats().staging_waits, 0u);
  EXPECT_EQ(initiator.engine->Stats().staging_buffers, 1u);
  EXPECT_EQ(owner.engine->Stats().staging_buffers, 1u);
  ExpectBuffersBack({owner.engine.get(), initiator.engine.get()});
}

TEST(DeviceStagingTest, AFailedDeviceCopyFailsItsRequestOnlyAndGivesTheBufferBack) {
  Host owner = MakeHost("host-a", true);
  Host initiator = MakeHost("host-b", true);
  ASSERT_TRUE(owner.engine && initiator.engine);
  auto memory = owner.engine->AllocateSegmentMemory(8 * kMiB);
  ASSERT_TRUE(memory.ok());
  ASSERT_TRUE(owner.engine->RegisterSegment("kv", *memory).ok());
  Result<SegmentHandle> segment = OpenOn(*initiator.engine, *owner.engine, "kv");
  ASSERT_TRUE(segment.ok()) << segment.status();
  auto local = initiator.engine->AllocateSegmentMemory(8 * kMiB);
  ASSERT_TRUE(local.ok());
  auto* bytes = static_cast<uint8_t*>((*local)->data());

  // The owner's copy fails: the reader's request fails saying so; the next one works.
  owner.backend->FailCopyAt(1);
  Status failed = TransferOne(*initiator.engine, TransferOp::kRead, bytes, *segment, 0, kMiB);
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find("staging copy"), std::string::npos) << failed;
  EXPECT_TRUE(TransferOne(*initiator.engine, TransferOp::kRead, bytes, *segment, 0, kMiB).ok());
  // The initiator's own copy fails on a write: that request fails, nothing was sent.
  initiator.backend->FailCopyAt(1);
  failed = TransferOne(*initiator.engine, TransferOp::kWrite, bytes, *segment, 0, kMiB);
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find("injected native copy failure"), std::string::npos) << failed;
  EXPECT_TRUE(TransferOne(*initiator.engine, TransferOp::kWrite, bytes, *segment, 0, kMiB).ok());
  EXPECT_EQ(owner.engine->Stats().staging_copy_failures, 1u);
  EXPECT_EQ(initiator.engine->Stats().staging_copy_failures, 1u);
  ExpectBuffersBack({owner.engine.get(), initiator.engine.get()});
}

TEST(DeviceStagingTest, RangesPastTheEndAndForgedDescriptorsAreRefusedByTheOwner) {
  Host owner = MakeHost("host-a", true);
  Host reader = MakeHost("host-b", false);
  ASSERT_TRUE(owner.engine && reader.engine);
  auto memory = owner.engine->AllocateSegmentMemory(4 * kMiB);
  ASSERT_TRUE(memory.ok());
  ASSERT_TRUE(owner.engine->RegisterSegment("kv", *memory).ok());
  SegmentDescriptor descriptor = owner.engine->ListSegments().front();
  std::vector<uint8_t> buffer(2 * kMiB);
  // Checked on this side first.
  Result<SegmentHandle> segment = reader.engine->OpenSegment(descriptor);
  ASSERT_TRUE(segment.ok());
  Status past =
      TransferOne(*reader.engine, TransferOp::kRead, buffer.data(), *segment, 3 * kMiB, 2 * kMiB);
  EXPECT_EQ(past.code(), StatusCode::kOutOfRange) << past;
  // A descriptor that claims more than the owner has: the owner refuses the range itself.
  SegmentDescriptor inflated = descriptor;
  inflated.size = 64 * kMiB;
  Result<SegmentHandle> forged = reader.engine->OpenSegment(inflated);
  ASSERT_TRUE(forged.ok());
  for (TransferOp op : {TransferOp::kRead, TransferOp::kWrite}) {
    Status refused = TransferOne(*reader.engine, op, buffer.data(), *forged, 3 * kMiB, 2 * kMiB);
    EXPECT_EQ(refused.code(), StatusCode::kOutOfRange) << refused;
  }
  // A descriptor that says host memory for the device segment: the owner goes by its own record
  // and stages, so the bytes are still right.
  SegmentDescriptor host_claim = descriptor;
  host_claim.memory_kind = MemoryKind::kAnonymous;
  Result<SegmentHandle> claimed = reader.engine->OpenSegment(host_claim);
  ASSERT_TRUE(claimed.ok());
  Fill(static_cast<uint8_t*>((*memory)->data()), kMiB, 5);
  ASSERT_TRUE(
      TransferOne(*reader.engine, TransferOp::kRead, buffer.data(), *claimed, 0, kMiB).ok());
  EXPECT_TRUE(HasPattern(buffer.data(), kMiB, 5));
  // And the connection still serves honest requests.
  EXPECT_TRUE(
      TransferOne(*reader.engine, TransferOp::kRead, buffer.data(), *segment, 0, kMiB).ok());
  ExpectBuffersBack({owner.engine.get()});

  // A host segment of an engine without a device backend, described as device memory: served
  // from the host memory it is. (Its memory is declared first: it outlives the engine.)
  std::vector<uint8_t> host_bytes(kMiB);
  Host plain = MakeHost("host-c", false);
  ASSERT_TRUE(plain.engine);
  Fill(host_bytes.data(), kMiB, 8);
  ASSERT_TRUE(plain.engine->RegisterSegment("plain", host_bytes.data(), host_bytes.size()).ok());
  SegmentDescriptor device_claim = plain.engine->ListSegments().front();
  device_claim.memory_kind = MemoryKind::kDevice;
  Result<SegmentHandle> claimed_device = reader.engine->OpenSegment(device_claim);
  ASSERT_TRUE(claimed_device.ok()) << claimed_device.status();
  ASSERT_TRUE(
      TransferOne(*reader.engine, TransferOp::kRead, buffer.data(), *claimed_device, 0, kMiB).ok());
  EXPECT_TRUE(HasPattern(buffer.data(), kMiB, 8));
}

TEST(DeviceStagingTest, AnOwnerKilledMidTransferFailsTheRequestsAndLeaksNoBuffer) {
  // The owner: a larder-e2e-peer serving a device segment over device,tcp as another host.
  const char* dir = std::getenv("LARDER_BIN_DIR");
  auto peer = ChildProcess::Spawn(
      {std::string(dir ? dir : ".") + "/larder-e2e-peer", "serve", "--protocol", "device,tcp",
       "--device", "0", "--segment-size", std::to_string(64 * kMiB)},
      {{"LARDER_LOG_LEVEL", "error"}, {"LARDER_HOST_ID", "host-killed"}}, 60s);
  ASSERT_TRUE(peer.ok()) << peer.status();
  Host initiator = MakeHost("host-b", true);
  ASSERT_TRUE(initiator.engine);
  Result<SegmentHandle> segment = initiator.engine->OpenSegment(peer->address(), "e2e");
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(initiator.engine->SegmentRoute(*segment).value(), kTcpStaged);
  auto local = initiator.engine->AllocateSegmentMemory(64 * kMiB);
  ASSERT_TRUE(local.ok());
  auto* bytes = static_cast<uint8_t*>((*local)->data());
  // Reads run until one fails; the owner is killed while they run.
  std::atomic<bool> failed{false};
  Status failure;
  std::thread reads([&] {
    initiator.backend->SetCurrentDevice(0).IgnoreError();
    for (int i = 0; i < 10000 && !failed; ++i) {
      Status s = TransferOne(*initiator.engine, TransferOp::kRead, bytes, *segment, 0, 64 * kMiB);
      if (!s.ok()) {
        failure = s;
        failed = true;
      }
    }
  });
  ASSERT_TRUE(testutil::WaitUntil(
      [&] { return initiator.engine->Stats().ByRoute(kTcpStaged).bytes >= 64 * kMiB; }, 30s));
  peer->Kill(SIGKILL);
  reads.join();
  ASSERT_TRUE(failed) << "reads kept succeeding after the owner was killed";
  EXPECT_NE(failure.message().find("tcp-staged"), std::string::npos) << failure;
  ExpectBuffersBack({initiator.engine.get()});
}

}  // namespace
}  // namespace larder::transfer
