// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "master/types.h"

namespace larder::master {

// What placement knows about one mounted segment when choosing where a replica goes.
struct PlacementCandidate {
  std::string_view name;
  bool same_process = false;  // the segment belongs to the writing client
  bool same_host = false;     // the segment's host is the writer's host
  uint64_t free_bytes = 0;
  uint64_t capacity = 0;
};

// Returns candidate indices in the order replicas should be tried: the preferred segments first
// (in the order given), then the rest ordered by `strategy`. Candidates too small to ever hold
// `size` bytes are left out. Pure function; the segment table allocates along this order and
// keeps replicas of one object on distinct segments.
std::vector<size_t> OrderPlacement(std::span<const PlacementCandidate> candidates, uint64_t size,
                                   std::span<const std::string> preferred,
                                   PlacementStrategy strategy);

}  // namespace larder::master
