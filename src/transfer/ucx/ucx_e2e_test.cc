// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The ucx route across real processes that play different hosts (LARDER_HOST_ID) with
// LARDER_PROTOCOL=ucx: bytes move both ways with checksums, and a target killed with SIGKILL
// mid-batch fails the initiator's requests with Unavailable while it keeps serving others.
#include <signal.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common/child_process.h"
#include "larder/transfer_engine.h"
#include "transfer/testing/engine_fixture.h"
#include "transfer/testing/test_util.h"

namespace larder {
namespace {

using namespace std::chrono_literals;
using testutil::ScopedEnv;

// UCX publishes an address for every network interface it sees when a worker starts. Other tests
// of the suite create and delete veth interfaces (network namespaces) meanwhile, so an address
// published a moment ago may be gone when the peer dials it: these tests keep UCX's network lanes
// on loopback, as an operator keeps them on the NICs meant for data (UCX_NET_DEVICES), unless the
// environment already chooses. Processes spawned by the tests inherit it.
const bool kUcxOnLoopback = [] { return setenv("UCX_NET_DEVICES", "lo", /*overwrite=*/0) == 0; }();

const RouteKind kUcx("ucx");

// Byte i of the segment larder-e2e-peer serves (and of the one this test serves to its probe).
uint8_t PatternByte(uint64_t i) { return static_cast<uint8_t>((i * 131) ^ (i >> 12)); }

std::string PeerBinary() {
  const char* dir = std::getenv("LARDER_BIN_DIR");
  return std::string(dir ? dir : ".") + "/larder-e2e-peer";
}

// A peer on "another host" whose engine takes LARDER_PROTOCOL=ucx from its environment.
ChildProcess SpawnUcxPeer(const std::string& host_id, uint64_t size = 64ull << 20) {
  auto child = ChildProcess::Spawn(
      {PeerBinary(), "serve", "--protocol", "", "--segment-size", std::to_string(size)},
      {{"LARDER_HOST_ID", host_id}, {"LARDER_PROTOCOL", "ucx"}, {"LARDER_LOG_LEVEL", "error"}},
      60s);
  EXPECT_TRUE(child.ok()) << child.status();
  return child.ok() ? std::move(child).value() : ChildProcess();
}

std::unique_ptr<TransferEngine> MakeUcxEngine() {
  ScopedEnv protocol("LARDER_PROTOCOL", "ucx");
  TransferEngineOptions options;
  options.host_id = "ucx-e2e-initiator";
  auto engine = TransferEngine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(engine).value() : nullptr;
}

uint64_t Checksum(const uint8_t* data, size_t size) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 1099511628211ull;
  return h;
}

Status Move(TransferEngine& engine, TransferOp op, void* local, SegmentHandle segment,
            uint64_t offset, uint64_t length, RouteKind* route = nullptr) {
  TransferRequest r{op, local, segment, offset, length};
  auto results = engine.TransferSync({&r, 1}, 30s);
  if (!results.ok()) return results.status();
  if (route != nullptr) *route = (*results)[0].route;
  return (*results)[0].status;
}

TEST(UcxE2eTest, BytesMoveBothWaysBetweenHosts) {
  auto peer = SpawnUcxPeer("ucx-e2e-target");
  auto engine = MakeUcxEngine();
  ASSERT_TRUE(engine);
  auto segment = engine->OpenSegment(peer.address(), "e2e");
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(engine->SegmentRoute(*segment).value(), kUcx);
  EXPECT_EQ(engine->SegmentInfo(*segment)->host_id, "ucx-e2e-target");

  // Read from the peer: 24 MiB across slices, checked against the pattern's checksum.
  const uint64_t kOffset = 12345, kLength = 24ull << 20;
  std::vector<uint8_t> buf(kLength), expected(kLength);
  for (uint64_t i = 0; i < kLength; ++i) expected[i] = PatternByte(kOffset + i);
  RouteKind route;
  ASSERT_TRUE(
      Move(*engine, TransferOp::kRead, buf.data(), *segment, kOffset, kLength, &route).ok());
  EXPECT_EQ(route, kUcx);
  EXPECT_EQ(Checksum(buf.data(), kLength), Checksum(expected.data(), kLength));

  // Write to the peer, then read it back.
  std::vector<uint8_t> out(9ull << 20), in(9ull << 20);
  testutil::FillPattern(out.data(), out.size(), 42);
  ASSERT_TRUE(
      Move(*engine, TransferOp::kWrite, out.data(), *segment, 40ull << 20, out.size()).ok());
  ASSERT_TRUE(Move(*engine, TransferOp::kRead, in.data(), *segment, 40ull << 20, in.size()).ok());
  EXPECT_EQ(Checksum(in.data(), in.size()), Checksum(out.data(), out.size()));

  // The other way: the peer process reads a segment this process exports.
  auto memory = engine->AllocateSegmentMemory(1 << 20);
  ASSERT_TRUE(memory.ok()) << memory.status();
  auto* bytes = static_cast<uint8_t*>((*memory)->data());
  for (uint64_t i = 0; i < (*memory)->size(); ++i) bytes[i] = PatternByte(i);
  ASSERT_TRUE(engine->RegisterSegment("e2e", *memory).ok());
  std::string command =
      "LARDER_HOST_ID=ucx-e2e-prober LARDER_PROTOCOL=ucx LARDER_LOG_LEVEL=error " + PeerBinary() +
      " probe --protocol '' --target " + engine->address();
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char chunk[512];
  size_t n;
  while ((n = fread(chunk, 1, sizeof(chunk), pipe)) > 0) output.append(chunk, n);
  int status = pclose(pipe);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  EXPECT_NE(output.find("ROUTE ucx"), std::string::npos) << output;
  EXPECT_NE(output.find("STATUS OK"), std::string::npos) << output;
}

TEST(UcxE2eTest, KilledTargetFailsInFlightRequestsAndEngineKeepsServing) {
  auto doomed = SpawnUcxPeer("ucx-e2e-doomed", 256ull << 20);
  auto healthy = SpawnUcxPeer("ucx-e2e-healthy");
  auto engine = MakeUcxEngine();
  ASSERT_TRUE(engine);
  auto doomed_segment = engine->OpenSegment(doomed.address(), "e2e");
  auto healthy_segment = engine->OpenSegment(healthy.address(), "e2e");
  ASSERT_TRUE(doomed_segment.ok() && healthy_segment.ok());
  std::string doomed_id = engine->SegmentInfo(*doomed_segment)->engine_id;

  const uint64_t kBlock = 1 << 20;
  std::vector<uint8_t> buf(256 * kBlock);
  auto batch = engine->Submit(testutil::ReadsFrom(buf.data(), *doomed_segment, 1024, kBlock), 20s);
  ASSERT_TRUE(batch.ok()) << batch.status();
  doomed.Kill(SIGKILL);
  auto started = std::chrono::steady_clock::now();
  ASSERT_TRUE(engine->Wait(*batch, 40s).ok()) << "the engine hung on a dead peer";
  EXPECT_LT(std::chrono::steady_clock::now() - started, 25s);
  auto results = engine->Results(*batch);
  ASSERT_TRUE(results.ok());
  EXPECT_GT(testutil::CheckDeadPeerFailures(*results, {doomed_id, "ucx-e2e-doomed"}), 0u)
      << "every request finished before the kill; the test proved nothing";
  ASSERT_TRUE(engine->Release(*batch).ok());
  doomed.Stop(1s);

  // Later requests to the dead peer fail, fast, with Unavailable.
  std::vector<uint8_t> small(4096);
  auto t0 = std::chrono::steady_clock::now();
  Status again = Move(*engine, TransferOp::kRead, small.data(), *doomed_segment, 0, small.size());
  EXPECT_EQ(again.code(), StatusCode::kUnavailable) << again;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);

  // Other peers are unaffected.
  std::vector<uint8_t> good(2 << 20);
  RouteKind route;
  ASSERT_TRUE(
      Move(*engine, TransferOp::kRead, good.data(), *healthy_segment, 0, good.size(), &route).ok());
  EXPECT_EQ(route, kUcx);
  for (uint64_t i = 0; i < good.size(); ++i) ASSERT_EQ(good[i], PatternByte(i)) << i;
}

}  // namespace
}  // namespace larder
