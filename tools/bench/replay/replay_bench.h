// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// `larder-bench replay`: replays a request trace (bench/replay_trace.h) through the store, as
// prefill workers reusing KV-cache prefix blocks would, and compares the store's hit rate with an
// exact LRU cache and an unbounded cache of the same capacity (bench/lru_sim.h).
//
// Requests go to the client processes (`larder-bench replay-worker`, bench/replay_worker.h)
// round-robin in arrival order: request i to client i mod clients. They are sent strictly in
// arrival order (no request is sent before an earlier one), each client serves one at a time, and
// at most `inflight` are outstanding; with inflight 1 the replay is sequential and its hits are
// deterministic. With `speed` a request is not sent before its arrival time divided by speed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/replay/replay_trace.h"
#include "larder/status.h"

namespace larder::bench {

struct ReplayOptions {
  // JSONL trace; empty: DefaultTracePath().
  std::string trace;
  // "ip:port" of a running larder-master (which should hold no other segments, so that the
  // capacity is the pool's); empty: start a master in this process.
  std::string master;
  // Client processes on this host; each contributes capacity / clients (whole pages).
  int clients = 2;
  // Bytes per block (the trace's 512-token KV blocks, scaled down).
  uint64_t page_size = 64ull << 10;
  // Pool bytes across all clients.
  uint64_t capacity = 1ull << 30;
  // Arrival times are divided by this; 0: send each request as soon as a client is free.
  double speed = 0;
  // Store protocol of the clients: auto | shm | tcp.
  std::string protocol = "auto";
  // Replay only the first N requests; 0: all.
  uint64_t requests = 0;
  // When > 0, the trace with every request's prefix repeated by a second request this many
  // requests later (RepeatPrefixes): more reuse than the trace has.
  uint64_t repeat_prefixes = 0;
  // Requests outstanding at once (at most one per client); 0: as many as clients.
  int inflight = 0;
  // One JSON object per run on stdout instead of a table.
  bool json = false;
  // When set, also replays at several capacities (fractions of the unbounded footprint) and draws
  // hit rate against capacity into this SVG file with gnuplot.
  std::string plot;
  // Program started as `<program> replay-worker ...`; empty: this executable.
  std::string worker_executable;
  // Draw a progress bar with the live hit rate on stderr (when it is a terminal, not with json,
  // and only once a run has taken a second).
  bool progress = true;
  // The disk tier (docs/disk-tier.md): each client holds a directory of its own under this one
  // (removed after the run), with disk_capacity / clients bytes. Empty: memory only.
  std::string disk_path;
  uint64_t disk_capacity = 1ull << 30;
};

// The figures of one replay at one capacity.
struct ReplayResult {
  std::string trace;
  uint64_t requests = 0;
  uint64_t block_refs = 0;
  uint64_t hit_blocks = 0;  // blocks of cached prefixes fetched intact
  uint64_t missing = 0;     // found by exist, evicted before the get: misses
  uint64_t retried = 0;     // gets that failed with Unavailable and were retried once
  uint64_t computed = 0;    // blocks put
  uint64_t errors = 0;      // failed store calls, per block
  uint64_t wrong_bytes = 0;
  std::string first_error;
  std::string retry_reason;  // the first Unavailable that was retried
  double hit_rate = 0;
  uint64_t lru_hit_blocks = 0;
  double lru_hit_rate = 0;
  uint64_t unbounded_hit_blocks = 0;
  double unbounded_hit_rate = 0;
  uint64_t distinct_blocks = 0;  // the unbounded footprint, in pages
  uint64_t page_size = 0;
  uint64_t capacity = 0;  // bytes the clients contribute together (whole pages per client)
  uint64_t capacity_pages = 0;
  // With the disk tier: its bytes, exact LRU's hit rate at memory + disk, and the tier's work
  // (from the embedded master; -1 with an external one).
  uint64_t disk_capacity = 0;
  uint64_t lru_tiered_hit_blocks = 0;
  double lru_tiered_hit_rate = 0;
  int64_t disk_hits = -1;
  int64_t demoted = -1;
  int64_t evicted_without_copy = -1;
  int clients = 0;
  int inflight = 0;
  std::string protocol;
  double speed = 0;  // 0: max
  double seconds = 0;
  double requests_per_s = 0;
  double gbps = 0;  // bytes fetched plus bytes put, per second of the replay
  double p50_ms = 0;
  double p99_ms = 0;
  int64_t evictions = -1;  // evictions by the embedded master; -1 with an external one
  // From the embedded master (-1 with an external one): leases that expired unreleased, puts
  // refused for lack of space, and how long leases were held (from its histogram).
  int64_t lease_expiries = -1;
  int64_t put_refusals = -1;
  double lease_hold_p50_ms = -1;
  double lease_hold_p99_ms = -1;
  // What eviction cost (embedded master): objects examined per evicted object, and the time of
  // one eviction run (one per put batch that needed space).
  double eviction_scanned_per_eviction = -1;
  double eviction_run_p50_us = -1;
  double eviction_run_p99_us = -1;

  // One JSON object.
  std::string ToJson() const;
};

// Replays `requests` once at options.capacity against a fresh set of clients (and a fresh
// embedded master unless options.master is set). `trace_name` is reported as is.
// Errors: InvalidArgument (options), and whatever starting the master or a client reports;
// Internal when a client dies or answers nonsense mid-run. Store errors are counted, not returned.
Result<ReplayResult> RunReplay(const ReplayOptions& options,
                               const std::vector<TraceRequest>& requests,
                               const std::string& trace_name);

// The subcommand: loads the trace, replays it, prints the figures, sweeps and plots with
// options.plot. Returns the exit code (1 when anything failed, errors or wrong bytes included).
int RunReplayBench(const ReplayOptions& options);

}  // namespace larder::bench
