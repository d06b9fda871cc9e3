// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Retry and fallback, driven by a FaultTransport around the real shm transport: retryable slice
// failures move to the next route (tcp), others fail the request at once, and a request with no
// route left fails with the injected error.
#include "transfer/testing/fault_transport.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "larder/transfer_engine.h"
#include "transfer/engine_internal.h"
#include "transfer/testing/test_util.h"

namespace larder::transfer {
namespace {

using std::chrono::seconds;
using testutil::FillPattern;

constexpr uint64_t kKiB = 1ULL << 10;
constexpr uint64_t kMiB = 1ULL << 20;
constexpr uint64_t kSliceBytes = 64 * kKiB;

// An initiator whose first route is shm wrapped in a FaultTransport, optionally followed by tcp.
struct FaultyInitiator {
  std::unique_ptr<TransferEngine> engine;
  FaultTransport* fault = nullptr;  // owned by `engine`
};

FaultyInitiator CreateFaultyInitiator(FaultPlan plan, bool tcp_fallback,
                                      TransferEngineOptions options = {}) {
  FaultyInitiator out;
  auto shm = CreateTransports({RouteKind::kSameHostShm});
  EXPECT_TRUE(shm.ok()) << shm.status();
  if (!shm.ok()) return out;
  auto fault = std::make_unique<FaultTransport>(std::move((*shm)[0]), std::move(plan));
  out.fault = fault.get();
  std::vector<std::unique_ptr<Transport>> transports;
  transports.push_back(std::move(fault));
  if (tcp_fallback) {
    auto tcp = CreateTransports({RouteKind::kTcp});
    EXPECT_TRUE(tcp.ok()) << tcp.status();
    if (!tcp.ok()) return out;
    transports.push_back(std::move((*tcp)[0]));
  }
  if (options.slice_bytes == TransferEngineOptions{}.slice_bytes) options.slice_bytes = kSliceBytes;
  auto engine = CreateEngineWithTransports(options, std::move(transports));
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (engine.ok()) out.engine = std::move(engine).value();
  return out;
}

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TransferEngineOptions options;
    options.protocol = "auto";
    auto target = TransferEngine::Create(options);
    ASSERT_TRUE(target.ok()) << target.status();
    target_ = std::move(target).value();
    auto memory = target_->AllocateSegmentMemory(8 * kMiB);
    ASSERT_TRUE(memory.ok()) << memory.status();
    memory_ = std::move(memory).value();
    ASSERT_EQ(memory_->kind(), MemoryKind::kMemfd);
    ASSERT_TRUE(target_->RegisterSegment("kv", memory_).ok());
  }

  // Opens the target's segment from `initiator` and checks the route it picked.
  SegmentHandle Open(const FaultyInitiator& initiator, RouteKind expected_route) {
    auto handle = initiator.engine->OpenSegment(target_->ListSegments().at(0));
    EXPECT_TRUE(handle.ok()) << handle.status();
    if (!handle.ok()) return 0;
    EXPECT_EQ(initiator.engine->SegmentRoute(*handle).value_or(RouteKind::kNone), expected_route);
    return *handle;
  }

  uint8_t* SegmentBytes() const { return static_cast<uint8_t*>(memory_->data()); }

  std::unique_ptr<TransferEngine> target_;
  std::shared_ptr<MemoryRegion> memory_;
};

std::vector<TransferResult> TransferOrFail(TransferEngine* engine,
                                           std::span<const TransferRequest> requests) {
  auto results = engine->TransferSync(requests, seconds(20));
  EXPECT_TRUE(results.ok()) << results.status();
  return results.ok() ? std::move(results).value() : std::vector<TransferResult>(requests.size());
}

TEST_F(FaultTest, FirstFailedSlicesAreRetriedOnTcp) {
  FaultPlan plan;
  plan.fail_first_slices = 4;
  FaultyInitiator initiator = CreateFaultyInitiator(plan, /*tcp_fallback=*/true);
  ASSERT_TRUE(initiator.engine);
  SegmentHandle handle = Open(initiator, RouteKind::kSameHostShm);

  // Four slices, every one of them failed on shm: the request completes entirely over tcp.
  std::vector<uint8_t> source(4 * kSliceBytes);
  FillPattern(source.data(), source.size(), 1);
  TransferRequest write{TransferOp::kWrite, source.data(), handle, 4096, source.size()};
  std::vector<TransferResult> results = TransferOrFail(initiator.engine.get(), {&write, 1});
  ASSERT_TRUE(results[0].status.ok()) << results[0].status;
  EXPECT_EQ(results[0].bytes, source.size());
  EXPECT_EQ(results[0].route, RouteKind::kTcp);
  EXPECT_EQ(std::memcmp(SegmentBytes() + 4096, source.data(), source.size()), 0);
  EXPECT_EQ(initiator.fault->failed_slices(), 4u);
  EXPECT_EQ(initiator.fault->forwarded_slices(), 0u);

  // The plan is spent: the next request stays on shm.
  std::vector<uint8_t> destination(source.size(), 0);
  TransferRequest read{TransferOp::kRead, destination.data(), handle, 4096, destination.size()};
  results = TransferOrFail(initiator.engine.get(), {&read, 1});
  ASSERT_TRUE(results[0].status.ok()) << results[0].status;
  EXPECT_EQ(results[0].route, RouteKind::kSameHostShm);
  EXPECT_EQ(destination, source);
  EXPECT_EQ(initiator.fault->failed_slices(), 4u);
  EXPECT_EQ(initiator.fault->forwarded_slices(), 4u);
}

TEST_F(FaultTest, PartlyFailedRequestIsReassembledFromBothRoutes) {
  FaultPlan plan;
  plan.fail_first_slices = 3;
  FaultyInitiator initiator = CreateFaultyInitiator(plan, /*tcp_fallback=*/true);
  ASSERT_TRUE(initiator.engine);
  SegmentHandle handle = Open(initiator, RouteKind::kSameHostShm);

  // 17 slices: the first three travel over tcp, the rest over shm; the bytes must still line up.
  constexpr uint64_t kLength = 16 * kSliceBytes + 5;
  FillPattern(SegmentBytes() + 777, kLength, 2);
  std::vector<uint8_t> destination(kLength, 0xee);
  TransferRequest read{TransferOp::kRead, destination.data(), handle, 777, kLength};
  std::vector<TransferResult> results = TransferOrFail(initiator.engine.get(), {&read, 1});
  ASSERT_TRUE(results[0].status.ok()) << results[0].status;
  EXPECT_EQ(results[0].bytes, kLength);
  EXPECT_TRUE(results[0].route == RouteKind::kTcp || results[0].route == RouteKind::kSameHostShm)
      << RouteKindName(results[0].route);
  EXPECT_EQ(std::memcmp(destination.data(), SegmentBytes() + 777, kLength), 0);
  EXPECT_EQ(initiator.fault->failed_slices(), 3u);
  EXPECT_EQ(initiator.fault->forwarded_slices(), 14u);
}

TEST_F(FaultTest, EveryNthFailedSliceIsRetriedOnTcp) {
  FaultPlan plan;
  plan.fail_every_nth_slice = 3;
  FaultyInitiator initiator = CreateFaultyInitiator(plan, /*tcp_fallback=*/true);
  ASSERT_TRUE(initiator.engine);
  SegmentHandle handle = Open(initiator, RouteKind::kSameHostShm);

  // Single-slice requests, so each request's route says exactly where its one slice went:
  // requests 2, 5, 8, 11 (ordinals 3, 6, 9, 12) are failed on shm and must arrive over tcp.
  constexpr size_t kRequests = 12;
  constexpr uint64_t kLength = 32 * kKiB;
  std::vector<std::vector<uint8_t>> sources(kRequests);
  std::vector<TransferRequest> requests;
  for (size_t i = 0; i < kRequests; ++i) {
    sources[i].resize(kLength);
    FillPattern(sources[i].data(), kLength, 100 + i);
    requests.push_back({TransferOp::kWrite, sources[i].data(), handle, i * 100 * kKiB, kLength});
  }
  std::vector<TransferResult> results = TransferOrFail(initiator.engine.get(), requests);
  for (size_t i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << "request " << i << ": " << results[i].status;
    EXPECT_EQ(results[i].route, (i + 1) % 3 == 0 ? RouteKind::kTcp : RouteKind::kSameHostShm)
        << "request " << i << " went over " << RouteKindName(results[i].route);
    EXPECT_EQ(std::memcmp(SegmentBytes() + i * 100 * kKiB, sources[i].data(), kLength), 0)
        << "request " << i;
  }
  EXPECT_EQ(initiator.fault->failed_slices(), 4u);
  EXPECT_EQ(initiator.fault->forwarded_slices(), 8u);

  // A many-slice request under the same plan (ordinals 13..29: five failures) still arrives whole.
  constexpr uint64_t kLong = 16 * kSliceBytes + 5;
  std::vector<uint8_t> source(kLong);
  FillPattern(source.data(), kLong, 7);
  TransferRequest write{TransferOp::kWrite, source.data(), handle, 2 * kMiB + 1, kLong};
  results = TransferOrFail(initiator.engine.get(), {&write, 1});
  ASSERT_TRUE(results[0].status.ok()) << results[0].status;
  EXPECT_EQ(results[0].bytes, kLong);
  EXPECT_EQ(std::memcmp(SegmentBytes() + 2 * kMiB + 1, source.data(), kLong), 0);
  EXPECT_EQ(initiator.fault->failed_slices(), 9u);
  EXPECT_EQ(initiator.fault->forwarded_slices(), 20u);
}

TEST_F(FaultTest, NonRetryableErrorFailsWithoutRetry) {
  FaultPlan plan;
  plan.fail_first_slices = 1;
  plan.slice_error = OutOfRangeError("injected range failure");
  FaultyInitiator initiator = CreateFaultyInitiator(plan, /*tcp_fallback=*/true);
  ASSERT_TRUE(initiator.engine);
  SegmentHandle handle = Open(initiator, RouteKind::kSameHostShm);

  std::vector<uint8_t> source(1000, 0xab);
  TransferRequest write{TransferOp::kWrite, source.data(), handle, 0, source.size()};
  std::vector<TransferResult> results = TransferOrFail(initiator.engine.get(), {&write, 1});
  EXPECT_EQ(results[0].status.code(), StatusCode::kOutOfRange) << results[0].status;
  EXPECT_NE(results[0].status.message().find("injected range failure"), std::string::npos);
  EXPECT_NE(results[0].status.message().find("via shm"), std::string::npos) << results[0].status;
  EXPECT_EQ(results[0].bytes, 0u);
  // Had the slice been retried on tcp, the bytes would be in the segment now.
  EXPECT_EQ(SegmentBytes()[0], 0);
  EXPECT_EQ(SegmentBytes()[999], 0);
  EXPECT_EQ(initiator.fault->failed_slices(), 1u);
  EXPECT_EQ(initiator.fault->forwarded_slices(), 0u);

  results = TransferOrFail(initiator.engine.get(), {&write, 1});
  ASSERT_TRUE(results[0].status.ok()) << results[0].status;
  EXPECT_EQ(results[0].route, RouteKind::kSameHostShm);
  EXPECT_EQ(SegmentBytes()[999], 0xab);
}

TEST_F(FaultTest, NoFallbackRouteFailsUnavailable) {
  FaultPlan plan;
  plan.fail_first_slices = 1;
  FaultyInitiator initiator = CreateFaultyInitiator(plan, /*tcp_fallback=*/false);
  ASSERT_TRUE(initiator.engine);
  SegmentHandle handle = Open(initiator, RouteKind::kSameHostShm);

  std::vector<uint8_t> source(1000, 0xcd);
  TransferRequest write{TransferOp::kWrite, source.data(), handle, 0, source.size()};
  std::vector<TransferResult> results = TransferOrFail(initiator.engine.get(), {&write, 1});
  EXPECT_EQ(results[0].status.code(), StatusCode::kUnavailable) << results[0].status;
  EXPECT_NE(results[0].status.message().find("injected slice failure"), std::string::npos);
  EXPECT_EQ(results[0].bytes, 0u);
  EXPECT_EQ(SegmentBytes()[0], 0);
  EXPECT_EQ(initiator.fault->failed_slices(), 1u);

  // One failed request does not poison the route.
  results = TransferOrFail(initiator.engine.get(), {&write, 1});
  ASSERT_TRUE(results[0].status.ok()) << results[0].status;
  EXPECT_EQ(SegmentBytes()[0], 0xcd);
  EXPECT_EQ(initiator.fault->forwarded_slices(), 1u);
}

TEST_F(FaultTest, FailureOfOneRequestLeavesTheOthersOfTheBatchAlone) {
  FaultPlan plan;
  plan.fail_every_nth_slice = 2;
  FaultyInitiator initiator = CreateFaultyInitiator(plan, /*tcp_fallback=*/false);
  ASSERT_TRUE(initiator.engine);
  SegmentHandle handle = Open(initiator, RouteKind::kSameHostShm);

  std::vector<uint8_t> a(100, 1), b(100, 2), c(100, 3);
  TransferRequest requests[] = {{TransferOp::kWrite, a.data(), handle, 0, 100},
                                {TransferOp::kWrite, b.data(), handle, 1000, 100},
                                {TransferOp::kWrite, c.data(), handle, 2000, 100}};
  std::vector<TransferResult> results = TransferOrFail(initiator.engine.get(), requests);
  EXPECT_TRUE(results[0].status.ok()) << results[0].status;
  EXPECT_EQ(results[1].status.code(), StatusCode::kUnavailable) << results[1].status;
  EXPECT_NE(results[1].status.message().find("request 1"), std::string::npos);
  EXPECT_TRUE(results[2].status.ok()) << results[2].status;
  EXPECT_EQ(SegmentBytes()[0], 1);
  EXPECT_EQ(SegmentBytes()[1000], 0);
  EXPECT_EQ(SegmentBytes()[2000], 3);
}

TEST_F(FaultTest, OpenErrorOnShmPicksTcp) {
  FaultPlan plan;
  plan.open_error = UnavailableError("injected open failure");
  FaultyInitiator initiator = CreateFaultyInitiator(plan, /*tcp_fallback=*/true);
  ASSERT_TRUE(initiator.engine);
  SegmentHandle handle = Open(initiator, RouteKind::kTcp);

  std::vector<uint8_t> source(200 * kKiB);
  FillPattern(source.data(), source.size(), 3);
  TransferRequest write{TransferOp::kWrite, source.data(), handle, 64, source.size()};
  std::vector<TransferResult> results = TransferOrFail(initiator.engine.get(), {&write, 1});
  ASSERT_TRUE(results[0].status.ok()) << results[0].status;
  EXPECT_EQ(results[0].route, RouteKind::kTcp);
  EXPECT_EQ(std::memcmp(SegmentBytes() + 64, source.data(), source.size()), 0);
  EXPECT_EQ(initiator.fault->forwarded_slices(), 0u);
  EXPECT_EQ(initiator.fault->failed_slices(), 0u);
}

TEST_F(FaultTest, OpenErrorWithoutFallbackIsReturned) {
  FaultPlan plan;
  plan.open_error = UnavailableError("injected open failure");
  FaultyInitiator initiator = CreateFaultyInitiator(plan, /*tcp_fallback=*/false);
  ASSERT_TRUE(initiator.engine);
  auto handle = initiator.engine->OpenSegment(target_->ListSegments().at(0));
  ASSERT_FALSE(handle.ok());
  EXPECT_EQ(handle.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(handle.status().message().find("injected open failure"), std::string::npos);
}

TEST_F(FaultTest, TransportThatNeedsRegistrationRefusesUnregisteredBuffers) {
  FaultPlan plan;
  plan.needs_local_registration = true;
  FaultyInitiator initiator = CreateFaultyInitiator(plan, /*tcp_fallback=*/true);
  ASSERT_TRUE(initiator.engine);
  SegmentHandle handle = Open(initiator, RouteKind::kSameHostShm);

  std::vector<uint8_t> buffer(8 * kKiB);
  FillPattern(SegmentBytes(), buffer.size(), 11);
  TransferRequest read{TransferOp::kRead, buffer.data(), handle, 0, buffer.size()};
  std::vector<TransferResult> results = TransferOrFail(initiator.engine.get(), {&read, 1});
  EXPECT_EQ(results[0].status.code(), StatusCode::kFailedPrecondition) << results[0].status;
  EXPECT_EQ(initiator.fault->forwarded_slices(), 0u);

  ASSERT_TRUE(initiator.engine->RegisterLocalMemory(buffer.data(), buffer.size()).ok());
  results = TransferOrFail(initiator.engine.get(), {&read, 1});
  ASSERT_TRUE(results[0].status.ok()) << results[0].status;
  EXPECT_EQ(results[0].route, RouteKind::kSameHostShm);
  EXPECT_EQ(std::memcmp(buffer.data(), SegmentBytes(), buffer.size()), 0);
  EXPECT_EQ(initiator.fault->forwarded_slices(), 1u);
  ASSERT_TRUE(initiator.engine->UnregisterLocalMemory(buffer.data()).ok());
}

}  // namespace
}  // namespace larder::transfer
