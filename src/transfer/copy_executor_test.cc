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
                  copied.fetch_add(length);
                  {
                    MutexLock lock(threads_mu);
                    threads.insert(std::this_thread::get_id());
                  }
                  if (s == &slices[3]) return DataLossError("slice 3 fails");
                  CopySliceRange(*s, segment.data(), begin, length);
                  return Status();
                });
  // The striped path reports from the pool's threads; every slice is reported once.
  ASSERT_TRUE(testutil::WaitUntil([&] { return reports.reported().size() >= kSlices; }, 10s));
  std::vector<Reports::Report> reported = reports.reported();
  ASSERT_EQ(reported.size(), static_cast<size_t>(kSlices));
  EXPECT_EQ(copied.load(), kSlices * c.slice_bytes);
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

}  // namespace
}  // namespace larder::transfer
