// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The conformance suite every transport passes (conformance_test.cc): the same transfers, checked
// the same way, whatever moves them. A transport takes part by instantiating the suite with a
// TransportUnderTest: a factory for its engines and the capabilities it promises, e.g.
//
//   INSTANTIATE_TEST_SUITE_P(Ucx, ConformanceTest,
//       ::testing::Values(TwoEngineCase("ucx", "ucx", RouteKind("ucx"), {})), TransportCaseName);
//
// in a test binary that links larder_conformance_suite. The suite never asks which transport it
// runs over, nor whether the segment's owner is this process or another one. Test-only.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>

#include "larder/transfer_engine.h"
#include "transfer/testing/test_util.h"

namespace larder::testutil {

constexpr uint64_t kKiB = 1ULL << 10;
constexpr uint64_t kMiB = 1ULL << 20;
// Large enough for the 64 MiB transfers plus unaligned offsets around them.
constexpr uint64_t kSegmentBytes = 128 * kMiB;

// The segment's owner when it is another process (a case's `make` starts it): the segment it
// exports and that owner's memory as it sees it (a second mapping of the same pages).
struct ExternalOwner {
  SegmentDescriptor descriptor;  // named "conformance", at least kSegmentBytes
  uint8_t* bytes = nullptr;
  std::shared_ptr<void> keep;  // the process and the mapping; released when the case stops
};

// The engines of one case: `target` owns and exports the segment; `initiator` issues transfers,
// or is null when the target transfers to its own segment (local, device). When the owner is
// another process, `external` describes it, `target` is null and `initiator` is set.
struct ConformanceEngines {
  std::unique_ptr<TransferEngine> target;
  std::unique_ptr<TransferEngine> initiator;
  std::optional<ExternalOwner> external;
};

// One transport under test: how to build its engines, and what it promises.
struct TransportUnderTest {
  std::string name;  // the test's name suffix
  RouteKind route;   // what SegmentRoute and TransferResult::route must report
  // Capabilities the suite checks instead of asking which transport this is.
  struct Caps {
    // Small batches finish inside Submit (same-host copies); otherwise Wait is needed.
    bool completes_small_batches_inline = false;
    // What the target's AllocateSegmentMemory gives, when the case promises one.
    std::optional<MemoryKind> segment_memory;
  } caps;
  // Builds the engines; `initiator_options` tunes the engine that issues transfers (the target
  // itself when there is no initiator). Runs on the test's thread.
  std::function<Result<ConformanceEngines>(TransferEngineOptions initiator_options)> make;
};

inline std::string TransportCaseName(const ::testing::TestParamInfo<TransportUnderTest>& info) {
  return info.param.name;
}

// Lets failure messages say "tcp" instead of dumping the struct's bytes.
inline void PrintTo(const TransportUnderTest& transport, std::ostream* os) {
  *os << transport.name;
}

// A case whose target engine (protocol "auto") exports to an initiator of protocol `protocol`:
// the shape of every route between two engines.
inline TransportUnderTest TwoEngineCase(std::string name, std::string protocol, RouteKind route,
                                        TransportUnderTest::Caps caps) {
  return {std::move(name), route, caps,
          [protocol](TransferEngineOptions initiator_options) -> Result<ConformanceEngines> {
            ConformanceEngines engines;
            TransferEngineOptions target_options;
            target_options.protocol = "auto," + protocol;
            LARDER_ASSIGN_OR_RETURN(engines.target, TransferEngine::Create(target_options));
            initiator_options.protocol = protocol;
            LARDER_ASSIGN_OR_RETURN(engines.initiator, TransferEngine::Create(initiator_options));
            return engines;
          }};
}

// A buffer that is not zero-filled on allocation (the tests fill it themselves, and zeroing
// 64 MiB under ASan for nothing is slow).
inline std::unique_ptr<uint8_t[]> Buffer(size_t size) {
  return std::unique_ptr<uint8_t[]>(new uint8_t[size]);
}

class ConformanceTest : public ::testing::TestWithParam<TransportUnderTest> {
 protected:
  void SetUp() override { StartEngines(TransferEngineOptions{}); }
  void TearDown() override { StopEngines(); }

  // Builds the engines of the route under test. `initiator_options` tunes the engine that issues
  // transfers (its protocol is set here); for "local" that engine is also the owner.
  void StartEngines(TransferEngineOptions initiator_options) {
    const TransportUnderTest& transport = GetParam();
    auto engines = transport.make(initiator_options);
    ASSERT_TRUE(engines.ok()) << engines.status();
    target_ = std::move(engines->target);
    initiator_ = std::move(engines->initiator);
    if (engines->external) {
      ASSERT_EQ(target_, nullptr);
      ASSERT_NE(initiator_, nullptr);
      ASSERT_NE(engines->external->bytes, nullptr);
      owner_ = std::move(*engines->external);
      ASSERT_NE(owner_.descriptor.engine_id, initiator_->id());
      ASSERT_GE(owner_.descriptor.size, kSegmentBytes);
    } else {
      ASSERT_NE(target_, nullptr);
      if (initiator_) {
        ASSERT_NE(initiator_->id(), target_->id());
      }
      RegisterTargetSegment();
    }
    engine_ = initiator_ ? initiator_.get() : target_.get();
    if (transport.caps.segment_memory) {
      EXPECT_EQ(owner_.descriptor.memory_kind, *transport.caps.segment_memory);
    }
    auto handle = engine_->OpenSegment(owner_.descriptor);
    ASSERT_TRUE(handle.ok()) << handle.status();
    handle_ = *handle;

    auto opened_route = engine_->SegmentRoute(handle_);
    ASSERT_TRUE(opened_route.ok()) << opened_route.status();
    ASSERT_EQ(*opened_route, transport.route) << "route " << RouteKindName(*opened_route);
  }

  // The in-process owner allocates and exports the segment.
  void RegisterTargetSegment() {
    auto memory = target_->AllocateSegmentMemory(kSegmentBytes);
    ASSERT_TRUE(memory.ok()) << memory.status();
    std::shared_ptr<MemoryRegion> region = std::move(memory).value();
    ASSERT_GE(region->size(), kSegmentBytes);
    auto id = target_->RegisterSegment("conformance", region);
    ASSERT_TRUE(id.ok()) << id.status();

    std::vector<SegmentDescriptor> segments = target_->ListSegments();
    ASSERT_EQ(segments.size(), 1u);
    EXPECT_EQ(segments[0].segment_id, *id);
    EXPECT_EQ(segments[0].name, "conformance");
    EXPECT_EQ(segments[0].size, region->size());
    EXPECT_EQ(segments[0].engine_id, target_->id());
    EXPECT_EQ(segments[0].address, target_->address());
    EXPECT_EQ(segments[0].memory_kind, region->kind());
    owner_.descriptor = segments[0];
    owner_.bytes = static_cast<uint8_t*>(region->data());
    owner_.keep = std::move(region);
  }

  void StopEngines() {
    engine_ = nullptr;
    initiator_.reset();  // before the owner, so its connections and mappings go first
    target_.reset();
    owner_ = ExternalOwner();
  }

  // The owner's memory, as the owner sees it.
  uint8_t* SegmentBytes() const { return owner_.bytes; }
  uint64_t SegmentSize() const { return owner_.descriptor.size; }

  TransferRequest Request(TransferOp op, void* local, uint64_t offset, uint64_t length) const {
    return TransferRequest{op, local, handle_, offset, length};
  }

  // Checks one finished request: OK, every byte moved, over the route under test.
  ::testing::AssertionResult Succeeded(const TransferResult& result, uint64_t length) const {
    if (!result.status.ok()) return ::testing::AssertionFailure() << result.status;
    if (result.bytes != length) {
      return ::testing::AssertionFailure() << "moved " << result.bytes << " of " << length;
    }
    if (result.route != GetParam().route) {
      return ::testing::AssertionFailure() << "went over " << RouteKindName(result.route);
    }
    return ::testing::AssertionSuccess();
  }

  // Moves one request synchronously and checks its outcome.
  ::testing::AssertionResult TransferOne(TransferOp op, void* local, uint64_t offset,
                                         uint64_t length) {
    TransferRequest request = Request(op, local, offset, length);
    auto results = engine_->TransferSync({&request, 1});
    if (!results.ok()) return ::testing::AssertionFailure() << results.status();
    if (results->size() != 1) return ::testing::AssertionFailure() << "wrong result count";
    return Succeeded((*results)[0], length);
  }

  std::unique_ptr<TransferEngine> target_;     // owns and exports the segment (in this process)
  std::unique_ptr<TransferEngine> initiator_;  // null for "local": target_ transfers itself
  TransferEngine* engine_ = nullptr;           // the engine that issues transfers
  ExternalOwner owner_;  // the segment (target_'s, or another process's) and its owner's view
  SegmentHandle handle_ = 0;
};

}  // namespace larder::testutil
