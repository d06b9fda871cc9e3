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
// Device memory (memory = "device"): the KV lives where a serving process keeps it. Each process
// binds device 0 (of the build's device backend: emulated on a machine without one) before its
// engines start; the prefills' PD segments and store segments and the decode's KV buffers are
// that device's memory, and no process touches it with the CPU: the prefills write their PD
// pages through their PD engine from a host buffer, and the decode's engine copies each request's
// pages to a host buffer where they are checked (its latency ends when the pull has landed,
// before that copy). The store's put and get buffers of the prefills stay host memory, where the
// values are made and checked. What changes per engine:
//   - PD engines (prefills and decode): "device," + LARDER_PROTOCOL (else auto), or
//     LARDER_PROTOCOL alone when it names device already. The decode is another host, so its
//     pulls go over a CPU route through pinned staging on both ends: "tcp-staged".
//   - Store engines: a run of store protocol P sets LARDER_STORE_PROTOCOL to "device,P" (P alone
//     when it names device). Between engines of one host the device route outranks every CPU
//     route for device memory, so the prefills' store traffic goes over the device route
//     (imports of each other's device memory) under any P; P only decides how the stores of other
//     hosts would be reached, and there are none here. The tcp run, the host-memory hairpin, has
//     no device-memory counterpart, so the CLI's default with device memory is the one run auto.
//
// Every summary says the memory ("memory"), each process's memory kinds ("memory_kinds", as the
// processes report them; a device run whose memory is not device memory fails to set up), the
// routes the PD bytes took ("pd_bytes_by_route", "pd_routes") and the failures of PD and store
// apart ("pd_failures_total", "store_failures").
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
  // Where the KV lives: "host" (the default), or "device" (see above).
  std::string memory = "host";
};

// Runs every store protocol in turn and prints the results. Returns the process exit code: 0
// when every run finished with a summary (failures are numbers in it, not an exit code), 1 when
// a run could not be set up (with device memory: also when a process's memory is not device
// memory), 2 for bad options.
int RunDeploymentBench(const DeploymentBenchOptions& options);

}  // namespace larder::bench
