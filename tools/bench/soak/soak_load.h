// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The store-worker side of `larder-bench soak`: a loop on a thread of its own that runs mixed
// batches of puts of fresh keys, gets of stored keys (its own and its peers') and removes of its
// own keys, and verifies every value it reads. Value sizes vary per key (the size follows from the
// key, so a reader knows what to expect) and the segments are small, so eviction never rests.
//
// The parent polls Status about once a second. It relays the peers' key ranges with each poll
// and decides from each failure's time whether a fault it injected explains it; the loop only
// records what happened, when. Times are CLOCK_MONOTONIC nanoseconds (FailoverProbe::NowNs),
// which every process of the host shares.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
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

struct SoakLoadOptions {
  // This worker's keys are prefix + "0", "1", ...; each is put once (default: "soak/").
  std::string prefix = "soak/";
  // Value sizes, from the key's hash, in [min_value, max_value] (default: 1 KiB to 64 KiB).
  uint64_t min_value = 1024;
  uint64_t max_value = 64 * 1024;
  // Keys per batch call (default: 8).
  size_t batch = 8;
  // Shares of the batches that get and that remove; the rest put (default: 0.6 and 0.05).
  double get_share = 0.6;
  double remove_share = 0.05;
  // Gets read among the last `recent` keys of a writer (default: 2048; 0: all its keys), which a
  // cache of the segments' size mostly still holds.
  uint64_t recent = 2048;
  // Pause after each batch (default: 1 ms), which bounds the worker's rate.
  std::chrono::microseconds interval{1000};
  uint64_t seed = 1;

  // Reads the fields of a "soak_start" command (same names; interval as "interval_us").
  static Result<SoakLoadOptions> FromJson(const nlohmann::json& command);
  // The value size of `key`.
  uint64_t ValueSize(const std::string& key) const;
};

// Thread-safe: SetPeers and Status may be called from any thread while the loop runs.
class SoakLoad {
 public:
  // Registers a buffer with `client` and starts the loop. `client` must outlive the load.
  // Errors: InvalidArgument (bad options), and RegisterBuffer's.
  static Result<std::unique_ptr<SoakLoad>> Start(StoreClient* client, SoakLoadOptions options);
  // Stops the loop (waiting for its batch in flight) and unregisters the buffer.
  ~SoakLoad();
  SoakLoad(const SoakLoad&) = delete;
  SoakLoad& operator=(const SoakLoad&) = delete;

  // The key prefixes of the peers and how many keys each has put; gets read from these and from
  // this worker's own keys.
  void SetPeers(std::map<std::string, uint64_t> peers);

  // Counts since the start ("ops", "puts", "gets", "removes": keys done; "missing": gets of keys
  // not stored, a cache's normal miss; "busy": removes of keys a reader held; "wrong_keys" and
  // "wrong_bytes": values read that were not the key's value; "errors": {"put:<code>" ...: keys};
  // "next": keys put so far) and "failures": what failed since the previous call, each
  // {"t0_ns", "t_ns", "op", "code", "keys", "message"}: failures of one kind in a row within
  // kFailureSpanNs are one entry, from the start of the first failed batch (t0_ns) to the end of
  // the last (t_ns; at most kMaxFailures entries; "failures_dropped" counts the batches left out).
  // A batch's span starts when it was sent: a call that times out failed from its start. Wrong
  // values are failures too, with code "wrong".
  nlohmann::json Status();

  static constexpr size_t kMaxFailures = 4096;
  static constexpr int64_t kFailureSpanNs = 100'000'000;

 private:
  SoakLoad(StoreClient* client, SoakLoadOptions options);
  void Loop();
  void Put();
  void Get();
  void Remove();
  // Records a failed batch's keys of one kind; the batch was sent at started_ns.
  void Fail(const char* op, std::string code, uint32_t keys, const std::string& message,
            int64_t started_ns);

  StoreClient* const client_;
  const SoakLoadOptions options_;
  std::vector<std::byte> buffer_;  // one slot of max_value per key of a batch; the loop's
  std::mt19937_64 rng_;            // the loop thread's

  std::atomic<uint64_t> next_{0};  // keys put (or tried) so far
  std::atomic<bool> stop_{false};

  std::mutex mu_;
  std::map<std::string, uint64_t> peers_;  // guarded by mu_
  nlohmann::json counts_;                  // guarded by mu_
  nlohmann::json failures_;                // guarded by mu_: since the last Status
  uint64_t failures_dropped_ = 0;          // guarded by mu_

  std::thread thread_;
};

}  // namespace larder::bench
