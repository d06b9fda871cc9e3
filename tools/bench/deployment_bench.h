// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// `larder-bench deployment`: the topology of the same-host RFC (context/) on one machine.
//
//   host A (this network namespace)            host B (a network namespace, veth-joined)
//   ┌────────────────────────────────────┐     ┌──────────────────────────┐
//   │ embedded larder-master (metadata)   │     │ decode: PD TransferEngine │
//   │ prefill-1: StoreClient + PD engine ◄┼─────┼─ pulls KV pages over tcp  │
//   │ prefill-2: StoreClient + PD engine ◄┼─────┼─ (alternating prefills)   │
//   │   ▲ store traffic between them:    │     └──────────────────────────┘
//   │   └ shm (auto) or tcp (the hairpin)│
//   └────────────────────────────────────┘
//
// Each prefill hammers the store (puts its own pages, reads the other's) while the decode pulls
// PD pages from both; every byte read is verified. A run per store protocol (auto, tcp) shows
// what the same-host store traffic does to the decode's PD latency, next to an idle-store
// baseline. Without root (or without netns support) the decode runs in this namespace with
// another LARDER_HOST_ID, so it is still "another host" to the prefills.
//
// Children: deployment_worker.h. Output: a line per second (stdout, or stderr with --json) and a
// summary per run (with --json: one JSON object per line; fields in RunDeploymentBench).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace larder::bench {

struct DeploymentBenchOptions {
  // Seconds of the loaded phase of each run (store hammered while PD runs).
  double duration_s = 10;
  // Seconds of PD with the store idle before it, the baseline of pd_idle_p99_ms. 0: none.
  double idle_baseline_s = 2;
  // Bytes of each prefill's global segment (sparse: 700G works on a small machine).
  uint64_t segment_size = 1ull << 30;
  // Bytes per store page and pages per store batch call.
  uint64_t page_size = 64 * 1024;
  size_t batch = 16;
  // Pages per PD request, bytes per PD page, bytes of each prefill's PD segment.
  size_t pd_pages = 16;
  uint64_t pd_page_size = 64 * 1024;
  uint64_t pd_segment_size = 64ull << 20;
  // Deadline of one PD request, milliseconds.
  int pd_timeout_ms = 2000;
  // PD requests per second the decode starts, like a decode admitting requests at a steady rate:
  // each waits for its start time and its latency counts from that time, so a slow pull also
  // delays the requests due behind it. 0: back to back (a closed loop, whose latency then
  // includes the decode's own load on the link).
  double pd_rate = 200;
  // LARDER_STORE_PROTOCOL of the prefills, one run each, in order.
  std::vector<std::string> store_protocols = {"auto", "tcp"};
  // Seconds into the loaded phase at which the decode / prefill-1 is killed (SIGKILL). < 0: never.
  double kill_decode_after_s = -1;
  double kill_prefill_after_s = -1;
  // Summaries as one JSON object per line on stdout (progress goes to stderr).
  bool json = false;
  // Keep the decode in this namespace even when a network namespace could be made.
  bool no_netns = false;
};

// Runs every store protocol in turn and prints the results. Returns the process exit code: 0
// when every run finished with a summary (failures are numbers in it, not an exit code), 1 when
// a run could not be set up, 2 for bad options.
int RunDeploymentBench(const DeploymentBenchOptions& options);

}  // namespace larder::bench
