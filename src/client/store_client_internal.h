// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Pieces that the StoreClient implementations (store_client.cc, standalone/attach.cc) and
// larder-client's request handling (standalone/attach_connection.cc) share: assembling per-item
// batch results, and the maps of non-overlapping address ranges they keep registered memory in. Not
// part of the public API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>
#include <utility>
#include <vector>

#include "larder/status.h"

namespace larder::client {

// One result per item of a batch: values[i] when statuses[i] is OK, else statuses[i]. The values
// are moved out.
// REQUIRES: values.size() == statuses.size().
template <typename T, typename V>
std::vector<Result<T>> ValuesOrErrors(std::span<const Status> statuses, std::vector<V> values) {
  std::vector<Result<T>> results;
  results.reserve(statuses.size());
  for (size_t i = 0; i < statuses.size(); ++i) {
    if (statuses[i].ok()) {
      results.emplace_back(static_cast<T>(std::move(values[i])));
    } else {
      results.emplace_back(statuses[i]);
    }
  }
  return results;
}

// Puts the results of a call on a subset of a batch back at the places of their items:
// (*results)[index[j]] = done[j].
// REQUIRES: done.size() >= index.size(), and every index[j] < results->size().
template <typename R>
void ScatterResults(std::span<const size_t> index, std::vector<R> done, std::vector<R>* results) {
  for (size_t j = 0; j < index.size(); ++j) (*results)[index[j]] = std::move(done[j]);
}

// Address ranges: `ranges` maps the first byte of each range to a value whose length
// `length_of(value)` gives (by default the value is the length); the ranges never overlap each
// other.

struct ValueIsLength {
  uint64_t operator()(uint64_t length) const { return length; }
};

// Whether [begin, begin + size) overlaps a range of `ranges`.
// REQUIRES: begin + size does not wrap around.
template <typename Map, typename LengthOf = ValueIsLength>
bool OverlapsRange(const Map& ranges, uint64_t begin, uint64_t size, LengthOf length_of = {}) {
  auto next = ranges.lower_bound(begin);
  return (next != ranges.end() && next->first < begin + size) ||
         (next != ranges.begin() &&
          std::prev(next)->first + length_of(std::prev(next)->second) > begin);
}

// The range of `ranges` that holds all of [begin, begin + size), or ranges.end() when none does.
// Safe for any begin and size (nothing wraps around).
template <typename Map, typename LengthOf = ValueIsLength>
typename Map::const_iterator FindEnclosingRange(const Map& ranges, uint64_t begin, uint64_t size,
                                                LengthOf length_of = {}) {
  auto it = ranges.upper_bound(begin);
  if (it == ranges.begin()) return ranges.end();
  --it;
  const uint64_t into = begin - it->first;  // begin >= it->first here
  const uint64_t length = length_of(it->second);
  if (into <= length && size <= length - into) return it;
  return ranges.end();
}

}  // namespace larder::client
