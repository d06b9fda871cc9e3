// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// LeaderElection against a real etcd: one leader at a time, prompt hand-over on a clean stop,
// and fencing (a leader cut off from etcd stops serving before anyone else may start).
#include "master/leader_election.h"

#include <gtest/gtest.h>

#include <thread>

#include "etcd/etcd_fixture.h"
#include "etcd/etcd_test_server.h"
#include "transfer/testing/test_util.h"

namespace larder::master {
namespace {

using Role = LeaderElection::Role;
using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;

bool Contains(const Status& status, std::string_view text) {
  return status.message().find(text) != std::string::npos;
}

// Samples two elections until `done` holds or `timeout` passes, failing the test at any moment
// both serve. `b` is sampled first: once b serves, a's deadline is already behind us, so a
// sample of a taken after it must fail (the reverse order could see a late a and an early b).
template <typename Done>
bool SampleUntil(const LeaderElection& a, const LeaderElection& b, Done done,
                 milliseconds timeout) {
  const auto deadline = steady_clock::now() + timeout;
  for (;;) {
    const bool b_serves = b.CheckServing().ok();
    const bool a_serves = a.CheckServing().ok();
    if (a_serves && b_serves) {
      ADD_FAILURE() << "two masters of one cluster served at the same time";
      return false;
    }
    if (done()) return true;
    if (steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
}

class LeaderElectionTest : public etcd::EtcdTest {
 protected:
  LeaderElectionOptions Options(const std::string& address, milliseconds ttl = seconds(2)) {
    LeaderElectionOptions options;
    options.etcd_endpoints = {etcd_->endpoint()};
    options.cluster_id = "election-test";
    options.advertise_address = address;
    options.http_port = 9003;
    options.incarnation = 7;
    options.lease_ttl = ttl;
    return options;
  }

  std::unique_ptr<LeaderElection> Elect(LeaderElectionOptions options) {
    auto election = LeaderElection::Start(std::move(options));
    EXPECT_TRUE(election.ok()) << election.status();
    return election.ok() ? std::move(election).value() : nullptr;
  }

  // `a` (10.0.0.1:50051) once it leads, and `b` (10.0.0.2:50051) once it has found a leader; both
  // null when either step fails (the test has failed then).
  std::pair<std::unique_ptr<LeaderElection>, std::unique_ptr<LeaderElection>> LeaderAndStandby() {
    auto a = Elect(Options("10.0.0.1:50051"));
    if (a == nullptr ||
        !testutil::WaitUntil([&] { return a->role() == Role::kLeader; }, seconds(15))) {
      ADD_FAILURE() << "10.0.0.1:50051 never led";
      return {};
    }
    auto b = Elect(Options("10.0.0.2:50051"));
    if (b == nullptr ||
        !testutil::WaitUntil([&] { return b->leader().has_value(); }, seconds(15))) {
      ADD_FAILURE() << "10.0.0.2:50051 never found a leader";
      return {};
    }
    return {std::move(a), std::move(b)};
  }
};

TEST_F(LeaderElectionTest, OneOfTwoLeadsAndTheOtherNamesIt) {
  std::unique_ptr<LeaderElection> a, b;
  std::tie(a, b) = LeaderAndStandby();
  ASSERT_TRUE(a && b);

  EXPECT_TRUE(a->CheckServing().ok()) << a->CheckServing();
  Status standby = b->CheckServing();
  EXPECT_EQ(standby.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(standby, "larder-master is a standby of cluster election-test")) << standby;
  EXPECT_TRUE(Contains(standby, "the leader is at 10.0.0.1:50051")) << standby;
  EXPECT_EQ(b->role(), Role::kStandby);
  EXPECT_EQ(b->leader()->http_port, 9003);
  EXPECT_EQ(b->leader()->incarnation, 7u);

  // Over more than a lease TTL of keep-alives, the leadership stays where it is.
  const auto until = steady_clock::now() + seconds(3);
  EXPECT_TRUE(SampleUntil(
      *a, *b, [&] { return steady_clock::now() >= until; }, seconds(10)));
  EXPECT_EQ(a->role(), Role::kLeader);
  EXPECT_TRUE(a->CheckServing().ok()) << a->CheckServing();
  EXPECT_EQ(b->role(), Role::kStandby);
}

TEST_F(LeaderElectionTest, ACleanStopHandsOverPromptly) {
  // A long TTL: a hand-over within it cannot come from the lease lapsing.
  auto a = Elect(Options("10.0.0.1:50051", seconds(6)));
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(testutil::WaitUntil([&] { return a->role() == Role::kLeader; }, seconds(15)));
  auto b = Elect(Options("10.0.0.2:50051", seconds(6)));
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(testutil::WaitUntil([&] { return b->leader().has_value(); }, seconds(15)));

  const auto stopped = steady_clock::now();
  a->Stop();
  EXPECT_EQ(a->role(), Role::kStopped);
  Status after = a->CheckServing();
  EXPECT_EQ(after.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(after, "shutting down")) << after;
  ASSERT_TRUE(testutil::WaitUntil([&] { return b->CheckServing().ok(); }, seconds(15)));
  // The old lease could not lapse for another 4 s (it was renewed within the last 2 s).
  EXPECT_LT(steady_clock::now() - stopped, seconds(4));
  EXPECT_EQ(b->role(), Role::kLeader);
  EXPECT_EQ(b->leader()->address, "10.0.0.2:50051");
  a->Stop();  // idempotent
}

TEST_F(LeaderElectionTest, AHungLeaderStopsServingBeforeTheStandbyTakesOver) {
  std::unique_ptr<LeaderElection> a, b;
  std::tie(a, b) = LeaderAndStandby();
  ASSERT_TRUE(a && b);

  a->AbandonForTesting();  // no more keep-alives; its key stays until the lease lapses
  bool a_stopped_first = true;
  steady_clock::time_point a_stopped{};
  ASSERT_TRUE(SampleUntil(
      *a, *b,
      [&] {
        if (a_stopped == steady_clock::time_point{} && !a->CheckServing().ok()) {
          a_stopped = steady_clock::now();
        }
        if (b->CheckServing().ok()) {
          if (a_stopped == steady_clock::time_point{}) a_stopped_first = false;
          return true;
        }
        return false;
      },
      seconds(20)));
  EXPECT_TRUE(a_stopped_first);
  Status lost = a->CheckServing();
  EXPECT_EQ(lost.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(lost, "larder-master lost the leadership of cluster election-test")) << lost;
  EXPECT_TRUE(Contains(lost, "its etcd lease lapsed at")) << lost;
  EXPECT_EQ(a->role(), Role::kFenced);
  EXPECT_EQ(b->role(), Role::kLeader);
}

TEST_F(LeaderElectionTest, ALeaderCutOffFromEtcdFencesItselfWithinItsTtl) {
  std::mutex mu;
  std::vector<Status> lost;
  std::vector<std::string> roles;
  LeaderElectionOptions options = Options("10.0.0.1:50051");
  options.on_lost = [&](const Status& why) {
    std::lock_guard lock(mu);
    lost.push_back(why);
  };
  options.on_role_change = [&](std::string_view role) {
    std::lock_guard lock(mu);
    roles.emplace_back(role);
  };
  auto a = Elect(options);
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(testutil::WaitUntil([&] { return a->CheckServing().ok(); }, seconds(15)));

  const auto cut = steady_clock::now();
  etcd_->Stop();
  // The deadline ran from a keep-alive sent before the cut, so it passes within one TTL.
  ASSERT_TRUE(
      testutil::WaitUntil([&] { return !a->CheckServing().ok(); }, seconds(2) + seconds(2)));
  EXPECT_LE(steady_clock::now() - cut, seconds(2) + milliseconds(500));
  Status fenced = a->CheckServing();
  EXPECT_EQ(fenced.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(fenced, "lost the leadership of cluster election-test")) << fenced;
  EXPECT_TRUE(Contains(fenced, "its etcd lease lapsed at")) << fenced;
  EXPECT_TRUE(Contains(fenced, "etcd unreachable: ")) << fenced;
  EXPECT_EQ(a->role(), Role::kFenced);
  ASSERT_TRUE(testutil::WaitUntil(
      [&] {
        std::lock_guard lock(mu);
        return !lost.empty();
      },
      seconds(10)));
  {
    std::lock_guard lock(mu);
    ASSERT_EQ(lost.size(), 1u);
    EXPECT_TRUE(Contains(lost[0], "lost the leadership of cluster election-test")) << lost[0];
    EXPECT_EQ(roles.front(), "leader");
    EXPECT_EQ(roles.back(), "fenced");
  }

  // etcd comes back (with the old lease, which etcd extends on start): a new master leads once
  // it lapses, and the fenced one never serves again.
  ASSERT_TRUE(etcd_->Restart().ok());
  auto b = Elect(Options("10.0.0.2:50051"));
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(SampleUntil(
      *a, *b, [&] { return b->CheckServing().ok(); }, seconds(20)));
  EXPECT_FALSE(a->CheckServing().ok());
  EXPECT_EQ(a->role(), Role::kFenced);
  std::lock_guard lock(mu);
  EXPECT_EQ(lost.size(), 1u);
}

TEST_F(LeaderElectionTest, APausedEtcdFencesTheLeaderAndAStandbyLeadsAfter) {
  std::unique_ptr<LeaderElection> a, b;
  std::tie(a, b) = LeaderAndStandby();
  ASSERT_TRUE(a && b);

  etcd_->Pause();
  EXPECT_TRUE(SampleUntil(
      *a, *b, [&] { return !a->CheckServing().ok(); }, seconds(5)));
  EXPECT_FALSE(b->CheckServing().ok());
  etcd_->Resume();
  EXPECT_TRUE(SampleUntil(
      *a, *b, [&] { return b->CheckServing().ok(); }, seconds(20)));
  EXPECT_EQ(a->role(), Role::kFenced);
}

TEST(LeaderElectionOptionsTest, RefusesBadOptions) {
  LeaderElectionOptions options;
  options.etcd_endpoints = {"127.0.0.1:1"};
  options.cluster_id = "c";
  options.advertise_address = "127.0.0.1:50051";
  auto good = LeaderElection::Start(options);  // etcd need not answer yet
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ((*good)->role(), Role::kStandby);
  Status standby = (*good)->CheckServing();
  EXPECT_TRUE(Contains(standby, "standby of cluster c; no leader is known yet")) << standby;
  (*good)->Stop();

  auto with = [&](auto change) {
    LeaderElectionOptions copy = options;
    change(copy);
    return LeaderElection::Start(copy).status().code();
  };
  EXPECT_EQ(with([](auto& o) { o.etcd_endpoints.clear(); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(with([](auto& o) { o.etcd_endpoints = {"no-port"}; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(with([](auto& o) { o.cluster_id = "a/b"; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(with([](auto& o) { o.advertise_address.clear(); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(with([](auto& o) { o.lease_ttl = milliseconds(500); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(with([](auto& o) { o.fence_margin = seconds(5); }), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace larder::master
