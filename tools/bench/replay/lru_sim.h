// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Offline prefix-cache simulations for `larder-bench replay`: the hits an exact LRU cache and an
// unbounded cache get on a trace, so that the store's eviction can be judged against both.
//
// The model mirrors what the replay does to the store. A request hits the longest prefix of its
// blocks that is cached (a block after a missing one is recomputed anyway); then every block of
// the request is referenced in order: cached ones become the most recently used, missing ones are
// inserted, each insertion into a full cache evicting the least recently used block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "bench/replay/replay_trace.h"

namespace larder::bench {

// The number of leading blocks for which `cached(block)` is true.
size_t LongestPrefix(std::span<const uint64_t> blocks, const std::function<bool(uint64_t)>& cached);

// An exact LRU cache of block ids, or an unbounded one.
// Thread-compatible: one thread at a time.
class PrefixCacheSim {
 public:
  // capacity_blocks: blocks the cache holds; 0: unbounded (never evicts).
  explicit PrefixCacheSim(uint64_t capacity_blocks);

  // References one request's blocks as described above; returns its hits (the cached prefix).
  size_t Access(std::span<const uint64_t> blocks);

  bool Contains(uint64_t block) const { return index_.contains(block); }
  // Blocks cached now.
  size_t size() const { return index_.size(); }

 private:
  const uint64_t capacity_;
  std::list<uint64_t> recency_;  // most recently used first
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> index_;
};

struct SimulatedHits {
  uint64_t block_refs = 0;
  uint64_t hit_blocks = 0;
  uint64_t distinct_blocks = 0;  // blocks ever inserted: the unbounded cache's footprint
  // Hits after each request: cumulative_hits[i] counts requests 0..i.
  std::vector<uint64_t> cumulative_hits;

  double hit_rate() const {
    return block_refs == 0 ? 0 : static_cast<double>(hit_blocks) / static_cast<double>(block_refs);
  }
};

// Runs `requests` in order through a PrefixCacheSim of `capacity_blocks` (0: unbounded).
SimulatedHits SimulatePrefixCache(const std::vector<TraceRequest>& requests,
                                  uint64_t capacity_blocks);

}  // namespace larder::bench
