// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Request traces for `larder-bench replay`: one JSON object per line with the arrival time in
// milliseconds (`timestamp`) and the ids of the request's prefix blocks (`hash_ids`), as in the
// FAST'25 Mooncake trace release. Equal ids are the same KV block; a request's blocks form a
// prefix chain (block i is only reusable when blocks 0..i-1 are).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "larder/status.h"

namespace larder::bench {

struct TraceRequest {
  int64_t timestamp_ms = 0;      // arrival, from the start of the trace
  std::vector<uint64_t> blocks;  // prefix block ids, in order; no id twice
};

// Reads `path` and returns its first `max_requests` requests in arrival order (0: all); the sort
// is stable, so requests that arrive together keep their file order. Other fields of
// a line are ignored. Errors: NotFound (no such file), InvalidArgument naming the line (not JSON,
// no `hash_ids` array of non-negative integers, a block id repeated within one request).
Result<std::vector<TraceRequest>> LoadTrace(const std::string& path, uint64_t max_requests = 0);

// Where docs/replay.md's fetch command puts Mooncake's FAST'25 conversation trace, relative to
// the repository root (git ignores it).
inline constexpr char kFetchedTracePath[] = "bench/traces/conversation_trace.jsonl";

// The trace used when none is named: $LARDER_TRACE when set, else kFetchedTracePath (relative to
// the working directory) when that file exists, else "".
std::string DefaultTracePath();

// The store key of block `id`: "blk/<id>".
std::string BlockKey(uint64_t id);

// Sum of the requests' block counts.
uint64_t CountBlockRefs(const std::vector<TraceRequest>& requests);

// A trace with more reuse than `requests`: each request is followed, some requests later, by a
// second one that shares its prefix (every block but the last) and ends in a block of its own, as
// a follow-up turn or a retried request would. How much later is drawn uniformly from
// 1..2*mean_distance (a fixed seed: the same trace every time), so that the reuse distances
// spread and the hit rate grows smoothly with capacity; an echo arrives with the request it
// follows. REQUIRES: mean_distance > 0.
std::vector<TraceRequest> RepeatPrefixes(const std::vector<TraceRequest>& requests,
                                         size_t mean_distance);

}  // namespace larder::bench
