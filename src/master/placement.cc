// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/placement.h"

#include <algorithm>

namespace larder::master {

std::vector<size_t> OrderPlacement(std::span<const PlacementCandidate> candidates, uint64_t size,
                                   std::span<const std::string> preferred,
                                   PlacementStrategy strategy) {
  std::vector<size_t> order;
  order.reserve(candidates.size());
  std::vector<bool> taken(candidates.size(), false);
  for (const std::string& name : preferred) {
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (!taken[i] && candidates[i].name == name && candidates[i].capacity >= size) {
        order.push_back(i);
        taken[i] = true;
      }
    }
  }
  size_t first_ranked = order.size();
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (!taken[i] && candidates[i].capacity >= size) order.push_back(i);
  }
  // Free ratio compared as free_a * cap_b > free_b * cap_a, exact in 128 bits.
  auto more_free = [&](size_t a, size_t b) {
    const PlacementCandidate& x = candidates[a];
    const PlacementCandidate& y = candidates[b];
    unsigned __int128 lhs = static_cast<unsigned __int128>(x.free_bytes) * y.capacity;
    unsigned __int128 rhs = static_cast<unsigned __int128>(y.free_bytes) * x.capacity;
    if (lhs != rhs) return lhs > rhs;
    return a < b;
  };
  auto rank = [&](size_t a) {
    if (strategy == PlacementStrategy::kFreeRatio) return 0;
    return candidates[a].same_process ? 0 : candidates[a].same_host ? 1 : 2;
  };
  std::sort(order.begin() + static_cast<std::ptrdiff_t>(first_ranked), order.end(),
            [&](size_t a, size_t b) {
              if (rank(a) != rank(b)) return rank(a) < rank(b);
              return more_free(a, b);
            });
  return order;
}

}  // namespace larder::master
