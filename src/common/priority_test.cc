// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Bulk threads give way: LowerThisThreadPriority raises the nice value of the calling thread only,
// a ThreadPool's workers start with their increment, latency threads go below nice 0 where the
// process may, and LatencyWorkScope marks latency work for as long as any scope lives.
#include "common/priority.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <future>
#include <thread>

#include "common/thread_pool.h"

namespace larder {
namespace {

int NiceOfThisThread() {
  errno = 0;
  int nice = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
  EXPECT_EQ(errno, 0);
  return nice;
}

TEST(PriorityTest, LoweringActsOnTheCallingThreadOnly) {
  int before = NiceOfThisThread();
  int lowered = 0;
  std::thread([&] {
    LowerThisThreadPriority(kBulkNice);
    lowered = NiceOfThisThread();
  }).join();
  // Nice values stop at 19.
  EXPECT_EQ(lowered, std::min(before + kBulkNice, 19));
  EXPECT_EQ(NiceOfThisThread(), before);
}

TEST(PriorityTest, PoolWorkersStartWithTheirIncrement) {
  int before = NiceOfThisThread();
  ThreadPool bulk(2, "test-bulk", kBulkNice);
  ThreadPool plain(1, "test-plain");
  std::promise<int> bulk_nice, plain_nice;
  bulk.Schedule([&] { bulk_nice.set_value(NiceOfThisThread()); });
  plain.Schedule([&] { plain_nice.set_value(NiceOfThisThread()); });
  EXPECT_EQ(bulk_nice.get_future().get(), std::min(before + kBulkNice, 19));
  EXPECT_EQ(plain_nice.get_future().get(), before);
}

TEST(PriorityTest, LatencyThreadsRiseWherePermitted) {
  int before = NiceOfThisThread();
  int raised = 0;
  std::thread([&] {
    RaiseThisThreadPriority();
    raised = NiceOfThisThread();
  }).join();
  if (geteuid() == 0) {
    EXPECT_EQ(raised, kLatencyNice);  // root may
  } else {
    EXPECT_TRUE(raised == kLatencyNice || raised == before) << raised;
  }
  EXPECT_EQ(NiceOfThisThread(), before);
}

TEST(PriorityTest, LatencyWorkRunsWhileAnyScopeLives) {
  EXPECT_FALSE(LatencyWorkScope::Running());
  {
    LatencyWorkScope outer;
    EXPECT_TRUE(LatencyWorkScope::Running());
    {
      LatencyWorkScope inner;
      EXPECT_TRUE(LatencyWorkScope::Running());
    }
    EXPECT_TRUE(LatencyWorkScope::Running());
    YieldToLatencyWork();  // steps aside and returns
  }
  EXPECT_FALSE(LatencyWorkScope::Running());
  YieldToLatencyWork();
}

}  // namespace
}  // namespace larder
