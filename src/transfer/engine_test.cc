// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The engine's contract beyond moving bytes: every malformed request gets its own clear Status and
// leaves the engine serving, and route selection follows the protocol, the host identity, the
// cluster token and the shm uid policy.
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
#include "transfer/testing/test_util.h"

namespace larder {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testutil::FillPattern;
using testutil::ScopedEnv;

constexpr uint64_t kSegmentBytes = 1 << 20;

std::unique_ptr<TransferEngine> CreateEngine(TransferEngineOptions options) {
  auto engine = TransferEngine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(engine).value() : nullptr;
}

// What "auto" enables: local, shm and tcp in every build, and ucx between shm and tcp in builds
// that have it.
std::vector<RouteKind> AutoRoutes() {
  std::vector<RouteKind> routes{RouteKind::kLocal, RouteKind::kSameHostShm};
  if (ParseProtocol("ucx").ok()) routes.emplace_back("ucx");
  routes.push_back(RouteKind::kTcp);
  return routes;
}

TransferEngineOptions WithProtocol(std::string protocol) {
  TransferEngineOptions options;
  options.protocol = std::move(protocol);
  return options;
}

// An engine that exports one segment, "kv", and keeps its memory for direct inspection.
struct Target {
  std::unique_ptr<TransferEngine> engine;
  std::shared_ptr<MemoryRegion> memory;
  SegmentId id = 0;

  SegmentDescriptor descriptor() const { return engine->ListSegments().at(0); }
  uint8_t* bytes() const { return static_cast<uint8_t*>(memory->data()); }
};

Target StartTarget(TransferEngineOptions options) {
  Target target;
  target.engine = CreateEngine(std::move(options));
  if (!target.engine) return target;
  auto memory = target.engine->AllocateSegmentMemory(kSegmentBytes);
  EXPECT_TRUE(memory.ok()) << memory.status();
  if (!memory.ok()) return target;
  target.memory = std::move(memory).value();
  auto id = target.engine->RegisterSegment("kv", target.memory);
  EXPECT_TRUE(id.ok()) << id.status();
  target.id = id.value_or(0);
  return target;
}

// Writes a fresh pattern over [offset, offset + length) through `engine`, reads it back, and
// checks both the owner's memory and the bytes read. Used after every bad request to show that
// the engine still serves.
::testing::AssertionResult RoundTrip(TransferEngine* engine, SegmentHandle handle,
                                     const Target& target, uint64_t offset = 4096,
                                     uint64_t length = 64 * 1024,
                                     std::optional<RouteKind> route = std::nullopt) {
  static uint64_t seed = 0;
  std::vector<uint8_t> source(length), destination(length, 0);
  FillPattern(source.data(), length, ++seed);
  TransferRequest requests[] = {{TransferOp::kWrite, source.data(), handle, offset, length}};
  auto wrote = engine->TransferSync(requests, seconds(10));
  if (!wrote.ok()) return ::testing::AssertionFailure() << "write: " << wrote.status();
  if (!(*wrote)[0].status.ok()) {
    return ::testing::AssertionFailure() << "write: " << (*wrote)[0].status;
  }
  if (route && (*wrote)[0].route != *route) {
    return ::testing::AssertionFailure() << "write went over " << RouteKindName((*wrote)[0].route);
  }
  if (std::memcmp(target.bytes() + offset, source.data(), length) != 0) {
    return ::testing::AssertionFailure() << "the owner's memory does not hold the written bytes";
  }
  requests[0] = {TransferOp::kRead, destination.data(), handle, offset, length};
  auto read = engine->TransferSync(requests, seconds(10));
  if (!read.ok()) return ::testing::AssertionFailure() << "read: " << read.status();
  if (!(*read)[0].status.ok())
    return ::testing::AssertionFailure() << "read: " << (*read)[0].status;
  if (destination != source) return ::testing::AssertionFailure() << "read back other bytes";
  return ::testing::AssertionSuccess();
}

// The outcome of a single-request batch (the batch itself must be accepted).
Status TransferOneStatus(TransferEngine* engine, const TransferRequest& request) {
  auto results = engine->TransferSync({&request, 1}, seconds(10));
  if (!results.ok()) return InternalError("batch refused: " + results.status().ToString());
  return (*results)[0].status;
}

// An engine that opens its own segment: the simplest setting for request validation, which is
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
  auto owner = CreateEngine(WithProtocol("auto"));
  ASSERT_TRUE(owner);
  std::vector<uint8_t> caller_owned(64 * 1024);
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

class ProtocolResolutionTest : public ::testing::Test {
 protected:
  ScopedEnv protocol_{"LARDER_PROTOCOL", std::nullopt};
  ScopedEnv store_protocol_{"LARDER_STORE_PROTOCOL", std::nullopt};
};

// Every combination of the two variables unset, empty or set, for both roles, with and without
// explicit config: the documented rule, and neither variable ever rewritten.
TEST_F(ProtocolResolutionTest, EveryCombinationFollowsTheRule) {
  const std::optional<std::string> values[] = {std::nullopt, "", "x"};
  for (const auto& pd : values) {
    for (const auto& store : values) {
      std::optional<std::string> pd_value =
          pd ? std::optional<std::string>(*pd == "x" ? "tcp" : *pd) : std::nullopt;
      std::optional<std::string> store_value =
          store ? std::optional<std::string>(*store == "x" ? "device,tcp" : *store) : std::nullopt;
      ScopedEnv pd_env("LARDER_PROTOCOL", pd_value);
      ScopedEnv store_env("LARDER_STORE_PROTOCOL", store_value);
      for (EngineRole role : {EngineRole::kPd, EngineRole::kStore}) {
        for (std::string configured : {"", "shm"}) {
          std::string expected = "auto";
          if (pd_value && !pd_value->empty()) expected = *pd_value;
          if (role == EngineRole::kStore && store_value && !store_value->empty()) {
            expected = *store_value;
          }
          if (!configured.empty()) expected = configured;
          EXPECT_EQ(ResolveProtocol(role, configured), expected)
              << "LARDER_PROTOCOL=" << pd_value.value_or("<unset>")
              << " LARDER_STORE_PROTOCOL=" << store_value.value_or("<unset>")
              << " role=" << (role == EngineRole::kStore ? "store" : "standalone")
              << " configured=" << configured;
          const char* pd_now = std::getenv("LARDER_PROTOCOL");
          const char* store_now = std::getenv("LARDER_STORE_PROTOCOL");
          EXPECT_EQ(pd_now != nullptr, pd_value.has_value());
          if (pd_now && pd_value) {
            EXPECT_EQ(*pd_value, pd_now);
          }
          EXPECT_EQ(store_now != nullptr, store_value.has_value());
          if (store_now && store_value) {
            EXPECT_EQ(*store_value, store_now);
          }
        }
      }
    }
  }
}

TEST_F(ProtocolResolutionTest, DefaultsToAuto) {
  EXPECT_EQ(ResolveProtocol(EngineRole::kPd, ""), "auto");
  EXPECT_EQ(ResolveProtocol(EngineRole::kStore, ""), "auto");
}

TEST_F(ProtocolResolutionTest, StoreRoleUsesTheStoreVariable) {
  setenv("LARDER_PROTOCOL", "shm", 1);
  setenv("LARDER_STORE_PROTOCOL", "tcp", 1);
  EXPECT_EQ(ResolveProtocol(EngineRole::kStore, ""), "tcp");
  // Only the store role reads the store variable.
  EXPECT_EQ(ResolveProtocol(EngineRole::kPd, ""), "shm");
  // Resolution never writes the environment.
  EXPECT_STREQ(std::getenv("LARDER_PROTOCOL"), "shm");
  EXPECT_STREQ(std::getenv("LARDER_STORE_PROTOCOL"), "tcp");
}

TEST_F(ProtocolResolutionTest, EmptyStoreVariableFallsBackToLarderProtocol) {
  setenv("LARDER_PROTOCOL", "shm,tcp", 1);
  setenv("LARDER_STORE_PROTOCOL", "", 1);
  EXPECT_EQ(ResolveProtocol(EngineRole::kStore, ""), "shm,tcp");
  unsetenv("LARDER_STORE_PROTOCOL");
  EXPECT_EQ(ResolveProtocol(EngineRole::kStore, ""), "shm,tcp");
  EXPECT_STREQ(std::getenv("LARDER_PROTOCOL"), "shm,tcp");
  EXPECT_EQ(std::getenv("LARDER_STORE_PROTOCOL"), nullptr);
}

TEST_F(ProtocolResolutionTest, StandaloneIgnoresTheStoreVariable) {
  setenv("LARDER_STORE_PROTOCOL", "tcp", 1);
  EXPECT_EQ(ResolveProtocol(EngineRole::kPd, ""), "auto");
  EXPECT_STREQ(std::getenv("LARDER_STORE_PROTOCOL"), "tcp");
  EXPECT_EQ(std::getenv("LARDER_PROTOCOL"), nullptr);
}

TEST_F(ProtocolResolutionTest, ExplicitConfigurationWins) {
  setenv("LARDER_PROTOCOL", "shm", 1);
  setenv("LARDER_STORE_PROTOCOL", "tcp", 1);
  EXPECT_EQ(ResolveProtocol(EngineRole::kStore, "local"), "local");
  EXPECT_EQ(ResolveProtocol(EngineRole::kPd, "local"), "local");
  EXPECT_STREQ(std::getenv("LARDER_PROTOCOL"), "shm");
  EXPECT_STREQ(std::getenv("LARDER_STORE_PROTOCOL"), "tcp");
}

TEST_F(ProtocolResolutionTest, CreateUsesTheRolesVariable) {
  setenv("LARDER_STORE_PROTOCOL", "tcp", 1);
  TransferEngineOptions store;
  store.role = EngineRole::kStore;
  auto store_engine = CreateEngine(store);
  ASSERT_TRUE(store_engine);
  EXPECT_EQ(store_engine->routes(), std::vector<RouteKind>{RouteKind::kTcp});

  TransferEngineOptions standalone;  // LARDER_PROTOCOL unset: auto
  auto standalone_engine = CreateEngine(standalone);
  ASSERT_TRUE(standalone_engine);
  EXPECT_EQ(standalone_engine->routes(), AutoRoutes());
}

TEST(ParseProtocolTest, KnownNames) {
  auto all = ParseProtocol("auto");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(*all, AutoRoutes());
  // Every build has these; ucx sits between shm and tcp where it is built.
  EXPECT_LT(RoutePreference(RouteKind::kLocal), RoutePreference(RouteKind::kSameHostShm));
  EXPECT_LT(RoutePreference(RouteKind::kSameHostShm), RoutePreference(RouteKind::kTcp));
  EXPECT_EQ(RoutePreference(RouteKind("bogus")), std::numeric_limits<int>::max());
  auto pair = ParseProtocol("shm,tcp");
  ASSERT_TRUE(pair.ok()) << pair.status();
  EXPECT_EQ(*pair, (std::vector<RouteKind>{RouteKind::kSameHostShm, RouteKind::kTcp}));
  auto tcp = ParseProtocol("tcp");
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  EXPECT_EQ(*tcp, std::vector<RouteKind>{RouteKind::kTcp});
  // Preference is fixed, whatever order the list is written in; spaces are tolerated.
  auto reversed = ParseProtocol("tcp, local");
  ASSERT_TRUE(reversed.ok()) << reversed.status();
  EXPECT_EQ(*reversed, (std::vector<RouteKind>{RouteKind::kLocal, RouteKind::kTcp}));
}

TEST(ParseProtocolTest, DeviceIsNeverInAuto) {
  auto all = ParseProtocol("auto");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(std::count(all->begin(), all->end(), RouteKind::kDevice), 0);
  auto both = ParseProtocol("tcp,device");
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(*both, (std::vector<RouteKind>{RouteKind::kDevice, RouteKind::kTcp}));
}

TEST(ParseProtocolTest, UnknownNamesAreInvalidArgument) {
  for (const char* bad : {"bogus", "", "shm,bogus", "shm,,tcp", "rdma", "tcp;shm"}) {
    auto parsed = ParseProtocol(bad);
    ASSERT_FALSE(parsed.ok()) << "'" << bad << "'";
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  std::string message = ParseProtocol("bogus").status().message();
  EXPECT_NE(message.find("bogus"), std::string::npos);
  // The message lists what this build has.
  EXPECT_NE(message.find("auto, local"), std::string::npos) << message;
  EXPECT_NE(message.find("tcp"), std::string::npos) << message;
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
    descriptor_.size = kSegmentBytes;
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
