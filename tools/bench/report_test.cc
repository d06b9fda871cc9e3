// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "bench/report.h"

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

}  // namespace
}  // namespace larder::bench
