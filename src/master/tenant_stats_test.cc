// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Lookups and gets by tenant: the hit rate a serving engine sees.
#include "master/tenant_stats.h"

#include <gtest/gtest.h>

#include <string>

#include "master/master_state_test_fixture.h"

namespace larder::master {
namespace {

using namespace std::literals;

TEST(TenantStatsTest, TheTenantIsReadFromTheKeysPrefix) {
  EXPECT_EQ(TenantOfKey("k"), "");
  EXPECT_EQ(TenantOfKey(""), "");
  EXPECT_EQ(TenantOfKey("\0t\0k"s), "t");
  EXPECT_EQ(TenantOfKey("\0\0\0k"s), "");  // a default-tenant key that starts with NUL
  EXPECT_EQ(TenantOfKey("\0t"s), std::nullopt);
  EXPECT_EQ(TenantOfKey("\0"s + std::string(kMaxTenantBytes + 1, 't') + "\0k"s), std::nullopt);
}

TEST(TenantStatsTest, AnEngineThatLooksUpFirstIsJudgedByItsLookups) {
  TenantTraffic sglang;  // looks up 10 keys, finds 4, gets the 4
  sglang.lookups = 10;
  sglang.lookup_misses = 6;
  sglang.gets = 4;
  TenantTraffic plain;  // gets 10 keys straight away, 5 miss
  plain.gets = 10;
  plain.get_misses = 5;
  EXPECT_EQ(sglang.asked(), 10u);
  EXPECT_EQ(sglang.found(), 4u);
  EXPECT_EQ(plain.asked(), 10u);
  EXPECT_EQ(plain.found(), 5u);
  auto rate = ServingHitRate({{"a", sglang}, {"b", plain}}, {});
  ASSERT_TRUE(rate.has_value());
  EXPECT_DOUBLE_EQ(*rate, 9.0 / 20.0);
  EXPECT_FALSE(ServingHitRate({}, {}).has_value());
}

TEST(TenantStatsTest, CountsFallingCountAsNothing) {
  TenantTraffic before, after;
  before.lookups = 100;
  before.lookup_misses = 40;
  after.lookups = 10;  // a restart
  after.lookup_misses = 50;
  TenantTraffic delta = after.Since(before);
  EXPECT_EQ(delta.lookups, 0u);
  EXPECT_EQ(delta.lookup_misses, 0u);
}

TEST(TenantStatsTest, TenantsPastTheBoundShareOneRow) {
  TenantCounters counters;
  for (size_t i = 0; i < TenantCounters::kMaxTenants + 10; ++i) {
    TenantTally tally;
    const std::string key = "\0t"s + std::to_string(i) + "\0k"s;
    tally.Lookup(key, i % 2 == 0);
    tally.Get(key, true);
    counters.Merge(tally);
  }
  TenantTally bad;
  bad.Lookup("\0no-end"s, false);
  counters.Merge(bad);
  auto snapshot = counters.Get();
  EXPECT_EQ(snapshot.tenants.size(), TenantCounters::kMaxTenants);
  EXPECT_EQ(snapshot.others.lookups, 11u);
  EXPECT_EQ(snapshot.others.gets, 10u);
  for (const auto& [name, traffic] : snapshot.tenants) {
    EXPECT_EQ(traffic.lookups, 1u) << name;
    EXPECT_EQ(traffic.gets, 1u) << name;
  }
}

class TenantHitRateTest : public MasterStateTest {};

TEST_F(TenantHitRateTest, LookupsAndGetsAreCountedPerTenant) {
  Mount("a", "seg", 1 << 20);
  ASSERT_TRUE(Put("a", "\0t\0hit"s, 4096).ok());
  ASSERT_TRUE(Put("a", "plain", 4096).ok());
  std::vector<std::string_view> lookups = {"\0t\0hit"sv, "\0t\0miss-1"sv, "\0t\0miss-2"sv,
                                           "\0t\0miss-3"sv};
  auto exist = state_.BatchExist("a", lookups);
  ASSERT_TRUE(exist.ok());
  EXPECT_TRUE((*exist)[0].ok());
  EXPECT_EQ((*exist)[1].code(), StatusCode::kNotFound);
  Get("a", "\0t\0hit"s);  // the engine fetches only the hit
  Get("a", "plain");
  Get("a", "absent");

  MasterStats stats = state_.Stats();
  EXPECT_EQ(stats.lookups, 4u);
  EXPECT_EQ(stats.lookup_misses, 3u);
  auto snapshot = state_.TenantStats();
  ASSERT_EQ(snapshot.tenants.size(), 2u);
  EXPECT_EQ(snapshot.tenants[0].first, "");
  EXPECT_EQ(snapshot.tenants[0].second.gets, 2u);
  EXPECT_EQ(snapshot.tenants[0].second.get_misses, 1u);
  EXPECT_EQ(snapshot.tenants[1].first, "t");
  EXPECT_EQ(snapshot.tenants[1].second.lookups, 4u);
  EXPECT_EQ(snapshot.tenants[1].second.lookup_misses, 3u);
  EXPECT_EQ(snapshot.tenants[1].second.gets, 1u);
  // Tenant t's engine found 1 of 4 keys (its gets all hit); the default tenant 1 of 2.
  auto rate = ServingHitRate(snapshot.tenants, snapshot.others);
  ASSERT_TRUE(rate.has_value());
  EXPECT_DOUBLE_EQ(*rate, 2.0 / 6.0);
}

}  // namespace
}  // namespace larder::master
