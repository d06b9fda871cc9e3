// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/placement.h"

#include <gtest/gtest.h>

namespace larder::master {
namespace {

std::vector<PlacementCandidate> Cluster() {
  return {
      {"remote-empty", false, false, 900, 1000},  // 0
      {"host-half", false, true, 500, 1000},      // 1
      {"mine", true, true, 100, 1000},            // 2
      {"host-empty", false, true, 1000, 1000},    // 3
      {"tiny", false, true, 10, 10},              // 4: can never hold 100 bytes
  };
}

TEST(PlacementTest, LocalHostFirstPrefersOwnProcessThenHostThenFreeRatio) {
  auto order = OrderPlacement(Cluster(), 100, {}, PlacementStrategy::kLocalHostFirst);
  EXPECT_EQ(order, (std::vector<size_t>{2, 3, 1, 0}));
}

TEST(PlacementTest, FreeRatioIgnoresLocality) {
  auto order = OrderPlacement(Cluster(), 100, {}, PlacementStrategy::kFreeRatio);
  EXPECT_EQ(order, (std::vector<size_t>{3, 0, 1, 2}));
}

TEST(PlacementTest, PreferredSegmentsComeFirstInTheirOrder) {
  std::vector<std::string> preferred = {"remote-empty", "unknown", "host-half"};
  auto order = OrderPlacement(Cluster(), 100, preferred, PlacementStrategy::kLocalHostFirst);
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3}));
}

TEST(PlacementTest, SegmentsTooSmallAreLeftOut) {
  auto order = OrderPlacement(Cluster(), 2000, {}, PlacementStrategy::kFreeRatio);
  EXPECT_TRUE(order.empty());
}

}  // namespace
}  // namespace larder::master
