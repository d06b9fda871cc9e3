// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/traffic_totals.h"

#include <gtest/gtest.h>

#include "master/master_state_test_fixture.h"

namespace larder::master {
namespace {

TrafficTotals::Counters At(const std::map<TrafficTotals::Key, TrafficTotals::Counters>& totals,
                           std::string_view route, Locality locality) {
  auto it = totals.find({std::string(route), locality});
  EXPECT_NE(it, totals.end()) << route << " " << LocalityName(locality);
  return it == totals.end() ? TrafficTotals::Counters{} : it->second;
}

ClientTraffic Report(std::vector<RouteTrafficReport> routes) {
  ClientTraffic traffic;
  traffic.routes = std::move(routes);
  return traffic;
}

TEST(TrafficTotalsTest, HostOfAnEngineIdDropsThePidAndTheFingerprint) {
  EXPECT_EQ(HostOfEngineId("boot-1-net42/1234/ab12"), "boot-1-net42");
  EXPECT_EQ(HostOfEngineId("rack/7/node/99/ff"), "rack/7/node");  // LARDER_HOST_ID with '/'
  EXPECT_EQ(HostOfEngineId("prefill-a"), "prefill-a");            // not an engine id
  EXPECT_EQ(HostOfEngineId("a/b"), "a/b");
  EXPECT_EQ(HostOfEngineId("/1/2"), "/1/2");
}

TEST(TrafficTotalsTest, EveryRouteAndLocalityIsThereFromTheStart) {
  TrafficTotals totals;
  EXPECT_EQ(totals.totals().size(), kTotalledRoutes.size() * 2);
  for (const auto& [key, counters] : totals.totals()) {
    EXPECT_EQ(counters.bytes, 0u) << key.route;
  }
}

TEST(TrafficTotalsTest, AddsWhatEachReportCountsBeyondTheOneBefore) {
  TrafficTotals totals;
  const ClientTraffic first =
      Report({{"h1/2/b", "shm", 10, 1000, 0}, {"h2/3/c", "tcp", 4, 400, 1}});
  // Grown counters, a new (peer, route) that counts in full, and a route no total keeps apart.
  const ClientTraffic second = Report({{"h1/2/b", "shm", 15, 1500, 0},
                                       {"h2/3/c", "tcp", 6, 700, 1},
                                       {"h1/2/b", "tcp", 3, 300, 2},
                                       {"h2/3/c", "carrier-pigeon", 1, 9, 0}});
  totals.Add("h1/1/a", first, second);
  EXPECT_EQ(At(totals.totals(), "shm", Locality::kSameHost).bytes, 500u);
  EXPECT_EQ(At(totals.totals(), "shm", Locality::kSameHost).requests, 5u);
  EXPECT_EQ(At(totals.totals(), "tcp", Locality::kOtherHost).bytes, 300u);
  EXPECT_EQ(At(totals.totals(), "tcp", Locality::kOtherHost).failures, 0u);
  const TrafficTotals::Counters hairpin = At(totals.totals(), "tcp", Locality::kSameHost);
  EXPECT_EQ(hairpin.bytes, 300u);
  EXPECT_EQ(hairpin.requests, 3u);
  EXPECT_EQ(hairpin.failures, 2u);
  EXPECT_EQ(At(totals.totals(), std::string(kOtherRoute), Locality::kOtherHost).bytes, 9u);

  // A counter that went back adds nothing, and the next growth counts from the new value.
  const ClientTraffic third = Report({{"h1/2/b", "shm", 15, 1200, 0}});
  totals.Add("h1/1/a", second, third);
  totals.Add("h1/1/a", third, Report({{"h1/2/b", "shm", 16, 1300, 0}}));
  EXPECT_EQ(At(totals.totals(), "shm", Locality::kSameHost).bytes, 600u);
}

class TrafficByLocalityTest : public MasterStateTest {};

// Client restarts come and go under one set of series: the totals grow by what moved while the
// master watched, never by what a client's first report brings along, and never go back when a
// client leaves.
TEST_F(TrafficByLocalityTest, RestartedClientsAddOnlyWhatMovedSinceTheirFirstReport) {
  auto bytes = [&](std::string_view route, Locality locality) {
    return At(state_.TrafficByLocality(), route, locality).bytes;
  };
  Mount("host-a/100/k1", "seg-1", 1 << 20);
  ClientTraffic report = Report({{"host-a/200/k2", "tcp", 1, 1 << 20, 0}});
  EXPECT_FALSE(state_.Heartbeat("host-a/100/k1", &report).remount_required);
  EXPECT_EQ(bytes("tcp", Locality::kSameHost), 0u);  // the first report is a baseline
  report = Report({{"host-a/200/k2", "tcp", 2, (1 << 20) + 4096, 0}});
  state_.Heartbeat("host-a/100/k1", &report);
  EXPECT_EQ(bytes("tcp", Locality::kSameHost), 4096u);

  // The client restarts under a new id (new pid, new key): nothing goes back, nothing is counted
  // twice, and the totals keep their keys.
  ASSERT_TRUE(state_.UnmountSegments("host-a/100/k1", {}, /*unregister=*/true).ok());
  EXPECT_EQ(bytes("tcp", Locality::kSameHost), 4096u);
  Mount("host-a/101/k3", "seg-1", 1 << 20);
  report = Report({{"host-b/300/k4", "tcp", 5, 5000, 0}});
  state_.Heartbeat("host-a/101/k3", &report);
  report = Report({{"host-b/300/k4", "tcp", 6, 6000, 0}});
  state_.Heartbeat("host-a/101/k3", &report);
  EXPECT_EQ(bytes("tcp", Locality::kOtherHost), 1000u);
  EXPECT_EQ(bytes("tcp", Locality::kSameHost), 4096u);
  EXPECT_EQ(state_.TrafficByLocality().size(), kTotalledRoutes.size() * 2);
}

}  // namespace
}  // namespace larder::master
