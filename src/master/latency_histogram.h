// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// LatencyHistogram: durations in fixed buckets, for the master's Prometheus histograms (lease
// hold times, eviction runs, disk promotions).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace larder::master {

// Counts of observations in fixed buckets of nanoseconds, for a Prometheus histogram.
// Thread-safe; Observe is a few relaxed atomic adds.
class LatencyHistogram {
 public:
  // Upper bounds of the buckets, in nanoseconds (the last bucket, +Inf, is implicit).
  static constexpr std::array<int64_t, 20> kBounds = {
      10'000,        25'000,        50'000,        100'000,        250'000,
      500'000,       1'000'000,     2'500'000,     5'000'000,      10'000'000,
      25'000'000,    50'000'000,    100'000'000,   250'000'000,    500'000'000,
      1'000'000'000, 2'500'000'000, 5'000'000'000, 10'000'000'000, 30'000'000'000};

  struct Snapshot {
    std::array<uint64_t, kBounds.size() + 1> counts{};  // per bucket, not cumulative
    uint64_t count = 0;
    int64_t sum_ns = 0;
    // The q-quantile (0..1) in nanoseconds, interpolated linearly inside its bucket; 0 when
    // empty. Observations past the last bound are reported as that bound.
    double Quantile(double q) const;
  };

  void Observe(int64_t ns) { Observe(ns, 1); }
  void Observe(int64_t ns, uint64_t times);
  Snapshot Read() const;

 private:
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> counts_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<int64_t> sum_ns_{0};
};

}  // namespace larder::master
