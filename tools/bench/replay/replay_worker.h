// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// `larder-bench replay-worker`: one store client process of `larder-bench replay`, standing in for
// a prefill worker. It mounts a segment, prints "READY <segment name>", then serves one request
// per stdin line and answers with one JSON line, and exits (unmounting) when stdin closes.
//
//   {"blocks":[id, ...]}
//     -> {"hits":n, "exist":n, "computed":n, "missing":n, "retried":n, "errors":n,
//         "wrong_bytes":n, "first_error":s, "retry_reason":s, "ms":t}
//
// For each request: BatchExist on the block keys (BlockKey) gives the cached prefix (blocks before
// the first missing one); one BatchGetInto fetches it into a registered buffer and every byte is
// verified (bench/values.h, keyed by the block key); the remaining blocks are filled and stored
// with one BatchPutFrom. `hits` counts the leading blocks fetched intact. A block that exists but
// is gone when fetched (evicted in between) is `missing`: a miss, recomputed, not an error. A get
// that fails with Unavailable (retry the call: e.g. the read lease ran out during the copy) is
// retried once and counted in `retried`; only a second failure is an error.
// `computed` counts the blocks put (some may already be stored again by then; the store keeps
// those and counts the put as a reference). `ms` is the time spent in the three store calls.
#pragma once

#include <cstdint>
#include <string>

namespace larder::bench {

struct ReplayWorkerOptions {
  std::string master;                    // larder-master address; empty: LARDER_MASTER
  std::string protocol;                  // store protocol; empty: the environment's, else auto
  uint64_t segment_size = 256ull << 20;  // bytes contributed to the pool
  std::string segment_name;              // empty: chosen by the client
  uint64_t page_size = 64ull << 10;      // bytes per block
  int device = -1;                       // the device its thread binds to first (-1: none)
};

// Runs the request loop; returns the process exit code.
int RunReplayWorker(const ReplayWorkerOptions& options);

}  // namespace larder::bench
