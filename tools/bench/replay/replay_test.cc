// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// `larder-bench replay`: prefix matching, the LRU and unbounded simulations, and one replay end to
// end, exactly against hits worked out by hand on testdata/replay_fixture.jsonl.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>

#include "bench/replay/lru_sim.h"
#include "bench/replay/replay_bench.h"
#include "bench/replay/replay_plot.h"
#include "bench/replay/replay_trace.h"
#include "testing/binaries.h"

namespace larder::bench {
namespace {

const std::string kFixture = std::string(LARDER_REPLAY_TESTDATA) + "/replay_fixture.jsonl";

// Per-request hits on the fixture, worked out by hand (see testdata/README.md).
const std::vector<uint64_t> kUnboundedHits = {0, 2, 1, 4, 0, 3, 2, 3, 0, 5, 1, 4,
                                              3, 2, 4, 6, 0, 3, 2, 5, 4, 1, 5, 4};
const std::vector<uint64_t> kLru8Hits = {0, 2, 1, 4, 0, 2, 2, 1, 0, 1, 0, 2,
                                         0, 0, 0, 1, 0, 3, 0, 0, 0, 0, 1, 0};

using larder::test::Bin;

std::vector<uint64_t> PerRequest(const SimulatedHits& hits) {
  std::vector<uint64_t> out;
  uint64_t before = 0;
  for (uint64_t cumulative : hits.cumulative_hits) {
    out.push_back(cumulative - before);
    before = cumulative;
  }
  return out;
}

// A trace file in the test's temporary directory, removed on destruction.
class TempTrace {
 public:
  explicit TempTrace(const std::string& text) {
    const char* tmp = std::getenv("TMPDIR");
    path_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/replay_test_" +
            std::to_string(getpid()) + "_" + std::to_string(counter_++) + ".jsonl";
    std::ofstream(path_) << text;
  }
  ~TempTrace() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

TEST(LongestPrefixTest, StopsAtTheFirstMissingBlock) {
  auto cached = [](uint64_t block) { return block != 3; };
  EXPECT_EQ(LongestPrefix(std::vector<uint64_t>{}, cached), 0u);
  EXPECT_EQ(LongestPrefix(std::vector<uint64_t>{1, 2}, cached), 2u);
  EXPECT_EQ(LongestPrefix(std::vector<uint64_t>{1, 3, 2}, cached), 1u);
  EXPECT_EQ(LongestPrefix(std::vector<uint64_t>{3, 1, 2}, cached), 0u);
}

TEST(PrefixCacheSimTest, ExactLruByHand) {
  PrefixCacheSim cache(3);
  EXPECT_EQ(cache.Access(std::vector<uint64_t>{1, 2, 3}), 0u);  // LRU..MRU: 1 2 3
  EXPECT_EQ(cache.Access(std::vector<uint64_t>{1, 2, 4}), 2u);  // 4 evicts 3: 1 2 4
  EXPECT_FALSE(cache.Contains(3));
  // 1 is cached but comes after the missing 3: no hit. 3 evicts 1, then 1 evicts 2: 4 3 1.
  EXPECT_EQ(cache.Access(std::vector<uint64_t>{3, 1}), 0u);
  EXPECT_FALSE(cache.Contains(2));
  EXPECT_EQ(cache.Access(std::vector<uint64_t>{4, 3, 1}), 3u);
  EXPECT_EQ(cache.size(), 3u);
}

TEST(PrefixCacheSimTest, LruEvictsTheRootBeforeItsDescendants) {
  // Blocks are referenced root first, so the root is the oldest of its chain: once it goes, the
  // rest of the chain is cached but unusable.
  PrefixCacheSim cache(3);
  EXPECT_EQ(cache.Access(std::vector<uint64_t>{1, 2, 3}), 0u);
  EXPECT_EQ(cache.Access(std::vector<uint64_t>{4}), 0u);  // evicts 1
  EXPECT_TRUE(cache.Contains(2));
  EXPECT_EQ(cache.Access(std::vector<uint64_t>{1, 2, 3}), 0u);
}

TEST(PrefixCacheSimTest, UnboundedNeverEvicts) {
  PrefixCacheSim cache(0);
  for (uint64_t i = 0; i < 1000; ++i) EXPECT_EQ(cache.Access(std::vector<uint64_t>{i}), 0u);
  EXPECT_EQ(cache.size(), 1000u);
  EXPECT_EQ(cache.Access(std::vector<uint64_t>{0, 1, 2}), 3u);
}

TEST(ReplayTraceTest, LoadsTheFixture) {
  auto requests = LoadTrace(kFixture);
  ASSERT_TRUE(requests.ok()) << requests.status();
  ASSERT_EQ(requests->size(), 24u);
  EXPECT_EQ(CountBlockRefs(*requests), 96u);
  EXPECT_EQ((*requests)[1].timestamp_ms, 250);
  EXPECT_EQ((*requests)[1].blocks, (std::vector<uint64_t>{0, 1, 4}));
  auto first = LoadTrace(kFixture, 3);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->size(), 3u);
  EXPECT_EQ(BlockKey(17), "blk/17");
}

TEST(ReplayTraceTest, SortsByArrivalStably) {
  TempTrace trace(
      "{\"timestamp\": 5, \"hash_ids\": [1]}\n"
      "{\"timestamp\": 2, \"hash_ids\": [2]}\n"
      "\n"
      "{\"timestamp\": 5, \"hash_ids\": [3]}\n"
      "{\"timestamp\": 2, \"hash_ids\": [4]}\n");
  auto requests = LoadTrace(trace.path());
  ASSERT_TRUE(requests.ok()) << requests.status();
  std::vector<uint64_t> order;
  for (const TraceRequest& request : *requests) order.push_back(request.blocks[0]);
  EXPECT_EQ(order, (std::vector<uint64_t>{2, 4, 1, 3}));
}

TEST(ReplayTraceTest, RejectsBadTraces) {
  EXPECT_EQ(LoadTrace("/nonexistent/trace.jsonl").status().code(), StatusCode::kNotFound);
  for (const char* text : {"not json\n", "{\"timestamp\": 1}\n", "{\"hash_ids\": [1, -2]}\n",
                           "{\"hash_ids\": [1, 2, 1]}\n"}) {
    TempTrace trace(text);
    auto requests = LoadTrace(trace.path());
    EXPECT_EQ(requests.status().code(), StatusCode::kInvalidArgument) << text;
    // The message names the line.
    EXPECT_NE(requests.status().message().find(trace.path() + ":1"), std::string::npos)
        << requests.status();
  }
}

// The fixture's requests, loaded for each test.
class SimulatePrefixCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto loaded = LoadTrace(kFixture);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    requests_ = std::move(*loaded);
  }
  std::vector<TraceRequest> requests_;
};

TEST_F(SimulatePrefixCacheTest, UnboundedOnTheFixture) {
  SimulatedHits hits = SimulatePrefixCache(requests_, 0);
  EXPECT_EQ(hits.block_refs, 96u);
  EXPECT_EQ(hits.hit_blocks, 64u);
  EXPECT_EQ(hits.distinct_blocks, 32u);
  EXPECT_EQ(PerRequest(hits), kUnboundedHits);
  // As large as the footprint: nothing is ever evicted.
  EXPECT_EQ(SimulatePrefixCache(requests_, 32).hit_blocks, 64u);
}

TEST_F(SimulatePrefixCacheTest, LruOfEightBlocksOnTheFixture) {
  SimulatedHits hits = SimulatePrefixCache(requests_, 8);
  EXPECT_EQ(hits.block_refs, 96u);
  EXPECT_EQ(hits.hit_blocks, 20u);
  EXPECT_EQ(PerRequest(hits), kLru8Hits);
}

TEST(ReplayTraceTest, RepeatPrefixesEchoesEachRequestLater) {
  std::vector<TraceRequest> trace;
  for (uint64_t i = 0; i < 200; ++i) trace.push_back({static_cast<int64_t>(i), {3 * i, 3 * i + 1}});
  const size_t mean = 4;
  std::vector<TraceRequest> echoed = RepeatPrefixes(trace, mean);
  ASSERT_EQ(echoed.size(), 2 * trace.size());
  EXPECT_EQ(RepeatPrefixes(trace, mean).size(), echoed.size());
  std::set<uint64_t> fresh;
  std::vector<size_t> position(trace.size());
  for (size_t j = 0; j < echoed.size(); ++j) {
    const TraceRequest& request = echoed[j];
    if (j > 0) {
      EXPECT_GE(request.timestamp_ms, echoed[j - 1].timestamp_ms);
    }
    ASSERT_EQ(request.blocks.size(), 2u);
    uint64_t first = request.blocks[0];
    if (request.blocks[1] == first + 1) {
      position[first / 3] = j;  // an original request
      continue;
    }
    // An echo: the original's prefix, then a block of its own, after the original and at most
    // 2 * mean originals later.
    EXPECT_GE(request.blocks[1], 599u);  // above every id of the trace
    EXPECT_TRUE(fresh.insert(request.blocks[1]).second);
    size_t original = first / 3;
    EXPECT_GT(j, position[original]);
    size_t originals_between = 0;
    for (size_t k = position[original] + 1; k < j; ++k) {
      if (echoed[k].blocks[1] == echoed[k].blocks[0] + 1) ++originals_between;
    }
    EXPECT_LE(originals_between, 2 * mean);
  }
  EXPECT_EQ(fresh.size(), trace.size());
  // More reuse: every echo hits its prefix in an unbounded cache.
  EXPECT_EQ(SimulatePrefixCache(trace, 0).hit_blocks, 0u);
  EXPECT_EQ(SimulatePrefixCache(echoed, 0).hit_blocks, trace.size());
}

TEST(ReplayPlotTest, ScriptHasEverySeriesAndItsData) {
  HitRatePlot plot{"it's a title",
                   {{"Larder", {{64, 0.25}, {128, 0.3}}, true, false},
                    {"LRU", {{64, 0.26}}, false, false},
                    {"unbounded", {{0, 0.36}, {128, 0.36}}, false, true}}};
  std::string script = HitRateGnuplotScript(plot, "/tmp/out.svg");
  EXPECT_NE(script.find("set output '/tmp/out.svg'"), std::string::npos);
  EXPECT_NE(script.find("set title 'it''s a title'"), std::string::npos);
  EXPECT_NE(script.find("title 'Larder'"), std::string::npos);
  EXPECT_NE(script.find("title 'LRU'"), std::string::npos);
  EXPECT_NE(script.find("dt 2 title 'unbounded'"), std::string::npos);
  EXPECT_NE(script.find("set xlabel"), std::string::npos);
  EXPECT_NE(script.find("set ylabel"), std::string::npos);
  EXPECT_NE(script.find("64 25\n128 30\ne\n"), std::string::npos);
}

ReplayOptions EndToEndOptions() {
  ReplayOptions options;
  options.worker_executable = Bin("larder-bench");
  options.clients = 2;
  options.page_size = 4096;
  options.progress = false;
  options.protocol = "auto";
  return options;
}

// The fixture replayed one request at a time by one client into a pool of `capacity` bytes,
// checked for errors. One client: a read's lease release rides on that client's next call, so
// it reaches the master before the next request's puts evict. A second client would start the
// next request while the first one's release may still be on its way (a few ms later, by
// design), and a put then evicts around the object still leased, which exact LRU would have
// taken.
Result<ReplayResult> ReplayFixtureSequentially(uint64_t capacity) {
  LARDER_ASSIGN_OR_RETURN(std::vector<TraceRequest> requests, LoadTrace(kFixture));
  ReplayOptions options = EndToEndOptions();
  options.capacity = capacity;
  options.clients = 1;
  options.inflight = 1;
  LARDER_ASSIGN_OR_RETURN(ReplayResult result, RunReplay(options, requests, kFixture));
  EXPECT_EQ(result.errors, 0u) << result.first_error;
  EXPECT_EQ(result.wrong_bytes, 0u) << result.first_error;
  return result;
}

TEST(ReplayEndToEndTest, SequentialReplayHitsExactlyTheUnboundedPrefixes) {
  // 256 pages for a footprint of 32: nothing is evicted.
  auto result = ReplayFixtureSequentially(1 << 20);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->missing, 0u);
  EXPECT_EQ(result->requests, 24u);
  EXPECT_EQ(result->block_refs, 96u);
  EXPECT_EQ(result->hit_blocks, 64u);
  EXPECT_EQ(result->computed, 32u);
  EXPECT_EQ(result->capacity_pages, 256u);
  EXPECT_EQ(result->lru_hit_blocks, 64u);
  EXPECT_EQ(result->unbounded_hit_blocks, 64u);
  EXPECT_EQ(result->evictions, 0);
  EXPECT_DOUBLE_EQ(result->hit_rate, 64.0 / 96.0);
}

// A pool of 8 pages for a footprint of 32: the store evicts as it goes and, replayed one request
// at a time, hits exactly what exact LRU of 8 pages hits (20 of 96 blocks), refuses no put, and
// every lease is released.
TEST(ReplayEndToEndTest, SmallPoolHitsAsExactLruDoes) {
  auto result = ReplayFixtureSequentially(8 * 4096);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->capacity_pages, 8u);
  EXPECT_EQ(result->lru_hit_blocks, 20u);
  EXPECT_EQ(result->hit_blocks, result->lru_hit_blocks);
  EXPECT_GE(result->evictions, 32 - 8);
  EXPECT_EQ(result->put_refusals, 0);
  EXPECT_EQ(result->lease_expiries, 0);
  EXPECT_GT(result->lease_hold_p50_ms, 0);
}

TEST(ReplayEndToEndTest, ConcurrentReplayOverTcpVerifiesEveryByte) {
  auto requests = LoadTrace(kFixture);
  ASSERT_TRUE(requests.ok()) << requests.status();
  ReplayOptions options = EndToEndOptions();
  options.capacity = 1 << 20;
  options.protocol = "tcp";  // both clients in flight: requests may race on shared prefixes
  auto result = RunReplay(options, *requests, kFixture);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->inflight, 2);
  EXPECT_EQ(result->errors, 0u) << result->first_error;
  EXPECT_EQ(result->wrong_bytes, 0u) << result->first_error;
  EXPECT_LE(result->hit_blocks, 64u);
  EXPECT_EQ(result->hit_blocks + result->computed, 96u);
}

}  // namespace
}  // namespace larder::bench
