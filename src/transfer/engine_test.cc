// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The engine's contract beyond moving bytes: every malformed request gets its own clear Status and
// leaves the engine serving; creation, registration and route selection by protocol and host
// identity. Peers and trust: engine_peer_test.cc; protocol settings: engine_protocol_test.cc.
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

using std::chrono::seconds;
using namespace testutil;  // the engine tests' fixture (testing/engine_fixture.h)

// the same for every route.
class EngineValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    target_ = StartTarget(WithProtocol("auto"));
    ASSERT_TRUE(target_.engine);
    auto handle = engine()->OpenSegment(target_.descriptor());
    ASSERT_TRUE(handle.ok()) << handle.status();
    handle_ = *handle;
    ASSERT_TRUE(RoundTrip(engine(), handle_, target_));
  }

  TransferEngine* engine() { return target_.engine.get(); }

  Target target_;
  SegmentHandle handle_ = 0;
  std::vector<uint8_t> buffer_ = std::vector<uint8_t>(64 * 1024);
};

TEST_F(EngineValidationTest, UnknownSegmentHandleIsNotFound) {
  Status status =
      TransferOneStatus(engine(), {TransferOp::kRead, buffer_.data(), handle_ + 100, 0, 8});
  EXPECT_EQ(status.code(), StatusCode::kNotFound) << status;
  EXPECT_NE(status.message().find(std::to_string(handle_ + 100)), std::string::npos) << status;
  EXPECT_TRUE(RoundTrip(engine(), handle_, target_));
}

TEST_F(EngineValidationTest, ZeroLengthIsInvalidArgument) {
  for (TransferOp op : {TransferOp::kRead, TransferOp::kWrite}) {
    Status status = TransferOneStatus(engine(), {op, buffer_.data(), handle_, 0, 0});
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status;
  }
  EXPECT_TRUE(RoundTrip(engine(), handle_, target_));
}

TEST_F(EngineValidationTest, RangesOutsideTheSegmentAreOutOfRange) {
  const uint64_t size = target_.memory->size();
  struct Case {
    uint64_t offset;
    uint64_t length;
  };
  const Case cases[] = {
      {size, 1},            // starts at the end
      {size + 4096, 8},     // starts beyond the end
      {size - 8, 9},        // ends one byte past the end
      {0, size + 1},        // longer than the segment
      {UINT64_MAX - 3, 8},  // offset + length wraps around
      {UINT64_MAX, 1},      // the largest offset
      {8, UINT64_MAX - 4},  // a wrapping length
  };
  for (const Case& c : cases) {
    // The local buffer is never touched: the range is refused before any copy.
    Status status = TransferOneStatus(
        engine(), {TransferOp::kWrite, buffer_.data(), handle_, c.offset, c.length});
    EXPECT_EQ(status.code(), StatusCode::kOutOfRange)
        << "offset " << c.offset << " length " << c.length << ": " << status;
    EXPECT_TRUE(RoundTrip(engine(), handle_, target_));
  }
}

TEST_F(EngineValidationTest, NullLocalBufferIsInvalidArgument) {
  Status status = TransferOneStatus(engine(), {TransferOp::kRead, nullptr, handle_, 0, 8});
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(RoundTrip(engine(), handle_, target_));
}

TEST_F(EngineValidationTest, LocalBufferThatWrapsTheAddressSpaceIsInvalidArgument) {
  // Never dereferenced: the request is refused before any copy.
  void* near_the_top = reinterpret_cast<void*>(UINTPTR_MAX - 10);
  Status status = TransferOneStatus(engine(), {TransferOp::kRead, near_the_top, handle_, 0, 100});
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(RoundTrip(engine(), handle_, target_));
}

TEST_F(EngineValidationTest, UnknownOpIsInvalidArgument) {
  TransferRequest request{static_cast<TransferOp>(7), buffer_.data(), handle_, 0, 8};
  Status status = TransferOneStatus(engine(), request);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(RoundTrip(engine(), handle_, target_));
}

TEST_F(EngineValidationTest, EmptyBatchIsRefused) {
  auto batch = engine()->Submit({});
  ASSERT_FALSE(batch.ok());
  EXPECT_EQ(batch.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(RoundTrip(engine(), handle_, target_));
}

TEST(EngineBatchLimitTest, BatchLargerThanMaxBatchRequestsIsRefused) {
  TransferEngineOptions options = WithProtocol("auto");
  options.max_batch_requests = 4;
  Target target = StartTarget(options);
  ASSERT_TRUE(target.engine);
  auto handle = target.engine->OpenSegment(target.descriptor());
  ASSERT_TRUE(handle.ok()) << handle.status();
  std::vector<uint8_t> buffer(5 * 16);
  std::vector<TransferRequest> requests;
  for (uint64_t i = 0; i < 5; ++i) {
    requests.push_back({TransferOp::kRead, buffer.data() + i * 16, *handle, i * 16, 16});
  }
  auto too_many = target.engine->Submit(requests);
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.status().message().find("max_batch_requests"), std::string::npos);

  // Exactly the limit is fine.
  requests.pop_back();
  auto at_limit = target.engine->TransferSync(requests);
  ASSERT_TRUE(at_limit.ok()) << at_limit.status();
  for (const TransferResult& r : *at_limit) EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_TRUE(RoundTrip(target.engine.get(), *handle, target));
}

TEST_F(EngineValidationTest, MixedBatchFailsOnlyTheBadRequests) {
  std::vector<uint8_t> good0(1000), good2(2000), good4(3000), scratch(64);
  FillPattern(good0.data(), good0.size(), 1);
  FillPattern(good2.data(), good2.size(), 2);
  FillPattern(good4.data(), good4.size(), 3);
  const uint64_t size = target_.memory->size();
  std::vector<TransferRequest> requests = {
      {TransferOp::kWrite, good0.data(), handle_, 0, good0.size()},
      {TransferOp::kWrite, scratch.data(), handle_, size, 1},  // out of range
      {TransferOp::kWrite, good2.data(), handle_, 10000, good2.size()},
      {TransferOp::kWrite, scratch.data(), handle_ + 1000, 0, 8},  // unknown segment
      {TransferOp::kWrite, good4.data(), handle_, 20000, good4.size()},
      {TransferOp::kWrite, nullptr, handle_, 0, 8},         // null buffer
      {TransferOp::kWrite, scratch.data(), handle_, 0, 0},  // empty
  };
  auto batch = engine()->Submit(requests, seconds(10));
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_TRUE(engine()->Wait(*batch, seconds(10)).ok());
  auto results = engine()->Results(*batch);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), requests.size());
  const StatusCode expected[] = {StatusCode::kOk,
                                 StatusCode::kOutOfRange,
                                 StatusCode::kOk,
                                 StatusCode::kNotFound,
                                 StatusCode::kOk,
                                 StatusCode::kInvalidArgument,
                                 StatusCode::kInvalidArgument};
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ((*results)[i].status.code(), expected[i])
        << "request " << i << ": " << (*results)[i].status;
    EXPECT_EQ((*results)[i].bytes, expected[i] == StatusCode::kOk ? requests[i].length : 0)
        << "request " << i;
    if (expected[i] != StatusCode::kOk) {
      // Each error names its request, so a caller can tell which one of a large batch failed.
      EXPECT_NE((*results)[i].status.message().find("request " + std::to_string(i)),
                std::string::npos)
          << (*results)[i].status;
    }
  }
  // The batch status is the first failure.
  Status batch_status = engine()->BatchStatus(*batch);
  EXPECT_EQ(batch_status.code(), StatusCode::kOutOfRange) << batch_status;
  EXPECT_NE(batch_status.message().find("request 1"), std::string::npos) << batch_status;
  ASSERT_TRUE(engine()->Release(*batch).ok());

  EXPECT_EQ(std::memcmp(target_.bytes(), good0.data(), good0.size()), 0);
  EXPECT_EQ(std::memcmp(target_.bytes() + 10000, good2.data(), good2.size()), 0);
  EXPECT_EQ(std::memcmp(target_.bytes() + 20000, good4.data(), good4.size()), 0);
  EXPECT_TRUE(RoundTrip(engine(), handle_, target_, 100000));
}

TEST_F(EngineValidationTest, BatchOfOnlyBadRequestsCompletesAtOnce) {
  TransferRequest bad[] = {{TransferOp::kRead, nullptr, handle_, 0, 8},
                           {TransferOp::kRead, buffer_.data(), handle_ + 7, 0, 8}};
  auto batch = engine()->Submit(bad);
  ASSERT_TRUE(batch.ok()) << batch.status();
  auto polled = engine()->Poll(*batch);
  ASSERT_TRUE(polled.ok());
  EXPECT_TRUE(*polled);
  EXPECT_EQ(engine()->BatchStatus(*batch).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(engine()->Release(*batch).ok());
  EXPECT_TRUE(RoundTrip(engine(), handle_, target_));
}

TEST(EngineRegistrationTest, RequireLocalRegistration) {
  TransferEngineOptions options = WithProtocol("auto");
  options.require_local_registration = true;
  Target target = StartTarget(options);
  ASSERT_TRUE(target.engine);
  TransferEngine* engine = target.engine.get();
  auto handle = engine->OpenSegment(target.descriptor());
  ASSERT_TRUE(handle.ok()) << handle.status();

  std::vector<uint8_t> unregistered(4096), registered(64 * 1024);
  Status status =
      TransferOneStatus(engine, {TransferOp::kRead, unregistered.data(), *handle, 0, 4096});
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition) << status;

  ASSERT_TRUE(engine->RegisterLocalMemory(registered.data(), registered.size()).ok());
  FillPattern(target.bytes(), registered.size(), 9);
  status = TransferOneStatus(engine,
                             {TransferOp::kRead, registered.data(), *handle, 0, registered.size()});
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(std::memcmp(registered.data(), target.bytes(), registered.size()), 0);
  // Inside the registration but not at its start is fine too.
  status = TransferOneStatus(engine, {TransferOp::kWrite, registered.data() + 100, *handle, 0, 50});
  EXPECT_TRUE(status.ok()) << status;
  // A range that runs past the registration's end is not covered.
  status = TransferOneStatus(
      engine, {TransferOp::kRead, registered.data() + 100, *handle, 0, registered.size()});
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition) << status;

  ASSERT_TRUE(engine->UnregisterLocalMemory(registered.data()).ok());
  status = TransferOneStatus(engine, {TransferOp::kRead, registered.data(), *handle, 0, 8});
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition) << status;
}

TEST_F(EngineValidationTest, OverlappingLocalRegistrationIsAlreadyExists) {
  std::vector<uint8_t> memory(3 * 4096);
  uint8_t* base = memory.data();
  ASSERT_TRUE(engine()->RegisterLocalMemory(base + 4096, 4096).ok());
  EXPECT_EQ(engine()->RegisterLocalMemory(base + 4096, 4096).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(engine()->RegisterLocalMemory(base, 4097).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(engine()->RegisterLocalMemory(base + 8191, 2).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(engine()->RegisterLocalMemory(base, 3 * 4096).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(engine()->RegisterLocalMemory(base + 5000, 10).code(), StatusCode::kAlreadyExists);
  // Adjacent ranges do not overlap.
  EXPECT_TRUE(engine()->RegisterLocalMemory(base, 4096).ok());
  EXPECT_TRUE(engine()->RegisterLocalMemory(base + 8192, 4096).ok());
  EXPECT_EQ(engine()->RegisterLocalMemory(nullptr, 16).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine()->RegisterLocalMemory(base, 0).code(), StatusCode::kInvalidArgument);
  for (uint8_t* start : {base, base + 4096, base + 8192}) {
    EXPECT_TRUE(engine()->UnregisterLocalMemory(start).ok());
  }
  EXPECT_TRUE(RoundTrip(engine(), handle_, target_));
}

TEST_F(EngineValidationTest, UnregisterUnknownLocalMemoryIsNotFound) {
  std::vector<uint8_t> memory(4096);
  EXPECT_EQ(engine()->UnregisterLocalMemory(memory.data()).code(), StatusCode::kNotFound);
  ASSERT_TRUE(engine()->RegisterLocalMemory(memory.data(), memory.size()).ok());
  // Only the start of a registration identifies it.
  EXPECT_EQ(engine()->UnregisterLocalMemory(memory.data() + 1).code(), StatusCode::kNotFound);
  EXPECT_TRUE(engine()->UnregisterLocalMemory(memory.data()).ok());
  EXPECT_EQ(engine()->UnregisterLocalMemory(memory.data()).code(), StatusCode::kNotFound);
  EXPECT_TRUE(RoundTrip(engine(), handle_, target_));
}

TEST_F(EngineValidationTest, DuplicateSegmentNameIsAlreadyExists) {
  auto memory = engine()->AllocateSegmentMemory(4096);
  ASSERT_TRUE(memory.ok()) << memory.status();
  auto duplicate = engine()->RegisterSegment("kv", *memory);
  ASSERT_FALSE(duplicate.ok());
  EXPECT_EQ(duplicate.status().code(), StatusCode::kAlreadyExists);
  std::vector<uint8_t> caller_owned(4096);
  auto duplicate_raw = engine()->RegisterSegment("kv", caller_owned.data(), caller_owned.size());
  EXPECT_EQ(duplicate_raw.status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(engine()->ListSegments().size(), 1u);

  auto other = engine()->RegisterSegment("kv2", *memory);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE(*other, target_.id);
  EXPECT_EQ(engine()->ListSegments().size(), 2u);
  EXPECT_TRUE(RoundTrip(engine(), handle_, target_));
}

TEST_F(EngineValidationTest, BadSegmentRegistrationsAreInvalidArgument) {
  EXPECT_EQ(engine()->AllocateSegmentMemory(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine()->RegisterSegment("none", nullptr).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(engine()->RegisterSegment("null", nullptr, 10).status().code(),
            StatusCode::kInvalidArgument);
  std::vector<uint8_t> memory(16);
  EXPECT_EQ(engine()->RegisterSegment("empty", memory.data(), 0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(engine()->RegisterSegment("", memory.data(), memory.size()).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(RoundTrip(engine(), handle_, target_));
}

TEST_F(EngineValidationTest, UnregisterUnknownSegmentIsNotFound) {
  EXPECT_EQ(engine()->UnregisterSegment(target_.id + 1000).code(), StatusCode::kNotFound);
  EXPECT_TRUE(RoundTrip(engine(), handle_, target_));
}

TEST_F(EngineValidationTest, UnregisteredSegmentStopsServingAndItsIdIsNotReused) {
  auto memory = engine()->AllocateSegmentMemory(8192);
  ASSERT_TRUE(memory.ok());
  auto id = engine()->RegisterSegment("temporary", *memory);
  ASSERT_TRUE(id.ok());
  SegmentDescriptor descriptor;
  for (const auto& d : engine()->ListSegments()) {
    if (d.name == "temporary") descriptor = d;
  }
  auto handle = engine()->OpenSegment(descriptor);
  ASSERT_TRUE(handle.ok()) << handle.status();
  ASSERT_TRUE(engine()->UnregisterSegment(*id).ok());
  EXPECT_EQ(engine()->UnregisterSegment(*id).code(), StatusCode::kNotFound);
  Status status = TransferOneStatus(engine(), {TransferOp::kRead, buffer_.data(), *handle, 0, 8});
  EXPECT_EQ(status.code(), StatusCode::kNotFound) << status;

  auto again = engine()->RegisterSegment("temporary", *memory);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(*again, *id);
  EXPECT_TRUE(RoundTrip(engine(), handle_, target_));
}

TEST_F(EngineValidationTest, OpenMissingSegmentByNameListsTheAvailableOnes) {
  auto memory = engine()->AllocateSegmentMemory(4096);
  ASSERT_TRUE(memory.ok());
  ASSERT_TRUE(engine()->RegisterSegment("weights", *memory).ok());
  auto missing = engine()->OpenSegment(engine()->address(), "missing");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  const std::string& message = missing.status().message();
  EXPECT_NE(message.find("missing"), std::string::npos) << message;
  EXPECT_NE(message.find("kv"), std::string::npos) << message;
  EXPECT_NE(message.find("weights"), std::string::npos) << message;

  auto found = engine()->OpenSegment(engine()->address(), "kv");
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_TRUE(RoundTrip(engine(), *found, target_));
}

TEST(EngineCreateTest, BadOptionsAreInvalidArgument) {
  EXPECT_EQ(TransferEngine::Create(WithProtocol("bogus")).status().code(),
            StatusCode::kInvalidArgument);
  TransferEngineOptions bad_address = WithProtocol("tcp");
  bad_address.listen_address = "nowhere";
  EXPECT_EQ(TransferEngine::Create(bad_address).status().code(), StatusCode::kInvalidArgument);
  TransferEngineOptions zero_slices = WithProtocol("tcp");
  zero_slices.slice_bytes = 0;
  EXPECT_EQ(TransferEngine::Create(zero_slices).status().code(), StatusCode::kInvalidArgument);
}

TEST(EngineCreateTest, ListenAddressInUseFails) {
  auto first = CreateEngine(WithProtocol("tcp"));
  ASSERT_TRUE(first);
  TransferEngineOptions options = WithProtocol("tcp");
  options.listen_address = first->address();
  auto second = TransferEngine::Create(options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists) << second.status();
  EXPECT_NE(second.status().message().find(first->address()), std::string::npos) << second.status();
}

TEST(EngineCreateTest, IdentityAndAddress) {
  TransferEngineOptions options = WithProtocol("auto");
  options.host_id = "host-under-test";
  auto engine = CreateEngine(options);
  ASSERT_TRUE(engine);
  EXPECT_EQ(engine->host_id(), "host-under-test");
  EXPECT_EQ(engine->id().rfind("host-under-test/" + std::to_string(getpid()) + "/", 0), 0u)
      << engine->id();
  auto address = ParseHostPort(engine->address());
  ASSERT_TRUE(address.ok()) << engine->address();
  EXPECT_EQ(address->host, "127.0.0.1");
  EXPECT_NE(address->port, 0);
  auto other = CreateEngine(options);
  ASSERT_TRUE(other);
  EXPECT_NE(other->id(), engine->id());
  EXPECT_NE(other->address(), engine->address());
}

TEST(EngineRouteTest, TcpOnlyEngineReachesItsOwnSegmentOverTheNetwork) {
  Target target = StartTarget(WithProtocol("tcp"));
  ASSERT_TRUE(target.engine);
  EXPECT_EQ(target.memory->kind(), MemoryKind::kAnonymous);
  auto handle = target.engine->OpenSegment(target.descriptor());
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_EQ(target.engine->SegmentRoute(*handle).value_or(RouteKind::kNone), RouteKind::kTcp);
  EXPECT_TRUE(RoundTrip(target.engine.get(), *handle, target, 123, 300 * 1024, RouteKind::kTcp));
}

TEST(EngineRouteTest, AutoEngineReachesItsOwnSegmentLocally) {
  Target target = StartTarget(WithProtocol("auto"));
  ASSERT_TRUE(target.engine);
  auto handle = target.engine->OpenSegment(target.descriptor());
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_EQ(target.engine->SegmentRoute(*handle).value_or(RouteKind::kNone), RouteKind::kLocal);
  EXPECT_TRUE(RoundTrip(target.engine.get(), *handle, target, 123, 300 * 1024, RouteKind::kLocal));
}

TEST(EngineRouteTest, SameHostPeerUsesShm) {
  Target target = StartTarget(WithProtocol("auto"));
  ASSERT_TRUE(target.engine);
  auto peer = CreateEngine(WithProtocol("auto"));
  ASSERT_TRUE(peer);
  auto handle = peer->OpenSegment(target.engine->address(), "kv");
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_EQ(peer->SegmentRoute(*handle).value_or(RouteKind::kNone), RouteKind::kSameHostShm);
  EXPECT_TRUE(RoundTrip(peer.get(), *handle, target, 0, 4096, RouteKind::kSameHostShm));
}

TEST(EngineRouteTest, DifferentHostIdsUseTcp) {
  TransferEngineOptions a = WithProtocol("auto");
  a.host_id = "hostA";
  Target target = StartTarget(a);
  ASSERT_TRUE(target.engine);
  EXPECT_EQ(target.descriptor().host_id, "hostA");
  TransferEngineOptions b = WithProtocol("auto");
  b.host_id = "hostB";
  auto peer = CreateEngine(b);
  ASSERT_TRUE(peer);
  auto handle = peer->OpenSegment(target.descriptor());
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_EQ(peer->SegmentRoute(*handle).value_or(RouteKind::kNone), RouteKind::kTcp);
  EXPECT_TRUE(RoundTrip(peer.get(), *handle, target, 0, 4096, RouteKind::kTcp));
}

TEST(EngineRouteTest, LocalOnlyEngineCannotReachAPeer) {
  Target target = StartTarget(WithProtocol("auto"));
  ASSERT_TRUE(target.engine);
  auto local_only = CreateEngine(WithProtocol("local"));
  ASSERT_TRUE(local_only);
  auto handle = local_only->OpenSegment(target.descriptor());
  ASSERT_FALSE(handle.ok());
  EXPECT_EQ(handle.status().code(), StatusCode::kNotFound) << handle.status();
}

}  // namespace
}  // namespace larder
