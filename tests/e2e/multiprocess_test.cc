// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// End-to-end tests across real processes on this host: route choice (shm between processes of
// one host, tcp across "hosts" made with LARDER_HOST_ID or forced with LARDER_PROTOCOL), refused
// handoffs, and peers that die mid-batch.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/child_process.h"
#include "larder/transfer_engine.h"
#include "transfer/device/emulated_device.h"
#include "transfer/testing/engine_fixture.h"
#include "transfer/testing/test_util.h"

namespace larder {
namespace {

using namespace std::chrono_literals;

uint8_t PatternByte(uint64_t i) { return static_cast<uint8_t>((i * 131) ^ (i >> 12)); }

std::string PeerBinary() {
  const char* dir = std::getenv("LARDER_BIN_DIR");
  return std::string(dir ? dir : ".") + "/larder-e2e-peer";
}

ChildProcess SpawnPeer(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
  std::vector<std::string> argv = {PeerBinary(), "serve"};
  argv.insert(argv.end(), args.begin(), args.end());
  env.emplace("LARDER_LOG_LEVEL", "error");
  auto child = ChildProcess::Spawn(argv, env, 60s);
  EXPECT_TRUE(child.ok()) << child.status();
  return child.ok() ? std::move(child).value() : ChildProcess();
}

std::unique_ptr<TransferEngine> MakeEngine(const std::string& protocol,
                                           EngineRole role = EngineRole::kPd) {
  TransferEngineOptions options;
  options.protocol = protocol;
  options.role = role;
  auto engine = TransferEngine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(engine).value() : nullptr;
}

// Reads [offset, offset + length) and checks it against the peer's pattern.
void ExpectPattern(TransferEngine& engine, SegmentHandle segment, uint64_t offset, uint64_t length,
                   RouteKind expected_route) {
  std::vector<uint8_t> buf(length);
  TransferRequest r{TransferOp::kRead, buf.data(), segment, offset, length};
  auto results = engine.TransferSync({&r, 1}, 20s);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_TRUE((*results)[0].status.ok()) << (*results)[0].status;
  EXPECT_EQ((*results)[0].bytes, length);
  EXPECT_EQ((*results)[0].route, expected_route);
  for (uint64_t i = 0; i < length; ++i) {
    ASSERT_EQ(buf[i], PatternByte(offset + i)) << "byte " << offset + i;
  }
}

// Writes a fresh pattern and reads it back through the same route.
void ExpectWriteReadBack(TransferEngine& engine, SegmentHandle segment, uint64_t offset,
                         uint64_t length) {
  std::vector<uint8_t> out(length), in(length);
  for (uint64_t i = 0; i < length; ++i) out[i] = static_cast<uint8_t>(i * 7 + 3);
  TransferRequest w{TransferOp::kWrite, out.data(), segment, offset, length};
  auto written = engine.TransferSync({&w, 1}, 20s);
  ASSERT_TRUE(written.ok() && (*written)[0].status.ok());
  TransferRequest r{TransferOp::kRead, in.data(), segment, offset, length};
  auto read = engine.TransferSync({&r, 1}, 20s);
  ASSERT_TRUE(read.ok() && (*read)[0].status.ok());
  EXPECT_EQ(in, out);
}

TEST(MultiProcessTest, TwoProcessesOnOneHostTakeShm) {
  auto peer = SpawnPeer({});
  auto engine = MakeEngine("auto");
  ASSERT_TRUE(engine);
  auto segment = engine->OpenSegment(peer.address(), "e2e");
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(engine->SegmentRoute(*segment).value(), RouteKind::kSameHostShm);
  ExpectPattern(*engine, *segment, 12345, 3 << 20, RouteKind::kSameHostShm);
  ExpectWriteReadBack(*engine, *segment, 40 << 20, 5 << 20);
}

// PD engines on the device protocol in two processes of one host, each on its own device: this
// process's device buffers (memory of its own device, from its engine) move to and from the peer's
// device segment over the device route, which imports the peer's handle.
TEST(MultiProcessTest, PdEnginesMoveDeviceBuffersBetweenProcesses) {
  auto peer = SpawnPeer(
      {"--protocol", "device", "--device", "2", "--segment-size", std::to_string(16 << 20)});
  transfer::EmulatedDevice binder;  // the current device is per thread, for every instance
  ASSERT_TRUE(binder.SetCurrentDevice(5).ok());
  auto engine = MakeEngine("device");
  ASSERT_TRUE(engine);
  auto buffers = engine->AllocateSegmentMemory(8 << 20);  // device memory of device 5
  ASSERT_TRUE(buffers.ok()) << buffers.status();
  ASSERT_EQ((*buffers)->kind(), MemoryKind::kDevice);  // natively registered when allocated
  auto segment = engine->OpenSegment(peer.address(), "e2e");
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(engine->SegmentRoute(*segment).value(), RouteKind::kDevice);

  // Read 3 MiB at an odd offset into the device buffer (crossing 2 MiB boundaries on both sides).
  auto* device_bytes = static_cast<uint8_t*>((*buffers)->data());
  constexpr uint64_t kLength = 3 << 20, kOffset = 12345;
  TransferRequest read{TransferOp::kRead, device_bytes + 4096, *segment, kOffset, kLength};
  auto results = engine->TransferSync({&read, 1}, 20s);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_TRUE((*results)[0].status.ok()) << (*results)[0].status;
  EXPECT_EQ((*results)[0].route, RouteKind::kDevice);
  for (uint64_t i = 0; i < kLength; ++i) {
    ASSERT_EQ(device_bytes[4096 + i], PatternByte(kOffset + i)) << "byte " << i;
  }
  // Write from the device buffer into the peer's segment, then read it back elsewhere.
  for (uint64_t i = 0; i < kLength; ++i) device_bytes[i] = static_cast<uint8_t>(i * 7 + 3);
  TransferRequest write{TransferOp::kWrite, device_bytes, *segment, 9 << 20, kLength};
  auto written = engine->TransferSync({&write, 1}, 20s);
  ASSERT_TRUE(written.ok() && (*written)[0].status.ok());
  TransferRequest back{TransferOp::kRead, device_bytes + (4 << 20), *segment, 9 << 20, kLength};
  auto read_back = engine->TransferSync({&back, 1}, 20s);
  ASSERT_TRUE(read_back.ok() && (*read_back)[0].status.ok());
  EXPECT_EQ(std::memcmp(device_bytes, device_bytes + (4 << 20), kLength), 0);
  EXPECT_GE(engine->Stats().ByRoute(RouteKind::kDevice).bytes, 3 * kLength);
  binder.SetCurrentDevice(-1).IgnoreError();
}

// A peer whose device has no peer access to this one's: the device route refuses, saying why.
TEST(MultiProcessTest, DeviceSegmentsOfADeviceWithoutPeerAccessAreRefused) {
  testutil::ScopedEnv peers("LARDER_EMULATED_DEVICE_PEERS", "0-3,4-7");
  auto peer = SpawnPeer(
      {"--protocol", "device", "--device", "1", "--segment-size", std::to_string(4 << 20)},
      {{"LARDER_EMULATED_DEVICE_PEERS", "0-3,4-7"}});
  transfer::EmulatedDevice binder;
  ASSERT_TRUE(binder.SetCurrentDevice(6).ok());
  auto engine = MakeEngine("device");
  ASSERT_TRUE(engine);
  auto buffers = engine->AllocateSegmentMemory(2 << 20);  // initializes on device 6
  ASSERT_TRUE(buffers.ok()) << buffers.status();
  auto segment = engine->OpenSegment(peer.address(), "e2e");
  Status refused = segment.ok() ? engine->SegmentRoute(*segment).status() : segment.status();
  if (segment.ok() && refused.ok()) {
    std::vector<uint8_t> buf(4096);
    TransferRequest r{TransferOp::kRead, buf.data(), *segment, 0, buf.size()};
    auto results = engine->TransferSync({&r, 1}, 20s);
    ASSERT_TRUE(results.ok());
    refused = (*results)[0].status;
  }
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("no peer access"), std::string::npos) << refused;
  binder.SetCurrentDevice(-1).IgnoreError();
}

TEST(MultiProcessTest, DifferentHostIdsTakeTcp) {
  auto peer = SpawnPeer({}, {{"LARDER_HOST_ID", "e2e-other-host"}});
  auto engine = MakeEngine("auto");
  ASSERT_TRUE(engine);
  auto segment = engine->OpenSegment(peer.address(), "e2e");
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(engine->SegmentRoute(*segment).value(), RouteKind::kTcp);
  EXPECT_EQ(engine->SegmentInfo(*segment)->host_id, "e2e-other-host");
  ExpectPattern(*engine, *segment, 777, 3 << 20, RouteKind::kTcp);
  ExpectWriteReadBack(*engine, *segment, 1 << 20, 9 << 20);
}

using testutil::ScopedEnv;

TEST(MultiProcessTest, LarderProtocolTcpForcesTheNetworkOnOneHost) {
  auto peer = SpawnPeer({});
  ScopedEnv pd("LARDER_PROTOCOL", "tcp");
  ScopedEnv store("LARDER_STORE_PROTOCOL", std::nullopt);
  auto engine = MakeEngine("");
  ASSERT_TRUE(engine);
  auto segment = engine->OpenSegment(peer.address(), "e2e");
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(engine->SegmentRoute(*segment).value(), RouteKind::kTcp);
  ExpectPattern(*engine, *segment, 0, 1 << 20, RouteKind::kTcp);
}

TEST(MultiProcessTest, StoreAndPdEnginesTakeTheirOwnProtocols) {
  auto peer = SpawnPeer({});
  ScopedEnv pd("LARDER_PROTOCOL", "tcp");
  ScopedEnv store("LARDER_STORE_PROTOCOL", "shm,tcp");
  auto pd_engine = MakeEngine("", EngineRole::kPd);
  auto store_engine = MakeEngine("", EngineRole::kStore);
  ASSERT_TRUE(pd_engine && store_engine);
  auto pd_segment = pd_engine->OpenSegment(peer.address(), "e2e");
  auto store_segment = store_engine->OpenSegment(peer.address(), "e2e");
  ASSERT_TRUE(pd_segment.ok() && store_segment.ok());
  EXPECT_EQ(pd_engine->SegmentRoute(*pd_segment).value(), RouteKind::kTcp);
  EXPECT_EQ(store_engine->SegmentRoute(*store_segment).value(), RouteKind::kSameHostShm);
  // Resolving the store protocol never rewrote the PD variable.
  EXPECT_STREQ(std::getenv("LARDER_PROTOCOL"), "tcp");
}

TEST(MultiProcessTest, RefusedHandoffFallsBackToTcp) {
  // The peer lets only a uid that is not ours map its segments.
  uint32_t other_uid = static_cast<uint32_t>(getuid()) + 12345;
  auto peer = SpawnPeer({"--allowed-uid", std::to_string(other_uid)});
  auto engine = MakeEngine("auto");
  ASSERT_TRUE(engine);
  auto segment = engine->OpenSegment(peer.address(), "e2e");
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(engine->SegmentRoute(*segment).value(), RouteKind::kTcp);
  ExpectPattern(*engine, *segment, 4096, 1 << 20, RouteKind::kTcp);

  auto shm_only = MakeEngine("shm");
  ASSERT_TRUE(shm_only);
  auto refused = shm_only->OpenSegment(peer.address(), "e2e");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied) << refused.status();
}

// Runs `body` in a forked child that first switches to `uid`; returns what it wrote to the pipe.
std::string RunAsUid(uint32_t uid, const std::function<std::string()>& body) {
  int fds[2];
  if (pipe(fds) != 0) return "pipe failed";
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::string out;
    if (setgid(uid) != 0 || setuid(uid) != 0) {
      out = "setuid failed";
    } else {
      out = body();
    }
    ssize_t n = write(fds[1], out.data(), out.size());
    (void)n;
    _exit(0);
  }
  close(fds[1]);
  std::string out;
  char buf[512];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return out;
}

TEST(MultiProcessTest, HandoffToAnotherUidIsPermissionDenied) {
  if (getuid() != 0) {
    GTEST_SKIP() << "needs root to run a peer process under another uid";
  }
  auto peer = SpawnPeer({});
  std::string address = peer.address();
  // A process of uid 65534 (nobody) on the same host: the owner checks SO_PEERCRED and refuses.
  std::string shm_only = RunAsUid(65534, [&] {
    TransferEngineOptions options;
    options.protocol = "shm";
    auto engine = TransferEngine::Create(options);
    if (!engine.ok()) return "create: " + engine.status().ToString();
    auto segment = (*engine)->OpenSegment(address, "e2e");
    return segment.ok() ? std::string("opened") : segment.status().ToString();
  });
  EXPECT_EQ(shm_only.rfind("PermissionDenied", 0), 0u) << shm_only;
  EXPECT_NE(shm_only.find("uid 65534"), std::string::npos) << shm_only;
  // With auto, the same process falls back to tcp and reads the data.
  std::string fallback = RunAsUid(65534, [&] {
    TransferEngineOptions options;
    options.protocol = "auto";
    auto engine = TransferEngine::Create(options);
    if (!engine.ok()) return "create: " + engine.status().ToString();
    auto segment = (*engine)->OpenSegment(address, "e2e");
    if (!segment.ok()) return segment.status().ToString();
    std::vector<uint8_t> buf(4096);
    TransferRequest r{TransferOp::kRead, buf.data(), *segment, 0, buf.size()};
    auto results = (*engine)->TransferSync({&r, 1}, 10s);
    if (!results.ok()) return results.status().ToString();
    if (!(*results)[0].status.ok()) return (*results)[0].status.ToString();
    for (size_t i = 0; i < buf.size(); ++i) {
      if (buf[i] != PatternByte(i)) return std::string("wrong bytes");
    }
    return "route " + std::string(RouteKindName((*results)[0].route));
  });
  EXPECT_EQ(fallback, "route tcp");
}

TEST(MultiProcessTest, KilledTargetFailsInFlightRequestsAndEngineKeepsWorking) {
  auto doomed = SpawnPeer({"--segment-size", std::to_string(256 << 20)});
  auto healthy = SpawnPeer({});
  auto engine = MakeEngine("tcp");
  ASSERT_TRUE(engine);
  auto doomed_segment = engine->OpenSegment(doomed.address(), "e2e");
  auto healthy_segment = engine->OpenSegment(healthy.address(), "e2e");
  ASSERT_TRUE(doomed_segment.ok() && healthy_segment.ok());

  // A batch large enough to be in flight when the target dies.
  const uint64_t kBlock = 1 << 20;
  std::vector<uint8_t> buf(256 * kBlock);
  auto batch = engine->Submit(testutil::ReadsFrom(buf.data(), *doomed_segment, 512, kBlock), 10s);
  ASSERT_TRUE(batch.ok()) << batch.status();
  doomed.Kill(SIGKILL);
  auto started = std::chrono::steady_clock::now();
  ASSERT_TRUE(engine->Wait(*batch, 30s).ok()) << "the engine hung on a dead peer";
  EXPECT_LT(std::chrono::steady_clock::now() - started, 12s);
  auto results = engine->Results(*batch);
  ASSERT_TRUE(results.ok());
  EXPECT_GT(testutil::CheckDeadPeerFailures(*results, {doomed.address()}), 0u)
      << "every request finished before the kill; the test proved nothing";
  ASSERT_TRUE(engine->Release(*batch).ok());
  doomed.Stop(1s);

  // Later requests to the dead peer fail fast with Unavailable (backoff, no hang).
  std::vector<uint8_t> small(4096);
  TransferRequest again{TransferOp::kRead, small.data(), *doomed_segment, 0, small.size()};
  auto t0 = std::chrono::steady_clock::now();
  auto retry = engine->TransferSync({&again, 1}, 5s);
  ASSERT_TRUE(retry.ok());
  EXPECT_EQ((*retry)[0].status.code(), StatusCode::kUnavailable) << (*retry)[0].status;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 6s);

  // Other peers are unaffected.
  ExpectPattern(*engine, *healthy_segment, 0, 2 << 20, RouteKind::kTcp);
}

// Waits until `done` holds or `timeout` passes; true when it held. `done` is cheap and the wait is
// short (the watcher reacts to the exit at once), so it yields rather than sleeps.
template <typename Condition>
bool WaitFor(Condition done, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

TEST(MultiProcessTest, ShmMappingOfAnExitedOwnerIsDropped) {
  // A mapped memfd would stay valid memory after its owner dies, and keep the owner's pages
  // alive in this process. The shm transport watches the owner's process and drops the mapping
  // when it exits, so readers' memory tracks the live segments only.
  auto peer = SpawnPeer({});
  auto engine = MakeEngine("auto");
  ASSERT_TRUE(engine);
  auto segment = engine->OpenSegment(peer.address(), "e2e");
  ASSERT_TRUE(segment.ok());
  ASSERT_EQ(engine->SegmentRoute(*segment).value(), RouteKind::kSameHostShm);
  ExpectPattern(*engine, *segment, 1 << 20, 1 << 20, RouteKind::kSameHostShm);
  EngineStats before = engine->Stats();
  EXPECT_EQ(before.mapped_segments, 1u);
  EXPECT_EQ(before.mapped_bytes, 64u << 20);
  std::string owner = engine->SegmentInfo(*segment).value().engine_id;

  peer.Kill(SIGKILL);
  peer.Stop(5s);
  ASSERT_TRUE(WaitFor([&] { return engine->Stats().mapped_segments == 0; }, 10s))
      << "the mapping of a dead owner was kept";
  EXPECT_EQ(engine->Stats().mappings_dropped, 1u);

  // Reads now fail with Unavailable (the fallback to tcp finds nobody either) and are counted.
  std::vector<uint8_t> buf(4096);
  TransferRequest r{TransferOp::kRead, buf.data(), *segment, 0, buf.size()};
  auto results = engine->TransferSync({&r, 1}, 5s);
  ASSERT_TRUE(results.ok());
  EXPECT_EQ((*results)[0].status.code(), StatusCode::kUnavailable) << (*results)[0].status;
  EngineStats after = engine->Stats();
  TransferCounters failed = after.ByPeer(owner, RouteKind::kSameHostShm);
  failed += after.ByPeer(owner, RouteKind::kTcp);
  EXPECT_EQ(failed.failures, 1u);
}

TEST(MultiProcessTest, StatsCountRequestsBytesAndFailuresByPeerAndRoute) {
  auto shm_peer = SpawnPeer({});
  auto tcp_peer = SpawnPeer({}, {{"LARDER_HOST_ID", "e2e-other-host"}});
  auto engine = MakeEngine("auto");
  ASSERT_TRUE(engine);
  auto near = engine->OpenSegment(shm_peer.address(), "e2e");
  auto far = engine->OpenSegment(tcp_peer.address(), "e2e");
  ASSERT_TRUE(near.ok() && far.ok());
  ExpectPattern(*engine, *near, 0, 3 << 20, RouteKind::kSameHostShm);
  ExpectWriteReadBack(*engine, *near, 8 << 20, 1 << 20);
  ExpectPattern(*engine, *far, 4096, 1 << 20, RouteKind::kTcp);
  std::vector<uint8_t> buf(4096);
  TransferRequest outside{TransferOp::kRead, buf.data(), *far, (64 << 20) - 100, 4096};
  auto rejected = engine->TransferSync({&outside, 1}, 5s);
  ASSERT_TRUE(rejected.ok());
  EXPECT_FALSE((*rejected)[0].status.ok());

  EngineStats stats = engine->Stats();
  std::string near_id = engine->SegmentInfo(*near).value().engine_id;
  std::string far_id = engine->SegmentInfo(*far).value().engine_id;
  TransferCounters shm = stats.ByPeer(near_id, RouteKind::kSameHostShm);
  EXPECT_EQ(shm.requests, 3u);
  EXPECT_EQ(shm.bytes, (3u << 20) + (2u << 20));
  EXPECT_EQ(shm.failures, 0u);
  EXPECT_EQ(stats.ByPeer(near_id, RouteKind::kTcp).requests, 0u) << "same-host bytes over tcp";
  TransferCounters tcp = stats.ByPeer(far_id, RouteKind::kTcp);
  EXPECT_EQ(tcp.requests, 1u);  // the out-of-range request was refused before any route
  EXPECT_EQ(tcp.bytes, 1u << 20);
  EXPECT_EQ(stats.ByRoute(RouteKind::kTcp).bytes, 1u << 20);
  for (const PeerTransferStats& peer : stats.peers) {
    if (peer.engine_id == near_id) {
      EXPECT_EQ(peer.reads.bytes, (3u << 20) + (1u << 20));
      EXPECT_EQ(peer.writes.bytes, 1u << 20);
    }
  }
  auto json = nlohmann::json::parse(stats.ToJson());
  EXPECT_EQ(json["routes"]["shm"]["bytes"], (3u << 20) + (2u << 20));
  EXPECT_EQ(json["routes"]["tcp"]["bytes"], 1u << 20);
  EXPECT_EQ(json["mapped_segments"], 1);
}

TEST(MultiProcessTest, ProcessInAnotherNetworkNamespaceIsAnotherHost) {
  // Abstract Unix sockets are per network namespace, so shm cannot reach a peer in another one:
  // without LARDER_HOST_ID it must be another host (tcp), not a failed shm handoff.
  if (geteuid() != 0 || system("unshare --net true 2>/dev/null") != 0) {
    GTEST_SKIP() << "cannot create a network namespace here (needs root and unshare)";
  }
  // The peer gets a namespace of its own with only loopback; it cannot be reached from here at
  // all, so this checks the identity it announces rather than a transfer.
  auto peer =
      ChildProcess::Spawn({"/usr/bin/unshare", "--net", "/bin/sh", "-c",
                           "ip link set lo up && exec " + PeerBinary() + " serve --print-host-id"},
                          {{"LARDER_LOG_LEVEL", "error"}}, 60s);
  ASSERT_TRUE(peer.ok()) << peer.status();
  auto host_line = peer->ReadLine(10s);
  ASSERT_TRUE(host_line.ok()) << host_line.status();
  auto engine = MakeEngine("auto");
  ASSERT_TRUE(engine);
  ASSERT_TRUE(host_line->starts_with("HOST "));
  std::string peer_host = host_line->substr(5);
  EXPECT_NE(peer_host, engine->host_id());
  // Same kernel: the boot id part agrees, the namespace part does not.
  EXPECT_EQ(peer_host.substr(0, peer_host.find("-net")),
            engine->host_id().substr(0, engine->host_id().find("-net")));
}

}  // namespace
}  // namespace larder
