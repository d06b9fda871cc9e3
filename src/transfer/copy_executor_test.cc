// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// ExecuteCopies, in line and striped over a copy pool: every byte of every slice is copied once,
// each slice is reported once with its own outcome, and the copy function (with whatever it holds,
// e.g. a segment's mapping) is gone before the last slice is reported.
#include "transfer/copy_executor.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <ostream>
#include <set>
#include <thread>
#include <vector>

#include "transfer/testing/test_util.h"

namespace larder::transfer {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kKiB = 1ULL << 10;
constexpr uint64_t kMiB = 1ULL << 20;

// Records each report, and whether the copy function's hold was gone when it came.
class Reports final : public SliceCallback {
 public:
  explicit Reports(std::weak_ptr<int> hold) : hold_(std::move(hold)) {}
  void OnSliceDone(Slice* slice, Status status) override {
    MutexLock lock(mu_);
    reported_.push_back({slice, status, hold_.expired()});
  }
  struct Report {
    Slice* slice;
    Status status;
    bool hold_gone;
  };
  std::vector<Report> reported() const {
    MutexLock lock(mu_);
    return reported_;
  }

 private:
  std::weak_ptr<int> hold_;
  mutable Mutex mu_;
  std::vector<Report> reported_ LARDER_GUARDED_BY(mu_);
};

struct Case {
  const char* name;
  bool pool;
  uint64_t slice_bytes;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class ExecuteCopiesTest : public ::testing::TestWithParam<Case> {};

TEST_P(ExecuteCopiesTest, CopiesEveryByteReportsEachSliceOnceAndLetsGoOfTheCopyFirst) {
  const Case& c = GetParam();
  ThreadPool pool(3, "copy-test");
  if (c.pool) {
    ASSERT_TRUE(testutil::WaitUntil([&] { return pool.idle() == pool.size(); }, 10s));
  }
  constexpr int kSlices = 5;
  std::vector<uint8_t> segment(kSlices * c.slice_bytes);
  testutil::FillPattern(segment.data(), segment.size(), 7);
  std::vector<std::vector<uint8_t>> local(kSlices, std::vector<uint8_t>(c.slice_bytes));
  std::vector<Slice> slices(kSlices);
  std::vector<Slice*> pointers;
  for (int i = 0; i < kSlices; ++i) {
    slices[i].op = TransferOp::kRead;
    slices[i].local = local[i].data();
    slices[i].offset = i * c.slice_bytes;
    slices[i].length = c.slice_bytes;
    pointers.push_back(&slices[i]);
  }
  auto hold = std::make_shared<int>(0);
  Reports reports(hold);
  std::atomic<uint64_t> copied{0};
  Mutex threads_mu;
  std::set<std::thread::id> threads;
  // Slice 3 fails; the others succeed.
  ExecuteCopies(c.pool ? &pool : nullptr, 64 * kKiB, pointers, &reports,
                [hold = std::move(hold), &segment, &copied, &slices, &threads_mu, &threads](
                    Slice* s, uint64_t begin, uint64_t length) -> Status {
                  (void)hold;
                  {
                    MutexLock lock(threads_mu);
                    threads.insert(std::this_thread::get_id());
                  }
                  if (s == &slices[3]) return DataLossError("slice 3 fails");
                  copied.fetch_add(length);
                  CopySliceRange(*s, segment.data(), begin, length);
                  return Status();
                });
  // The striped path reports from the pool's threads; every slice is reported once.
  ASSERT_TRUE(testutil::WaitUntil([&] { return reports.reported().size() >= kSlices; }, 10s));
  std::vector<Reports::Report> reported = reports.reported();
  ASSERT_EQ(reported.size(), static_cast<size_t>(kSlices));
  // Every byte of the slices that succeed, each once (a failed piece ends its slice's copy).
  EXPECT_EQ(copied.load(), (kSlices - 1) * c.slice_bytes);
  EXPECT_TRUE(reported.back().hold_gone) << "the copy function outlived the last report";
  {
    MutexLock lock(threads_mu);
    // In line: the calling thread alone; striped: the caller and the pool's threads.
    if (c.pool) {
      EXPECT_GT(threads.size(), 1u);
    } else {
      EXPECT_EQ(threads.size(), 1u);
    }
  }
  std::vector<int> times(kSlices, 0);
  for (const auto& r : reported) {
    int i = static_cast<int>(r.slice - slices.data());
    ASSERT_GE(i, 0);
    ASSERT_LT(i, kSlices);
    ++times[i];
    if (i == 3) {
      EXPECT_EQ(r.status.code(), StatusCode::kDataLoss) << r.status;
    } else {
      EXPECT_TRUE(r.status.ok()) << r.status;
      EXPECT_EQ(std::memcmp(local[i].data(), segment.data() + i * c.slice_bytes, c.slice_bytes), 0)
          << "slice " << i;
    }
  }
  for (int i = 0; i < kSlices; ++i) EXPECT_EQ(times[i], 1) << "slice " << i;
}

INSTANTIATE_TEST_SUITE_P(Paths, ExecuteCopiesTest,
                         ::testing::Values(Case{"InLine", false, 64 * kKiB},
                                           Case{"Striped", true, 3 * kMiB}),
                         [](const auto& info) { return std::string(info.param.name); });

// A bulk slice is copied in pieces of at most kBulkCopyChunk; a latency slice in one piece, marked
// as latency work of the process while it is copied.
TEST(ExecuteCopiesClassTest, BulkCopiesInBoundedChunksLatencyInOnePiece) {
  constexpr uint64_t kBytes = 3 * kMiB + 5;
  std::vector<uint8_t> segment(kBytes), bulk_local(kBytes), latency_local(kBytes);
  testutil::FillPattern(segment.data(), segment.size(), 11);
  Slice bulk, latency;
  for (Slice* s : {&bulk, &latency}) {
    s->op = TransferOp::kRead;
    s->length = kBytes;
  }
  bulk.local = bulk_local.data();
  latency.local = latency_local.data();
  latency.latency = true;
  struct Piece {
    Slice* slice;
    uint64_t length;
    bool latency_running;
  };
  std::vector<Piece> pieces;
  Reports reports{std::weak_ptr<int>()};
  Slice* both[] = {&bulk, &latency};
  ExecuteCopies(nullptr, 64 * kKiB, both, &reports,
                [&](Slice* s, uint64_t begin, uint64_t length) -> Status {
                  pieces.push_back({s, length, LatencyWorkScope::Running()});
                  CopySliceRange(*s, segment.data(), begin, length);
                  return Status();
                });
  ASSERT_EQ(reports.reported().size(), 2u);
  uint64_t bulk_bytes = 0;
  size_t bulk_pieces = 0, latency_pieces = 0;
  for (const Piece& p : pieces) {
    if (p.slice == &bulk) {
      EXPECT_LE(p.length, kBulkCopyChunk);
      EXPECT_FALSE(p.latency_running);
      bulk_bytes += p.length;
      ++bulk_pieces;
    } else {
      EXPECT_EQ(p.length, kBytes);
      EXPECT_TRUE(p.latency_running);
      ++latency_pieces;
    }
  }
  EXPECT_EQ(bulk_bytes, kBytes);
  EXPECT_EQ(bulk_pieces, (kBytes + kBulkCopyChunk - 1) / kBulkCopyChunk);
  EXPECT_EQ(latency_pieces, 1u);
  EXPECT_FALSE(LatencyWorkScope::Running());
  EXPECT_EQ(std::memcmp(bulk_local.data(), segment.data(), kBytes), 0);
  EXPECT_EQ(std::memcmp(latency_local.data(), segment.data(), kBytes), 0);
}

}  // namespace
}  // namespace larder::transfer
