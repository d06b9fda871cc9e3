// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "bench/common/report.h"

#include <gtest/gtest.h>

namespace larder::bench {
namespace {

TEST(PercentileTest, NearestRank) {
  std::vector<double> samples = {5, 1, 4, 2, 3};
  EXPECT_EQ(Percentile(samples, 50), 3);
  EXPECT_EQ(Percentile(samples, 100), 5);
  EXPECT_EQ(Percentile(samples, 0), 1);
  std::vector<double> hundred;
  for (int i = 1; i <= 100; ++i) hundred.push_back(i);
  EXPECT_EQ(Percentile(hundred, 99), 99);
  std::vector<double> none;
  EXPECT_EQ(Percentile(none, 50), 0);
}

TEST(TableTest, AlignsColumns) {
  Table t({"name", "value"});
  t.AddRow({"a", "1.5"});
  t.AddRow({"longer", "10.25"});
  EXPECT_EQ(t.ToString(),
            "name    value\n"
            "-------------\n"
            "a         1.5\n"
            "longer  10.25\n");
}

TEST(JsonU64Test, ReadsCountsAndTreatsAnythingElseAsNone) {
  nlohmann::json reply = {{"puts", 12}, {"name", "a"}, {"none", nullptr}};
  EXPECT_EQ(JsonU64(reply, "puts"), 12u);
  EXPECT_EQ(JsonU64(reply, "name"), 0u);
  EXPECT_EQ(JsonU64(reply, "none"), 0u);
  EXPECT_EQ(JsonU64(reply, "absent"), 0u);
}

}  // namespace
}  // namespace larder::bench
