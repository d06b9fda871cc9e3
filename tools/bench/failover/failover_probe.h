// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The store-worker side of `larder-bench failover`: a mixed loop on a thread of its own that
// puts small batches of fresh keys and gets small batches of stored ones, and remembers when
// each batch started and ended and how it went. The parent kills the master while it runs and
// asks, for the kill's time, when the first put and the first get succeeded afterwards and
// which errors the gap produced.
//
// Times are CLOCK_MONOTONIC nanoseconds (std::chrono::steady_clock on Linux), which every
// process on the host shares, so the parent's kill time and a worker's batch times compare.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "larder/status.h"
#include "larder/store_client.h"

namespace larder::bench {

struct FailoverProbeOptions {
  // Puts go to fresh keys put_prefix + "0", "1", ... (in the client's own segment).
  std::string put_prefix = "probe/";
  // At most this many keys are put; after that the loop only gets (default: 50000), so that the
  // probe's puts never push the stored objects out of a segment sized for them.
  uint64_t max_puts = 50000;
  // Gets read random keys get_prefix + [0, get_count); get_count 0: no gets (default: none).
  std::string get_prefix;
  uint64_t get_count = 0;
  // Bytes per value (default: 4 KiB); every value read is verified (bench/values.h).
  uint64_t value_size = 4096;
  // Keys per batch call (default: 8).
  size_t batch = 8;
  // Pause after each put+get round (default: 5 ms), which bounds the rate of the probe.
  std::chrono::microseconds interval{5000};
  // Put into this segment first (default: the store's placement decides).
  std::string preferred_segment;

  // Reads the fields of a "probe_start" command (same names; interval as "interval_us").
  static FailoverProbeOptions FromJson(const nlohmann::json& command);
};

// Thread-safe: Summary may be called from any thread while the loop runs.
class FailoverProbe {
 public:
  // Registers a buffer with `client` and starts the loop. `client` must outlive the probe.
  // Errors: InvalidArgument (batch or value size 0), and RegisterBuffer's.
  static Result<std::unique_ptr<FailoverProbe>> Start(StoreClient* client,
                                                      FailoverProbeOptions options);
  // Stops the loop (waiting for its batch in flight) and unregisters the buffer.
  ~FailoverProbe();
  FailoverProbe(const FailoverProbe&) = delete;
  FailoverProbe& operator=(const FailoverProbe&) = delete;

  // What happened since `since_ns` (the kill), as JSON:
  //   "first_put_ok_ns", "first_get_ok_ns": end of the first batch that started at or after
  //     since_ns with at least one key done (null: none yet);
  //   "puts_ok", "gets_ok": keys done in batches that started at or after since_ns;
  //   "errors": {"put:<code>" | "get:<code>" | "get:NotFound" | "get:wrong": keys} for batches
  //     that ended at or after since_ns; "first_errors": the first message of each class;
  //   "last_failure_ns": end of the last batch after since_ns with a failed key (null: none);
  //   "before": {"puts_ok", "gets_ok", "failures"} of the batches that ended before since_ns;
  //   "wrong": values read with wrong bytes over the whole run; "puts_left": put budget left;
  //   "now_ns": this call's time.
  nlohmann::json Summary(int64_t since_ns) const;

  // The current CLOCK_MONOTONIC time in nanoseconds (as the fields above).
  static int64_t NowNs();

 private:
  // Keys of one batch that failed one way: a status code name ("Unavailable", "NotFound", ...)
  // or "wrong" (bytes that are not the key's value), and the first such key's message.
  struct Failure {
    std::string kind;
    uint32_t keys = 0;
    std::string message;
  };
  // One batch call and how its keys went.
  struct Batch {
    int64_t start_ns = 0;
    int64_t end_ns = 0;
    bool put = false;
    uint32_t ok = 0;
    std::vector<Failure> failures;
  };
  // Counts one failed key of `batch`.
  static void AddFailure(Batch& batch, std::string kind, const std::string& message);

  FailoverProbe(StoreClient* client, FailoverProbeOptions options);
  void Loop();
  Batch PutBatch();
  Batch GetBatch();
  void Record(Batch batch);

  StoreClient* const client_;
  const FailoverProbeOptions options_;
  std::vector<std::byte> buffer_;  // put slots, then get slots; the loop thread's
  uint64_t next_put_ = 0;          // the loop thread's
  std::mt19937_64 rng_;            // the loop thread's: which stored keys gets read

  mutable std::mutex mu_;
  std::vector<Batch> batches_;  // guarded by mu_
  uint64_t wrong_ = 0;          // guarded by mu_

  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace larder::bench
