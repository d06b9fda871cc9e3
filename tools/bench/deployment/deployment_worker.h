// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The child processes of `larder-bench deployment` (see deployment_bench.h): a prefill on "host A"
// and the decode on "host B". Both are spawned with ChildProcess, announce
//   READY {"name":..., "pd":"<ip:port of the PD engine>", ...}
// print one JSON line of cumulative counters per second on stdout, take one JSON command per line
// on stdin, and on {"cmd":"quit"} (or stdin EOF) print a last line with "final":true and exit.
//
// Prefill (`deployment-prefill`): a StoreClient contributing a global segment, and a standalone
// PD TransferEngine (role kPd: --pd-protocol, else LARDER_PROTOCOL) exporting segment
// "pd" whose page i of `pd_page_size` bytes holds FillValue("pd/<name>/<i>"). While loaded it
// puts pages "<name>/<seq>" (seq = 0, 1, ...) in batches, and between batches reads a batch of the
// other prefill's pages, chosen at random among the most recent ones it has written (half a
// segment's worth); every byte read is verified. NotFound (evicted) counts as "missing", not a
// failure. Commands:
//   {"cmd":"peer", "name":N, "client_id":engine id}  the other prefill (for reads and per-peer tcp)
//   {"cmd":"hw", "written":n}                        the other prefill has put pages [0, n)
//   {"cmd":"load", "on":bool}                        start / stop hammering the store; "off"
//                                                    waits for the batch in flight to end, then
//                                                    prints a line with "load_stopped":true
//   {"cmd":"peer_gone"}                              stop reading the other prefill's pages
//   {"cmd":"quit"}
// With --device-memory the process binds device 0 first; the PD segment is device memory of the PD
// engine (whose protocol must name device), written through that engine from a host buffer, and
// the store segment is device memory when LARDER_STORE_PROTOCOL names device. The store's put and
// get buffers stay host memory, where the values are made and checked. READY then says which
// memory each segment is: "pd_memory" and "store_memory" (MemoryKindName).
// Line: {"role":"prefill", "name", "t", "puts", "put_bytes", "gets", "get_bytes", "missing",
//   "verified_bytes", "wrong", "written", "failures":{"put.<code>" | "get.<code>" | "get.wrong":
//   n}, "first_error", "bytes_by_route":
//   {route: bytes}, "requests_by_route":{route: n} (every route of the store engine's counters,
//   "tcp-staged" among them), "same_host_tcp_bytes" (tcp and tcp-staged to the other prefill),
//   "mapped_segments", "load_stopped" (a "load off" has been done: no store call in flight),
//   "final"}
//
// Decode (`deployment-decode`): a standalone TransferEngine with registered local buffers. For
// each request it reads `pd_pages` random pages of one prefill's "pd" segment (prefills taken in
// turn) with a deadline, verifies them and records the latency. With a rate, requests start on a
// fixed schedule and latency counts from the scheduled start (no coordinated omission). A failed
// request counts under
// "<prefill>.<status code>" and its message names the prefill. With --device-memory the process
// binds device 0 first and its KV buffers (one page per request slot) are device memory of its
// engine (whose protocol must name device), exported as its segment "kv" so that the engine can
// copy them over the device route: pulls land there, staged through pinned host buffers
// for a CPU route ("tcp-staged"); each request's latency ends when its pull has landed, and then
// the engine copies the pages to a host buffer, where they are verified, and clears the head of
// each slot through the engine, so that a pull that moves nothing fails the next check. Host
// memory: latency ends after the check, as before. READY says which memory the buffers are
// ("memory"). Commands:
//   {"cmd":"phase", "phase":name}   counters from now on go to this phase (the first is "idle")
//   {"cmd":"quit"}
// Line: {"role":"decode", "t", "phase", "phases":{name: {"transfers", "bytes", "verified_bytes",
//   "wrong", "failures", "failures_by_kind":{kind: n}, "by_prefill":{name: {"transfers",
//   "failures", "codes":{code: n}, "first_error", "fail_max_ms"}}, "lat_ms":[latencies of
//   requests that ended since the last line], "routes":{route: requests},
//   "bytes_by_route":{route: bytes of completed requests}}}, "final"}
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace larder::bench {

struct DeploymentPrefillOptions {
  // "prefill-1"; also the key prefix and the store segment's name.
  std::string name = "prefill";
  // larder-master address. Empty: LARDER_MASTER.
  std::string master;
  // Bytes of the global segment (sparse: only written pages cost memory).
  uint64_t segment_size = 1ull << 30;
  // Bytes per KV page put into and read from the store.
  uint64_t page_size = 64 * 1024;
  // Pages per BatchPutFrom / BatchGetInto.
  size_t batch = 16;
  // Address of the PD engine's data server ("10.231.0.1:0").
  std::string pd_listen = "127.0.0.1:0";
  // Bytes of the exported PD segment and of one PD page in it.
  uint64_t pd_segment_size = 64ull << 20;
  uint64_t pd_page_size = 64 * 1024;
  // Protocol of the PD engine. Empty: LARDER_PROTOCOL, else auto.
  std::string pd_protocol;
  // The PD segment in device memory (device 0, bound first); see above. False: host memory.
  bool device_memory = false;
};

struct DeploymentDecodeOptions {
  // Address of the decode engine's data server ("10.231.0.2:0").
  std::string listen = "127.0.0.1:0";
  // "name=ip:port" of each prefill's PD engine.
  std::vector<std::string> prefills;
  // Pages per request and bytes per page.
  size_t pd_pages = 16;
  uint64_t pd_page_size = 64 * 1024;
  // Deadline of one request.
  std::chrono::milliseconds timeout{2000};
  // Requests started per second, on a fixed schedule; latency counts from the scheduled start.
  // 0: back to back.
  double rate = 0;
  // Protocol of the engine. Empty: LARDER_PROTOCOL, else auto.
  std::string protocol;
  // The KV buffers in device memory (device 0, bound first); see above. False: host memory.
  bool device_memory = false;
};

// Run the child; return the process exit code.
int RunDeploymentPrefill(const DeploymentPrefillOptions& options);
int RunDeploymentDecode(const DeploymentDecodeOptions& options);

}  // namespace larder::bench
