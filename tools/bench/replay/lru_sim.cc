// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "bench/replay/lru_sim.h"

#include <unordered_set>

namespace larder::bench {

size_t LongestPrefix(std::span<const uint64_t> blocks,
                     const std::function<bool(uint64_t)>& cached) {
  size_t prefix = 0;
  while (prefix < blocks.size() && cached(blocks[prefix])) ++prefix;
  return prefix;
}

PrefixCacheSim::PrefixCacheSim(uint64_t capacity_blocks) : capacity_(capacity_blocks) {}

size_t PrefixCacheSim::Access(std::span<const uint64_t> blocks) {
  size_t hits = LongestPrefix(blocks, [this](uint64_t block) { return Contains(block); });
  for (uint64_t block : blocks) {
    auto it = index_.find(block);
    if (it != index_.end()) {
      recency_.splice(recency_.begin(), recency_, it->second);
      continue;
    }
    if (capacity_ != 0 && index_.size() >= capacity_) {
      index_.erase(recency_.back());
      recency_.pop_back();
    }
    recency_.push_front(block);
    index_.emplace(block, recency_.begin());
  }
  return hits;
}

SimulatedHits SimulatePrefixCache(const std::vector<TraceRequest>& requests,
                                  uint64_t capacity_blocks) {
  PrefixCacheSim cache(capacity_blocks);
  std::unordered_set<uint64_t> distinct;
  SimulatedHits result;
  result.cumulative_hits.reserve(requests.size());
  for (const TraceRequest& request : requests) {
    result.block_refs += request.blocks.size();
    result.hit_blocks += cache.Access(request.blocks);
    result.cumulative_hits.push_back(result.hit_blocks);
    distinct.insert(request.blocks.begin(), request.blocks.end());
  }
  result.distinct_blocks = distinct.size();
  return result;
}

}  // namespace larder::bench
