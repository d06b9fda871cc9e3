// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The conformance suite's tests (the fixture and how a transport takes part:
// testing/conformance.h). Built once as larder_conformance_suite and linked into each test binary
// that instantiates it: transfer_test for the transports every build has
// (conformance_routes_test.cc), and the test of each optional transport for its own.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/net.h"
#include "larder/transfer_engine.h"
#include "transfer/testing/conformance.h"
#include "transfer/testing/test_util.h"

namespace larder::testutil {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST_P(ConformanceTest, DescribesTheOpenedSegment) {
  auto info = engine_->SegmentInfo(handle_);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->name, "conformance");
  EXPECT_EQ(info->size, SegmentSize());
  EXPECT_EQ(info->engine_id, owner_.descriptor.engine_id);
  EXPECT_EQ(info->address, owner_.descriptor.address);
}

TEST_P(ConformanceTest, DataIntegrityAcrossSizes) {
  struct Case {
    uint64_t offset;
    uint64_t length;
  };
  const Case cases[] = {
      {0, 1},                                      // first byte
      {kSegmentBytes - 7, 7},                      // last bytes
      {4099, 4095},                                // unaligned, just under a page
      {8192, 4096},                                // exactly one aligned page
      {12345, 64 * kKiB + 3},                      // unaligned, just over 64 KiB
      {1 * kMiB + 1, 1 * kMiB},                    // one MiB
      {3 * kMiB + 3, 4 * kMiB + 1},                // one byte past the default slice
      {kSegmentBytes - 64 * kMiB - 5, 64 * kMiB},  // many slices, ends near the segment end
  };
  uint64_t seed = 1;
  for (const Case& c : cases) {
    SCOPED_TRACE("offset " + std::to_string(c.offset) + " length " + std::to_string(c.length));
    ASSERT_LE(c.offset + c.length, SegmentSize());
    // Known bytes around the range catch copies that run over either end.
    const bool has_before = c.offset > 0;
    const bool has_after = c.offset + c.length < SegmentSize();
    if (has_before) SegmentBytes()[c.offset - 1] = 0x5a;
    if (has_after) SegmentBytes()[c.offset + c.length] = 0xa5;

    auto source = Buffer(c.length);
    FillPattern(source.get(), c.length, seed++);
    ASSERT_TRUE(TransferOne(TransferOp::kWrite, source.get(), c.offset, c.length));
    // The owner's memory holds the bytes, not just whatever the read path returns.
    ASSERT_EQ(std::memcmp(SegmentBytes() + c.offset, source.get(), c.length), 0);
    if (has_before) {
      EXPECT_EQ(SegmentBytes()[c.offset - 1], 0x5a);
    }
    if (has_after) {
      EXPECT_EQ(SegmentBytes()[c.offset + c.length], 0xa5);
    }

    auto destination = Buffer(c.length);
    std::memset(destination.get(), 0xee, c.length);
    ASSERT_TRUE(TransferOne(TransferOp::kRead, destination.get(), c.offset, c.length));
    ASSERT_EQ(std::memcmp(destination.get(), source.get(), c.length), 0);
  }
}

TEST_P(ConformanceTest, ReadsWhatTheOwnerWroteDirectly) {
  constexpr uint64_t kOffset = 5 * kMiB + 17;
  constexpr uint64_t kLength = 300 * kKiB + 9;
  FillPattern(SegmentBytes() + kOffset, kLength, 77);
  auto destination = Buffer(kLength);
  ASSERT_TRUE(TransferOne(TransferOp::kRead, destination.get(), kOffset, kLength));
  EXPECT_EQ(std::memcmp(destination.get(), SegmentBytes() + kOffset, kLength), 0);
}

TEST_P(ConformanceTest, BatchOfRandomRequests) {
  constexpr size_t kRequests = 64;
  constexpr uint64_t kSlotBytes = 256 * kKiB;  // each request lives in its own slot
  std::mt19937_64 rng(20240611);
  struct Planned {
    uint64_t offset;
    uint64_t length;
  };
  std::vector<Planned> planned;
  for (size_t i = 0; i < kRequests; ++i) {
    uint64_t length = std::uniform_int_distribution<uint64_t>(1, 128 * kKiB)(rng);
    uint64_t slack = kSlotBytes - length;
    uint64_t offset = i * kSlotBytes + std::uniform_int_distribution<uint64_t>(0, slack)(rng);
    planned.push_back({offset, length});
  }
  // Submission order is shuffled so that requests do not arrive in segment order.
  std::shuffle(planned.begin(), planned.end(), rng);

  std::vector<std::vector<uint8_t>> sources(kRequests), destinations(kRequests);
  std::vector<TransferRequest> writes, reads;
  for (size_t i = 0; i < kRequests; ++i) {
    sources[i].resize(planned[i].length);
    FillPattern(sources[i].data(), sources[i].size(), 1000 + i);
    destinations[i].assign(planned[i].length, 0xee);
    writes.push_back(
        Request(TransferOp::kWrite, sources[i].data(), planned[i].offset, planned[i].length));
    reads.push_back(
        Request(TransferOp::kRead, destinations[i].data(), planned[i].offset, planned[i].length));
  }

  auto batch = engine_->Submit(writes, seconds(30));
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_TRUE(engine_->Wait(*batch, seconds(30)).ok());
  auto write_results = engine_->Results(*batch);
  ASSERT_TRUE(write_results.ok()) << write_results.status();
  ASSERT_EQ(write_results->size(), kRequests);
  for (size_t i = 0; i < kRequests; ++i) {
    EXPECT_TRUE(Succeeded((*write_results)[i], planned[i].length)) << "write " << i;
  }
  EXPECT_TRUE(engine_->BatchStatus(*batch).ok());
  ASSERT_TRUE(engine_->Release(*batch).ok());
  for (size_t i = 0; i < kRequests; ++i) {
    ASSERT_EQ(std::memcmp(SegmentBytes() + planned[i].offset, sources[i].data(), planned[i].length),
              0)
        << "write " << i;
  }

  auto read_results = engine_->TransferSync(reads, seconds(30));
  ASSERT_TRUE(read_results.ok()) << read_results.status();
  ASSERT_EQ(read_results->size(), kRequests);
  for (size_t i = 0; i < kRequests; ++i) {
    EXPECT_TRUE(Succeeded((*read_results)[i], planned[i].length)) << "read " << i;
    EXPECT_EQ(destinations[i], sources[i]) << "read " << i;
  }
}

TEST_P(ConformanceTest, MixedReadWriteBatch) {
  // Reads and writes interleaved in one batch, each large enough to fill socket buffers, so a
  // route that cannot move both directions at once stalls here instead of in production.
  constexpr size_t kRequests = 16;
  constexpr uint64_t kLength = 4 * kMiB;
  constexpr uint64_t kStride = 5 * kMiB;
  std::vector<std::unique_ptr<uint8_t[]>> buffers;
  std::vector<TransferRequest> requests;
  for (size_t i = 0; i < kRequests; ++i) {
    uint64_t offset = 7 + i * kStride;
    buffers.push_back(Buffer(kLength));
    if (i % 2 == 0) {
      FillPattern(SegmentBytes() + offset, kLength, 500 + i);  // what the read must return
      std::memset(buffers.back().get(), 0xee, kLength);
      requests.push_back(Request(TransferOp::kRead, buffers.back().get(), offset, kLength));
    } else {
      FillPattern(buffers.back().get(), kLength, 500 + i);
      requests.push_back(Request(TransferOp::kWrite, buffers.back().get(), offset, kLength));
    }
  }
  auto start = Clock::now();
  auto results = engine_->TransferSync(requests, seconds(20));
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_LT(Clock::now() - start, seconds(15));
  for (size_t i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(Succeeded((*results)[i], kLength)) << "request " << i;
    EXPECT_EQ(std::memcmp(buffers[i].get(), SegmentBytes() + 7 + i * kStride, kLength), 0)
        << "request " << i;
  }
}

TEST_P(ConformanceTest, ReadThenWriteWithLargeSlices) {
  // One large read followed by one large write, each a single slice bigger than what the kernel
  // buffers of a connection hold: a route must keep draining replies while it sends payloads.
  StopEngines();
  TransferEngineOptions options;
  options.slice_bytes = 24 * kMiB;
  StartEngines(options);
  if (HasFatalFailure()) return;

  constexpr uint64_t kLength = 24 * kMiB;
  auto destination = Buffer(kLength);
  auto source = Buffer(kLength);
  std::memset(destination.get(), 0xee, kLength);
  FillPattern(SegmentBytes(), kLength, 600);
  FillPattern(source.get(), kLength, 601);
  TransferRequest requests[] = {
      Request(TransferOp::kRead, destination.get(), 0, kLength),
      Request(TransferOp::kWrite, source.get(), 32 * kMiB, kLength),
  };
  auto start = Clock::now();
  auto results = engine_->TransferSync(requests, seconds(20));
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_LT(Clock::now() - start, seconds(15));
  ASSERT_TRUE(Succeeded((*results)[0], kLength));
  ASSERT_TRUE(Succeeded((*results)[1], kLength));
  EXPECT_EQ(std::memcmp(destination.get(), SegmentBytes(), kLength), 0);
  EXPECT_EQ(std::memcmp(SegmentBytes() + 32 * kMiB, source.get(), kLength), 0);
}

TEST_P(ConformanceTest, ConcurrentThreadsOnDisjointRanges) {
  constexpr int kThreads = 4;
  constexpr int kIterations = 24;
  constexpr uint64_t kRangeBytes = 8 * kMiB;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t + 1);
      const uint64_t base = 16 * kMiB + t * kRangeBytes;
      for (int i = 0; i < kIterations; ++i) {
        uint64_t length = std::uniform_int_distribution<uint64_t>(1, 2 * kMiB)(rng);
        uint64_t offset =
            base + std::uniform_int_distribution<uint64_t>(0, kRangeBytes - length)(rng);
        std::vector<uint8_t> source(length), destination(length, 0xee);
        FillPattern(source.data(), length, t * 1000 + i);
        ::testing::AssertionResult wrote =
            TransferOne(TransferOp::kWrite, source.data(), offset, length);
        ::testing::AssertionResult read =
            wrote ? TransferOne(TransferOp::kRead, destination.data(), offset, length) : wrote;
        EXPECT_TRUE(wrote) << "thread " << t << " iteration " << i;
        EXPECT_TRUE(read) << "thread " << t << " iteration " << i;
        if (!wrote || !read || destination != source) {
          ADD_FAILURE() << "thread " << t << " iteration " << i << " read back other bytes";
          ++failures;
          return;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_P(ConformanceTest, SubmitWithTimeoutThenWait) {
  constexpr uint64_t kLength = 3 * kMiB + 1;
  auto source = Buffer(kLength);
  FillPattern(source.get(), kLength, 31);
  TransferRequest request = Request(TransferOp::kWrite, source.get(), 99, kLength);
  auto batch = engine_->Submit({&request, 1}, seconds(20));
  ASSERT_TRUE(batch.ok()) << batch.status();
  Status waited = engine_->Wait(*batch, seconds(20));
  ASSERT_TRUE(waited.ok()) << waited;
  auto polled = engine_->Poll(*batch);
  ASSERT_TRUE(polled.ok());
  EXPECT_TRUE(*polled);
  auto results = engine_->Results(*batch);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_TRUE(Succeeded((*results)[0], kLength));
  EXPECT_TRUE(engine_->BatchStatus(*batch).ok());
  EXPECT_EQ(std::memcmp(SegmentBytes() + 99, source.get(), kLength), 0);
  ASSERT_TRUE(engine_->Release(*batch).ok());

  // A released id is gone for good, even though its slot will be reused.
  EXPECT_EQ(engine_->Poll(*batch).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(engine_->Wait(*batch, milliseconds(1)).code(), StatusCode::kNotFound);
  EXPECT_EQ(engine_->Results(*batch).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(engine_->BatchStatus(*batch).code(), StatusCode::kNotFound);
  EXPECT_EQ(engine_->Release(*batch).code(), StatusCode::kNotFound);
  auto next = engine_->Submit({&request, 1}, seconds(20));
  ASSERT_TRUE(next.ok());
  EXPECT_NE(*next, *batch);
  EXPECT_EQ(engine_->Poll(*batch).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(engine_->Wait(*next, seconds(20)).ok());
  ASSERT_TRUE(engine_->Release(*next).ok());
}

TEST_P(ConformanceTest, UnknownBatchIdsAreNotFound) {
  for (BatchId id : {BatchId{0}, BatchId{12345}, BatchId{~0ULL}}) {
    EXPECT_EQ(engine_->Poll(id).status().code(), StatusCode::kNotFound) << id;
    EXPECT_EQ(engine_->Wait(id, milliseconds(1)).code(), StatusCode::kNotFound) << id;
    EXPECT_EQ(engine_->Results(id).status().code(), StatusCode::kNotFound) << id;
    EXPECT_EQ(engine_->BatchStatus(id).code(), StatusCode::kNotFound) << id;
    EXPECT_EQ(engine_->Release(id).code(), StatusCode::kNotFound) << id;
  }
}

TEST_P(ConformanceTest, ResultsWhileRunningAreFailedPrecondition) {
  // Large enough that a network route is normally still busy right after Submit. Same-host
  // routes may finish first; then every call must simply succeed, so each check depends on what
  // Poll saw beforehand, never on timing.
  constexpr uint64_t kLength = 32 * kMiB;
  auto destination = Buffer(kLength);
  TransferRequest request = Request(TransferOp::kRead, destination.get(), 0, kLength);
  auto batch = engine_->Submit({&request, 1}, seconds(30));
  ASSERT_TRUE(batch.ok()) << batch.status();

  auto polled = engine_->Poll(*batch);
  ASSERT_TRUE(polled.ok());
  auto early_results = engine_->Results(*batch);
  Status early_status = engine_->BatchStatus(*batch);
  if (*polled) {
    // Done before we looked: results are final.
    ASSERT_TRUE(early_results.ok()) << early_results.status();
    EXPECT_TRUE(early_status.ok()) << early_status;
  } else {
    if (!early_results.ok()) {
      EXPECT_EQ(early_results.status().code(), StatusCode::kFailedPrecondition);
    }
    if (!early_status.ok()) {
      EXPECT_EQ(early_status.code(), StatusCode::kFailedPrecondition);
    }
    Status released = engine_->Release(*batch);
    if (!released.ok()) {
      EXPECT_EQ(released.code(), StatusCode::kFailedPrecondition) << released;
    } else {
      return;  // finished in between and is gone; nothing left to check
    }
    Status quick_wait = engine_->Wait(*batch, milliseconds(0));
    if (!quick_wait.ok()) {
      EXPECT_EQ(quick_wait.code(), StatusCode::kDeadlineExceeded);
    }
  }
  ASSERT_TRUE(engine_->Wait(*batch, seconds(30)).ok());
  auto results = engine_->Results(*batch);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_TRUE(Succeeded((*results)[0], kLength));
  ASSERT_TRUE(engine_->Release(*batch).ok());
}

TEST_P(ConformanceTest, SmallBatchOfTheSameHostCompletesInsideSubmit) {
  // Same-host routes copy small batches inline, so Submit returns a finished batch; a network
  // route finishes it later, and Wait is how a caller finds out.
  const bool same_host = GetParam().caps.completes_small_batches_inline;
  std::vector<uint8_t> source(4096);
  FillPattern(source.data(), source.size(), 8);
  TransferRequest request = Request(TransferOp::kWrite, source.data(), 4096, source.size());
  auto batch = engine_->Submit({&request, 1});
  ASSERT_TRUE(batch.ok()) << batch.status();
  auto polled = engine_->Poll(*batch);
  ASSERT_TRUE(polled.ok());
  if (same_host) {
    EXPECT_TRUE(*polled) << "a 4 KiB same-host batch should be complete when Submit returns";
  } else {
    ASSERT_TRUE(engine_->Wait(*batch, seconds(10)).ok());
  }
  auto results = engine_->Results(*batch);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_TRUE(Succeeded((*results)[0], source.size()));
  ASSERT_TRUE(engine_->Release(*batch).ok());
  EXPECT_EQ(std::memcmp(SegmentBytes() + 4096, source.data(), source.size()), 0);
}

TEST_P(ConformanceTest, RequestSpanningManySlices) {
  StopEngines();
  TransferEngineOptions options;
  options.slice_bytes = 64 * kKiB;
  StartEngines(options);
  if (HasFatalFailure()) return;

  constexpr uint64_t kLength = 1 * kMiB + 5;   // 16 full slices and a 5-byte tail
  constexpr uint64_t kOffset = 64 * kKiB - 3;  // slices straddle the owner's page boundaries
  auto source = Buffer(kLength);
  FillPattern(source.get(), kLength, 1234);
  SegmentBytes()[kOffset + kLength] = 0x42;
  ASSERT_TRUE(TransferOne(TransferOp::kWrite, source.get(), kOffset, kLength));
  EXPECT_EQ(std::memcmp(SegmentBytes() + kOffset, source.get(), kLength), 0);
  EXPECT_EQ(SegmentBytes()[kOffset + kLength], 0x42);

  auto destination = Buffer(kLength);
  std::memset(destination.get(), 0xee, kLength);
  ASSERT_TRUE(TransferOne(TransferOp::kRead, destination.get(), kOffset, kLength));
  EXPECT_EQ(std::memcmp(destination.get(), source.get(), kLength), 0);
}

TEST_P(ConformanceTest, TransferSyncMovesABatch) {
  std::vector<uint8_t> source(10000), destination(10000, 0);
  FillPattern(source.data(), source.size(), 55);
  FillPattern(SegmentBytes() + 200000, destination.size(), 56);
  std::vector<uint8_t> expected(SegmentBytes() + 200000, SegmentBytes() + 200000 + 10000);
  TransferRequest requests[] = {
      Request(TransferOp::kWrite, source.data(), 100000, source.size()),
      Request(TransferOp::kRead, destination.data(), 200000, destination.size()),
  };
  auto results = engine_->TransferSync(requests);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 2u);
  EXPECT_TRUE(Succeeded((*results)[0], source.size()));
  EXPECT_TRUE(Succeeded((*results)[1], destination.size()));
  EXPECT_EQ(std::memcmp(SegmentBytes() + 100000, source.data(), source.size()), 0);
  EXPECT_EQ(destination, expected);

  // Per-request errors come back as results; only a malformed batch fails the call.
  TransferRequest bad = Request(TransferOp::kRead, destination.data(), SegmentSize(), 1);
  auto bad_results = engine_->TransferSync({&bad, 1});
  ASSERT_TRUE(bad_results.ok()) << bad_results.status();
  EXPECT_EQ((*bad_results)[0].status.code(), StatusCode::kOutOfRange);
  EXPECT_EQ((*bad_results)[0].bytes, 0u);
  EXPECT_EQ(engine_->TransferSync({}).status().code(), StatusCode::kInvalidArgument);
}

TEST_P(ConformanceTest, ClosedHandleIsNotFound) {
  ASSERT_TRUE(engine_->CloseSegment(handle_).ok());
  EXPECT_EQ(engine_->CloseSegment(handle_).code(), StatusCode::kNotFound);
  EXPECT_EQ(engine_->SegmentRoute(handle_).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(engine_->SegmentInfo(handle_).status().code(), StatusCode::kNotFound);
  uint8_t byte = 0;
  TransferRequest request = Request(TransferOp::kRead, &byte, 0, 1);
  auto results = engine_->TransferSync({&request, 1});
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ((*results)[0].status.code(), StatusCode::kNotFound);

  // Reopening gives a new, working handle on the same route.
  auto reopened = engine_->OpenSegment(owner_.descriptor);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_NE(*reopened, handle_);
  handle_ = *reopened;
  SegmentBytes()[0] = 0x77;
  ASSERT_TRUE(TransferOne(TransferOp::kRead, &byte, 0, 1));
  EXPECT_EQ(byte, 0x77);
}

}  // namespace
}  // namespace larder::testutil
