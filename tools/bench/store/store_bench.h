// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// `larder-bench store`: puts and gets through the store across client processes.
#pragma once

#include <cstdint>
#include <string>

namespace larder::bench {

struct StoreBenchOptions {
  std::string master;  // "ip:port" of a running master; empty: start one in this process
  int clients = 2;     // client processes, each contributing segment_size
  // Clients that run the measured operation (0: all). The others only contribute their segments,
  // so `--clients 2 --active 1` is one process reading another's segment, as `transfer` measures.
  int active = 0;
  uint64_t segment_size = 1ull << 30;
  std::string ops = "put,get";  // comma list of put | get | mixed
  std::string value_sizes = "4K";
  size_t batch = 128;
  double duration_s = 5;
  std::string protocol = "auto";  // store protocol of the clients: auto | shm | tcp
  uint64_t working_set = 0;       // bytes per client that gets read; 0: min(segment/2, 256M)
  bool zero_copy = true;          // PutFrom/GetInto with registered buffers (else Put/Get)
  bool json = false;
};

// Prints one JSON object per (op, value size) with --json, else a table. Returns the exit code.
int RunStoreBench(const StoreBenchOptions& options);

}  // namespace larder::bench
