// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// `larder-bench transfer`: READ/WRITE bandwidth and latency of the transfer engine against a
// target on this host (started here) or elsewhere (--target), next to memcpy over the same block
// sizes, working set and thread count, measured in the same run.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "larder/status.h"

namespace larder::bench {

struct TransferBenchOptions {
  std::string transport = "auto";  // auto | local | shm | tcp
  std::vector<std::string> ops = {"read", "write"};
  std::vector<uint64_t> block_sizes = {4 << 10, 64 << 10, 4 << 20, 64 << 20};
  size_t batch = 1;         // requests per Submit
  size_t threads = 1;       // submitting threads (and memcpy threads)
  double duration_s = 2.0;  // per measurement
  uint64_t segment_size = 1ULL << 30;
  uint64_t working_set = 0;  // bytes of the segment swept by offsets; 0: the whole segment
  std::string target;        // "ip:port" of a running `larder-bench target`; empty: start one
  std::string segment_name = "bench";  // the target's segment
  std::string auth_token;
  size_t copy_threads = 0;  // engine copy pool; 0: engine default
  // "device": the target's segment and this side's buffers in device memory (device 0 of the
  // build's device backend), moved by `transport` (a CPU route) through pinned staging on both
  // ends, with the target on another host (its own network namespace where this process may
  // make one, else another host id); every row also measures host memory over the same route
  // to the same place.
  std::string memory = "host";
  bool json = false;
  bool progress = true;  // progress bar on stderr for runs longer than a second
};

struct TransferBenchRow {
  std::string transport;
  std::string route;
  std::string op;
  uint64_t block_size = 0;
  size_t batch = 0;
  size_t threads = 0;
  uint64_t working_set = 0;
  uint64_t requests = 0;
  uint64_t errors = 0;
  double gbps = 0;  // decimal GB/s of payload
  double p50_us = 0;
  double p99_us = 0;
  double memcpy_gbps = 0;
  double ratio_vs_memcpy = 0;
  // --memory device: "device", and host memory's figure over the same route in the same run.
  std::string memory = "host";
  double host_gbps = 0;
  double ratio_vs_host = 0;
  std::string placement;  // --memory device: "netns" or "host-id"

  std::string ToJson() const;
};

// Runs every (op, block size) pair, printing each row as a JSON line (json) or a table at the end.
Result<std::vector<TransferBenchRow>> RunTransferBench(const TransferBenchOptions& options,
                                                       std::ostream& out);

}  // namespace larder::bench
