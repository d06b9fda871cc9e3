// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// `larder-bench master`: metadata-only load on a larder-master process (no data moves).
#pragma once

#include <cstdint>
#include <string>

namespace larder::bench {

struct MasterBenchOptions {
  size_t batch = 128;          // keys per RPC
  int threads = 2;             // concurrent callers
  double duration_s = 3;       // per measured operation
  uint64_t objects = 1000000;  // objects inserted for the memory figure
  size_t key_size = 32;
  // Run the master with a cluster token: every call then carries its session's proof.
  bool auth = false;
  // Run the master with --no-local-socket: the callers, on its host, then call over gRPC.
  bool grpc_only = false;
  bool json = false;
  // > 0: instead of the above, time the rebuild of a master from catalogs of this many objects
  // (MasterState::MountSegments, in this process): one client's catalog, then a second client's
  // with the same keys (each object gains a replica). Default 0.
  uint64_t rebuild = 0;
};

// Starts larder-master (found beside larder-bench) and prints the figures. Returns the exit code.
int RunMasterBench(const MasterBenchOptions& options);

}  // namespace larder::bench
