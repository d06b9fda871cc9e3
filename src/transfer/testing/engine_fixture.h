// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// What the engine's own tests share: creating an engine, a target that exports one segment and
// keeps its memory for inspection, and a write-then-read round trip that shows an engine still
// serves. Header-only, for GoogleTest binaries.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "larder/transfer_engine.h"
#include "transfer/testing/test_util.h"

namespace larder::testutil {

inline constexpr uint64_t kEngineTestSegmentBytes = 1 << 20;

inline std::unique_ptr<TransferEngine> CreateEngine(TransferEngineOptions options) {
  auto engine = TransferEngine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(engine).value() : nullptr;
}

// What "auto" enables: local, shm and tcp in every build, and ucx between shm and tcp in builds
// that have it.
inline std::vector<RouteKind> AutoRoutes() {
  std::vector<RouteKind> routes{RouteKind::kLocal, RouteKind::kSameHostShm};
  if (ParseProtocol("ucx").ok()) routes.emplace_back("ucx");
  routes.push_back(RouteKind::kTcp);
  return routes;
}

inline TransferEngineOptions WithProtocol(std::string protocol) {
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

inline Target StartTarget(TransferEngineOptions options) {
  Target target;
  target.engine = CreateEngine(std::move(options));
  if (!target.engine) return target;
  auto memory = target.engine->AllocateSegmentMemory(kEngineTestSegmentBytes);
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
inline ::testing::AssertionResult RoundTrip(TransferEngine* engine, SegmentHandle handle,
                                            const Target& target, uint64_t offset = 4096,
                                            uint64_t length = 64 * 1024,
                                            std::optional<RouteKind> route = std::nullopt) {
  static std::atomic<uint64_t> seed{0};
  std::vector<uint8_t> source(length), destination(length, 0);
  FillPattern(source.data(), length, ++seed);
  TransferRequest requests[] = {{TransferOp::kWrite, source.data(), handle, offset, length}};
  auto wrote = engine->TransferSync(requests, std::chrono::seconds(10));
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
  auto read = engine->TransferSync(requests, std::chrono::seconds(10));
  if (!read.ok()) return ::testing::AssertionFailure() << "read: " << read.status();
  if (!(*read)[0].status.ok())
    return ::testing::AssertionFailure() << "read: " << (*read)[0].status;
  if (destination != source) return ::testing::AssertionFailure() << "read back other bytes";
  return ::testing::AssertionSuccess();
}

// The outcome of a single-request batch (the batch itself must be accepted).
inline Status TransferOneStatus(TransferEngine* engine, const TransferRequest& request) {
  auto results = engine->TransferSync({&request, 1}, std::chrono::seconds(10));
  if (!results.ok()) return InternalError("batch refused: " + results.status().ToString());
  return (*results)[0].status;
}

// An engine that opens its own segment: the simplest setting for request validation, which is

// `count` reads of `block` bytes from the first 256 blocks of `segment` into `buffer` (256 * block
// bytes; requests share it, their bytes are not checked): a batch that is still moving when the
// segment's owner dies.
inline std::vector<TransferRequest> ReadsFrom(uint8_t* buffer, SegmentHandle segment, size_t count,
                                              uint64_t block) {
  std::vector<TransferRequest> requests;
  requests.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    requests.push_back(
        {TransferOp::kRead, buffer + (i % 256) * block, segment, (i % 256) * block, block});
  }
  return requests;
}

// The results of a batch whose peer died during it: every request that failed must have failed
// with Unavailable naming each of `names` (the peer's engine id, address, segment...). Returns how
// many failed.
inline size_t CheckDeadPeerFailures(const std::vector<TransferResult>& results,
                                    const std::vector<std::string>& names) {
  size_t failed = 0;
  for (const TransferResult& r : results) {
    if (r.status.ok()) continue;
    ++failed;
    EXPECT_EQ(r.status.code(), StatusCode::kUnavailable) << r.status;
    for (const std::string& name : names) {
      EXPECT_NE(r.status.message().find(name), std::string::npos) << name << ": " << r.status;
    }
  }
  return failed;
}

}  // namespace larder::testutil
