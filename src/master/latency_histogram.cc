// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "master/latency_histogram.h"

#include <algorithm>

namespace larder::master {

void LatencyHistogram::Observe(int64_t ns, uint64_t times) {
  if (times == 0) return;
  size_t bucket =
      static_cast<size_t>(std::lower_bound(kBounds.begin(), kBounds.end(), ns) - kBounds.begin());
  counts_[bucket].fetch_add(times, std::memory_order_relaxed);
  count_.fetch_add(times, std::memory_order_relaxed);
  sum_ns_.fetch_add(std::max<int64_t>(ns, 0) * static_cast<int64_t>(times),
                    std::memory_order_relaxed);
}

LatencyHistogram::Snapshot LatencyHistogram::Read() const {
  Snapshot snapshot;
  for (size_t i = 0; i < counts_.size(); ++i) {
    snapshot.counts[i] = counts_[i].load(std::memory_order_relaxed);
    snapshot.count += snapshot.counts[i];
  }
  snapshot.sum_ns = sum_ns_.load(std::memory_order_relaxed);
  return snapshot;
}

double LatencyHistogram::Snapshot::Quantile(double q) const {
  if (count == 0) return 0;
  double rank = std::clamp(q, 0.0, 1.0) * static_cast<double>(count);
  double below = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    double in_bucket = static_cast<double>(counts[i]);
    if (in_bucket > 0 && below + in_bucket >= rank) {
      if (i == kBounds.size()) return static_cast<double>(kBounds.back());
      double lower = i == 0 ? 0 : static_cast<double>(kBounds[i - 1]);
      double upper = static_cast<double>(kBounds[i]);
      return lower + (upper - lower) * std::max(0.0, rank - below) / in_bucket;
    }
    below += in_bucket;
  }
  return static_cast<double>(kBounds.back());
}

}  // namespace larder::master
