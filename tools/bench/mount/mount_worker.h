// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The client process of `larder-bench mount` (the hidden `larder-bench mount-worker`): it creates
// a StoreClient (timing the create, which allocates and mounts the segment), prints
// "READY <engine address>", then answers one JSON command per line with one JSON reply per line,
// and exits (unmounting) when stdin closes. Times are measured inside the worker, around the one
// call they name, so that the pipe to the parent is not part of them.
//
// Commands:
//   {"cmd":"info"}
//     -> {"create_ms":t, "segment":name, "address":ip:port, "page_size":n (0: no segment)}
//   {"cmd":"put", "key":K, "size":S, "preferred":segment}
//     -> {"ms":t}                                       a self-checking value (bench/values.h)
//   {"cmd":"prepare", "bytes":N}
//     -> {}            registers and touches a destination buffer of N bytes for later gets
//   {"cmd":"open", "segment":name}
//     -> {"route":"shm", "ms":t}                         the first RouteTo opens the segment
//   {"cmd":"get", "key":K, "size":S}
//     -> {"ms":t, "verified":bool}                      GetInto the prepared buffer
//   {"cmd":"descriptor", "address":ip:port, "segment":name}
//     -> {"page_size":n, "size":n}                      as the owner's engine describes it
// Failures answer {"error":message}.
#pragma once

#include <cstdint>
#include <string>

namespace larder::bench {

struct MountWorkerOptions {
  std::string master;         // larder-master address; empty: LARDER_MASTER
  uint64_t segment_size = 0;  // bytes contributed; 0: none (a pure reader)
  std::string segment_name;   // empty: the client's default
  std::string huge_pages;     // "off", "2m", "1g", "auto"; empty: LARDER_HUGE_PAGES
};

// Runs the command loop; returns the process exit code.
int RunMountWorker(const MountWorkerOptions& options);

}  // namespace larder::bench
