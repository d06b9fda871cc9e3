// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The engine and its peers: unreachable, dead and silent peers fail each request by its deadline
// and leave the engine serving; the cluster token and the shm uid policy decide who is served.
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/net.h"
#include "larder/transfer_engine.h"
#include "transfer/testing/engine_fixture.h"
#include "transfer/testing/test_util.h"

namespace larder {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using namespace testutil;  // the engine tests' fixture (testing/engine_fixture.h)

TEST(EnginePeerTest, ListPeerSegmentsOfClosedPortIsUnavailable) {
  uint16_t port = 0;
  {
    auto listener = TcpListen({"127.0.0.1", 0});
    ASSERT_TRUE(listener.ok());
    port = BoundPort(listener->get()).value_or(0);
  }
  auto engine = CreateEngine(WithProtocol("tcp"));
  ASSERT_TRUE(engine);
  std::string address = "127.0.0.1:" + std::to_string(port);
  auto listed = engine->ListPeerSegments(address, seconds(2));
  ASSERT_FALSE(listed.ok());
  EXPECT_EQ(listed.status().code(), StatusCode::kUnavailable) << listed.status();
  EXPECT_NE(listed.status().message().find(address), std::string::npos) << listed.status();
  EXPECT_EQ(engine->OpenSegment(address, "kv").status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(engine->ListPeerSegments("not-an-address", seconds(1)).status().code(),
            StatusCode::kInvalidArgument);
}

// Engines take LARDER_AUTH_TOKEN when no token is configured; the token tests must not see one
// from the environment that runs them.
class EngineAuthTest : public ::testing::Test {
 protected:
  ScopedEnv no_env_token_{"LARDER_AUTH_TOKEN", std::nullopt};
};

TEST_F(EngineAuthTest, WrongOrMissingTokenOverTcpIsPermissionDenied) {
  TransferEngineOptions target_options = WithProtocol("auto");
  target_options.auth_token = "secret";
  Target target = StartTarget(target_options);
  ASSERT_TRUE(target.engine);

  TransferEngineOptions wrong = WithProtocol("tcp");
  wrong.auth_token = "wrong";
  auto wrong_engine = CreateEngine(wrong);
  ASSERT_TRUE(wrong_engine);
  auto listed = wrong_engine->ListPeerSegments(target.engine->address(), seconds(5));
  ASSERT_FALSE(listed.ok());
  EXPECT_EQ(listed.status().code(), StatusCode::kPermissionDenied) << listed.status();

  auto tokenless = CreateEngine(WithProtocol("tcp"));
  ASSERT_TRUE(tokenless);
  listed = tokenless->ListPeerSegments(target.engine->address(), seconds(5));
  ASSERT_FALSE(listed.ok());
  EXPECT_EQ(listed.status().code(), StatusCode::kPermissionDenied) << listed.status();

  // With the descriptor obtained elsewhere, the data path refuses the wrong token too.
  auto handle = wrong_engine->OpenSegment(target.descriptor());
  ASSERT_TRUE(handle.ok()) << handle.status();  // opening tcp does no I/O
  std::vector<uint8_t> buffer(64);
  Status status = TransferOneStatus(wrong_engine.get(),
                                    {TransferOp::kRead, buffer.data(), *handle, 0, buffer.size()});
  EXPECT_EQ(status.code(), StatusCode::kPermissionDenied) << status;

  TransferEngineOptions right = WithProtocol("tcp");
  right.auth_token = "secret";
  auto right_engine = CreateEngine(right);
  ASSERT_TRUE(right_engine);
  listed = right_engine->ListPeerSegments(target.engine->address(), seconds(5));
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].name, "kv");
  auto good = right_engine->OpenSegment(target.engine->address(), "kv");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(right_engine->SegmentRoute(*good).value_or(RouteKind::kNone), RouteKind::kTcp);
  EXPECT_TRUE(RoundTrip(right_engine.get(), *good, target, 0, 256 * 1024, RouteKind::kTcp));
}

TEST_F(EngineAuthTest, TokenFromEnvironmentIsUsed) {
  TransferEngineOptions target_options = WithProtocol("auto");
  target_options.auth_token = "from-env";
  Target target = StartTarget(target_options);
  ASSERT_TRUE(target.engine);
  ScopedEnv env_token("LARDER_AUTH_TOKEN", "from-env");
  auto engine = CreateEngine(WithProtocol("tcp"));
  ASSERT_TRUE(engine);
  auto handle = engine->OpenSegment(target.engine->address(), "kv");
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_TRUE(RoundTrip(engine.get(), *handle, target));
}

TEST_F(EngineAuthTest, WrongTokenOnShmIsPermissionDenied) {
  TransferEngineOptions target_options = WithProtocol("auto");
  target_options.auth_token = "secret";
  Target target = StartTarget(target_options);
  ASSERT_TRUE(target.engine);

  TransferEngineOptions wrong = WithProtocol("shm");
  wrong.auth_token = "wrong";
  auto wrong_engine = CreateEngine(wrong);
  ASSERT_TRUE(wrong_engine);
  auto handle = wrong_engine->OpenSegment(target.descriptor());
  ASSERT_FALSE(handle.ok());
  EXPECT_EQ(handle.status().code(), StatusCode::kPermissionDenied) << handle.status();

  auto tokenless = CreateEngine(WithProtocol("shm"));
  ASSERT_TRUE(tokenless);
  handle = tokenless->OpenSegment(target.descriptor());
  ASSERT_FALSE(handle.ok());
  EXPECT_EQ(handle.status().code(), StatusCode::kPermissionDenied) << handle.status();

  TransferEngineOptions right = WithProtocol("shm");
  right.auth_token = "secret";
  auto right_engine = CreateEngine(right);
  ASSERT_TRUE(right_engine);
  handle = right_engine->OpenSegment(target.descriptor());
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_EQ(right_engine->SegmentRoute(*handle).value_or(RouteKind::kNone),
            RouteKind::kSameHostShm);
  EXPECT_TRUE(RoundTrip(right_engine.get(), *handle, target, 0, 4096, RouteKind::kSameHostShm));
}

TEST(EngineShmPolicyTest, UidNotAllowedIsPermissionDeniedOrFallsBackToTcp) {
  TransferEngineOptions target_options = WithProtocol("auto");
  target_options.shm_allowed_uids = {static_cast<uint32_t>(getuid()) + 12345};
  Target target = StartTarget(target_options);
  ASSERT_TRUE(target.engine);
  ASSERT_EQ(target.memory->kind(), MemoryKind::kMemfd);

  auto shm_only = CreateEngine(WithProtocol("shm"));
  ASSERT_TRUE(shm_only);
  auto refused = shm_only->OpenSegment(target.descriptor());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied) << refused.status();
  EXPECT_NE(refused.status().message().find(std::to_string(getuid())), std::string::npos)
      << refused.status();

  auto automatic = CreateEngine(WithProtocol("auto"));
  ASSERT_TRUE(automatic);
  auto handle = automatic->OpenSegment(target.descriptor());
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_EQ(automatic->SegmentRoute(*handle).value_or(RouteKind::kNone), RouteKind::kTcp);
  EXPECT_TRUE(RoundTrip(automatic.get(), *handle, target, 0, 256 * 1024, RouteKind::kTcp));
}

TEST(EngineShmPolicyTest, CallerOwnedSegmentsAreNotSharedOverShm) {
  std::vector<uint8_t> caller_owned(64 * 1024);  // outlives the engine that serves it
  auto owner = CreateEngine(WithProtocol("auto"));
  ASSERT_TRUE(owner);
  ASSERT_TRUE(owner->RegisterSegment("heap", caller_owned.data(), caller_owned.size()).ok());
  SegmentDescriptor descriptor = owner->ListSegments().at(0);
  EXPECT_EQ(descriptor.memory_kind, MemoryKind::kAnonymous);
  EXPECT_EQ(descriptor.TransportBlob("shm"), nullptr);

  auto peer = CreateEngine(WithProtocol("auto"));
  ASSERT_TRUE(peer);
  auto handle = peer->OpenSegment(descriptor);
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_EQ(peer->SegmentRoute(*handle).value_or(RouteKind::kNone), RouteKind::kTcp);
  std::vector<uint8_t> source(1000);
  FillPattern(source.data(), source.size(), 4);
  Status status = TransferOneStatus(
      peer.get(), {TransferOp::kWrite, source.data(), *handle, 10, source.size()});
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(std::memcmp(caller_owned.data() + 10, source.data(), source.size()), 0);

  auto shm_only = CreateEngine(WithProtocol("shm"));
  ASSERT_TRUE(shm_only);
  EXPECT_EQ(shm_only->OpenSegment(descriptor).status().code(), StatusCode::kNotFound);
}

TEST(EngineDeadPeerTest, TransfersToADeadPeerFailFastAndOthersKeepWorking) {
  auto initiator = CreateEngine(WithProtocol("tcp"));
  ASSERT_TRUE(initiator);
  Target doomed = StartTarget(WithProtocol("auto"));
  ASSERT_TRUE(doomed.engine);
  const std::string doomed_address = doomed.engine->address();
  auto handle = initiator->OpenSegment(doomed_address, "kv");
  ASSERT_TRUE(handle.ok()) << handle.status();
  // Warm up the connections so that the failure hits live sockets as well as new connects.
  std::vector<uint8_t> buffer(256 * 1024);
  std::vector<TransferRequest> warmup;
  for (uint64_t i = 0; i < 4; ++i) {
    warmup.push_back({TransferOp::kRead, buffer.data() + i * 65536, *handle, i * 65536, 65536});
  }
  auto warmed = initiator->TransferSync(warmup, seconds(10));
  ASSERT_TRUE(warmed.ok()) << warmed.status();
  for (const TransferResult& r : *warmed) ASSERT_TRUE(r.status.ok()) << r.status;

  doomed.engine.reset();

  for (int attempt = 0; attempt < 5; ++attempt) {
    SCOPED_TRACE("attempt " + std::to_string(attempt));
    TransferRequest request{TransferOp::kRead, buffer.data(), *handle, 0, 4096};
    auto start = Clock::now();
    auto batch = initiator->Submit({&request, 1}, seconds(2));
    ASSERT_TRUE(batch.ok()) << batch.status();
    Status waited = initiator->Wait(*batch, seconds(10));
    auto elapsed = Clock::now() - start;
    ASSERT_TRUE(waited.ok()) << waited;
    // The deadline bounds the failure; after the first one, backoff makes it immediate.
    EXPECT_LT(elapsed, seconds(3));
    if (attempt > 0) {
      EXPECT_LT(elapsed, milliseconds(500));
    }
    auto results = initiator->Results(*batch);
    ASSERT_TRUE(results.ok()) << results.status();
    const Status& status = (*results)[0].status;
    EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status;
    EXPECT_NE(status.message().find(doomed_address), std::string::npos) << status;
    ASSERT_TRUE(initiator->Release(*batch).ok());
  }

  Target alive = StartTarget(WithProtocol("auto"));
  ASSERT_TRUE(alive.engine);
  auto alive_handle = initiator->OpenSegment(alive.engine->address(), "kv");
  ASSERT_TRUE(alive_handle.ok()) << alive_handle.status();
  EXPECT_TRUE(RoundTrip(initiator.get(), *alive_handle, alive, 0, 128 * 1024, RouteKind::kTcp));
}

// A peer that accepts connections (the kernel does, from the backlog) but never says hello: the
// engine's deadlines are the only thing that ends requests to it.
class SilentPeerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto listener = TcpListen({"127.0.0.1", 0});
    ASSERT_TRUE(listener.ok()) << listener.status();
    listener_ = std::move(listener).value();
    uint16_t port = BoundPort(listener_.get()).value_or(0);
    descriptor_.segment_id = 1;
    descriptor_.name = "silent";
    descriptor_.epoch = 1;
    descriptor_.engine_id = "elsewhere/1/0";
    descriptor_.host_id = "elsewhere";
    descriptor_.address = "127.0.0.1:" + std::to_string(port);
    descriptor_.transports["tcp"] = descriptor_.address;
    descriptor_.size = kEngineTestSegmentBytes;
    engine_ = CreateEngine(WithProtocol("auto"));
    ASSERT_TRUE(engine_);
    auto handle = engine_->OpenSegment(descriptor_);
    ASSERT_TRUE(handle.ok()) << handle.status();
    handle_ = *handle;
    ASSERT_EQ(engine_->SegmentRoute(handle_).value_or(RouteKind::kNone), RouteKind::kTcp);
  }

  Fd listener_;
  SegmentDescriptor descriptor_;
  std::unique_ptr<TransferEngine> engine_;
  SegmentHandle handle_ = 0;
  std::vector<uint8_t> buffer_ = std::vector<uint8_t>(4096);
};

TEST_F(SilentPeerTest, RequestFailsWithDeadlineExceededAtItsDeadline) {
  TransferRequest request{TransferOp::kRead, buffer_.data(), handle_, 0, buffer_.size()};
  auto start = Clock::now();
  auto batch = engine_->Submit({&request, 1}, milliseconds(400));
  ASSERT_TRUE(batch.ok()) << batch.status();

  // Still running: Wait times out, and the batch cannot be read or freed yet.
  Status early = engine_->Wait(*batch, milliseconds(50));
  EXPECT_EQ(early.code(), StatusCode::kDeadlineExceeded) << early;
  EXPECT_FALSE(engine_->Poll(*batch).value_or(true));
  EXPECT_EQ(engine_->Results(*batch).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine_->BatchStatus(*batch).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine_->Release(*batch).code(), StatusCode::kFailedPrecondition);

  ASSERT_TRUE(engine_->Wait(*batch, seconds(10)).ok());
  auto elapsed = Clock::now() - start;
  EXPECT_GE(elapsed, milliseconds(350));
  EXPECT_LT(elapsed, seconds(3));
  auto results = engine_->Results(*batch);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ((*results)[0].status.code(), StatusCode::kDeadlineExceeded) << (*results)[0].status;
  EXPECT_EQ((*results)[0].bytes, 0u);
  ASSERT_TRUE(engine_->Release(*batch).ok());
}

TEST_F(SilentPeerTest, TransferSyncReturnsByTheDeadline) {
  TransferRequest request{TransferOp::kWrite, buffer_.data(), handle_, 0, buffer_.size()};
  auto start = Clock::now();
  auto results = engine_->TransferSync({&request, 1}, milliseconds(300));
  EXPECT_LT(Clock::now() - start, seconds(3));
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ((*results)[0].status.code(), StatusCode::kDeadlineExceeded) << (*results)[0].status;
}

TEST_F(SilentPeerTest, DestroyingTheEngineWithARunningBatchDoesNotHang) {
  TransferRequest request{TransferOp::kRead, buffer_.data(), handle_, 0, buffer_.size()};
  auto batch = engine_->Submit({&request, 1}, seconds(1));
  ASSERT_TRUE(batch.ok()) << batch.status();
  auto start = Clock::now();
  engine_.reset();
  EXPECT_LT(Clock::now() - start, seconds(5));
}

}  // namespace
}  // namespace larder
