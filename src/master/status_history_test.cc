// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/status_history.h"

#include <gtest/gtest.h>

namespace larder::master {
namespace {

StatusSample At(int64_t seconds) {
  StatusSample sample;
  sample.unix_ms = 1'700'000'000'000 + seconds * 1000;
  sample.steady_ns = seconds * 1'000'000'000;
  return sample;
}

TEST(StatusHistoryTest, RatesAreTheCountersDifferencedOverTheInterval) {
  StatusSample before = At(10);
  before.puts = 100;
  before.gets = 50;
  before.get_misses = 10;
  before.removes = 5;
  before.evictions = 7;
  StatusSample after = At(12);
  after.puts = 140;
  after.gets = 90;
  after.get_misses = 20;  // 10 of the 40 gets missed
  after.removes = 5;
  after.evictions = 11;
  after.objects = 3;
  after.bytes_used = 4096;
  after.bytes_capacity = 8192;
  StatusPoint point = Between(before, after);
  EXPECT_EQ(point.unix_ms, after.unix_ms);
  EXPECT_DOUBLE_EQ(point.seconds, 2.0);
  EXPECT_DOUBLE_EQ(point.puts_per_s, 20.0);
  EXPECT_DOUBLE_EQ(point.gets_per_s, 20.0);
  EXPECT_DOUBLE_EQ(point.removes_per_s, 0.0);
  EXPECT_DOUBLE_EQ(point.ops_per_s, 40.0);
  EXPECT_DOUBLE_EQ(point.evictions_per_s, 2.0);
  ASSERT_TRUE(point.get_hit_rate.has_value());
  EXPECT_DOUBLE_EQ(*point.get_hit_rate, 0.75);
  EXPECT_EQ(point.objects, 3u);
  EXPECT_EQ(point.bytes_used, 4096u);
  EXPECT_EQ(point.bytes_capacity, 8192u);
}

TEST(StatusHistoryTest, TheHitRateIsTheEnginesLookupsWhereTheyLookUp) {
  TenantTraffic looks_up, gets_only;
  looks_up.lookups = 100;
  looks_up.lookup_misses = 50;
  looks_up.gets = 50;
  gets_only.gets = 10;
  StatusSample before = At(0);
  before.tenants.tenants = {{"a", looks_up}, {"b", gets_only}};
  // In the interval: tenant a looked up 20 keys and found 5 (and got those 5, all hits); tenant
  // b got 10 keys and 5 missed; tenant c, new, got 4 and all hit.
  looks_up.lookups += 20;
  looks_up.lookup_misses += 15;
  looks_up.gets += 5;
  gets_only.gets += 10;
  gets_only.get_misses += 5;
  TenantTraffic fresh;
  fresh.gets = 4;
  StatusSample after = At(1);
  after.tenants.tenants = {{"a", looks_up}, {"b", gets_only}, {"c", fresh}};
  StatusPoint point = Between(before, after);
  ASSERT_TRUE(point.hit_rate.has_value());
  EXPECT_DOUBLE_EQ(*point.hit_rate, (5.0 + 5.0 + 4.0) / (20.0 + 10.0 + 4.0));
}

TEST(StatusHistoryTest, NoGetsMeansNoHitRateAndCountersThatDropCountAsNothing) {
  StatusSample before = At(0);
  before.puts = 1000;  // a master restart starts its counters over
  StatusSample after = At(1);
  after.puts = 10;
  StatusPoint point = Between(before, after);
  EXPECT_FALSE(point.hit_rate.has_value());
  EXPECT_DOUBLE_EQ(point.puts_per_s, 0.0);
}

TEST(StatusHistoryTest, RouteBytesAreDifferencedPerClientAndSummedPerRoute) {
  StatusSample before = At(0);
  before.client_route_bytes[{"a", "shm"}] = 1000;
  before.client_route_bytes[{"b", "shm"}] = 500;
  before.client_route_bytes[{"b", "tcp"}] = 9000;
  StatusSample after = At(2);
  after.client_route_bytes[{"a", "shm"}] = 3000;  // +2000
  after.client_route_bytes[{"b", "shm"}] = 1500;  // +1000
  after.client_route_bytes[{"b", "tcp"}] = 100;   // b restarted: nothing, not a negative rate
  after.client_route_bytes[{"c", "shm"}] = 1e9;   // first seen: its past is not this interval's
  StatusPoint point = Between(before, after);
  EXPECT_DOUBLE_EQ(point.route_bytes_per_s["shm"], 1500.0);
  EXPECT_DOUBLE_EQ(point.route_bytes_per_s["tcp"], 0.0);
}

TEST(StatusHistoryTest, KeepsTheLastSamplesInOrder) {
  StatusHistory history(3);
  EXPECT_TRUE(history.Points().empty());
  EXPECT_FALSE(history.Latest().has_value());
  for (int64_t s = 0; s < 5; ++s) {
    StatusSample sample = At(s);
    sample.puts = static_cast<uint64_t>(s * s);
    history.Record(sample);
  }
  history.Record(At(4));  // not later than the last: ignored
  std::vector<StatusPoint> points = history.Points();
  ASSERT_EQ(points.size(), 2u);  // three samples: 2, 3, 4
  EXPECT_DOUBLE_EQ(points[0].puts_per_s, 5.0);
  EXPECT_DOUBLE_EQ(points[1].puts_per_s, 7.0);
  ASSERT_TRUE(history.Latest().has_value());
  EXPECT_DOUBLE_EQ(history.Latest()->puts_per_s, 7.0);
}

}  // namespace
}  // namespace larder::master
