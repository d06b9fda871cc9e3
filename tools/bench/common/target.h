// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// A benchmark target: an engine that exports one segment and serves it until its parent goes away.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/child_process.h"
#include "larder/status.h"

namespace larder::bench {

struct TargetOptions {
  std::string listen_address = "127.0.0.1:0";  // data server address
  uint64_t segment_size = 1ULL << 30;          // bytes exported
  std::string segment_name = "bench";
  std::string protocol = "auto";  // "auto" also serves shm handoffs
  std::string auth_token;         // empty: LARDER_AUTH_TOKEN or none
  bool huge_pages = false;
  uint8_t fill = 0x5a;  // every byte of host memory segments starts with this value
  // Binds this (emulated or CUDA) device before the engine's first allocation, so that a protocol
  // with "device" exports device memory; -1: none.
  int device = -1;
  // After "READY <address>", also print one JSON object describing what is served: address,
  // segment_name, segment_size, page_size, protocol.
  bool json = false;
};

// Creates the engine and segment, prints "READY <address>" (and, with options.json, the JSON
// announcement), and serves until stdin closes or SIGTERM/SIGINT. REQUIRES:
// BlockTerminationSignals() ran first.
Status RunTarget(const TargetOptions& options);

// Starts `<this executable> target ...` with `options` and extra environment `env`, behind
// `prefix` (e.g. NetworkNamespace::ExecPrefix(), to run it in another namespace).
Result<ChildProcess> SpawnTarget(const TargetOptions& options,
                                 const std::map<std::string, std::string>& env = {},
                                 const std::vector<std::string>& prefix = {});

}  // namespace larder::bench
