// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// `larder-bench soak`: a store under churn and faults for a long time.
//
// A larder-master process and --clients store clients (`larder-bench store-worker` processes,
// each with its own small segment, so that eviction never rests) run the mixed load of
// bench/soak_load.h: puts of fresh keys with sizes that vary per key, gets of their own and the
// other clients' keys, every value verified, and removes. After --warmup, every --fault-every
// seconds one fault is injected, in turn from --faults (the first of each cycle chosen by
// --seed):
//   client_kill     SIGKILL of a random client, then a new process with its segment name
//   master_restart  SIGKILL of the master, then a new one on the same port (the clients bring
//                   their catalogs back)
//   master_pause    SIGSTOP of the master for the clients' TTL plus 2 s, then SIGCONT
//   peer_stall      SIGSTOP of a random client for --stall seconds (less than the TTL), then
//                   SIGCONT: the others' reads from it wait or fail over
// An error is expected when it happened during a fault or within --grace seconds after it ended
// (a dead peer's keys, a master away); any other error is unexpected, and so is every value with
// wrong bytes, whenever it is read. Gets of keys that are not stored (evicted, removed, lost with
// a dead client) are misses, not errors. Every second the bench reads the RSS and open fds of
// every process; growth is counted from each process's state --warmup seconds after it started.
//
// Output: a line every 10 s (stderr with --json) and a summary; with --json, one object with
//   duration_s, clients, ops, ops_per_s, puts, gets, removes, missing, faults_injected (count),
//   faults (each {"kind", "at_s", "target", "took_s"}), faults_by_kind, wrong_bytes, wrong_keys,
//   expected_errors, unexpected_errors, errors_by_class {"expected": {kind: n}, "unexpected":
//   {...}}, first_unexpected (messages), unexpected_exits, rss_growth_bytes {process: bytes or
//   null when it never ran past its warm-up}, rss_anon_growth_bytes (the same without shared
//   memory: a segment filling up is not growth of the heap), fd_growth {process: n or null}, and
//   processes {name: {pid, incarnation, rss_bytes, rss_anon_bytes, fds, series: [[t_s, rss_bytes,
//   rss_anon_bytes, fds], ...]}} (a point every 10 s).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace larder::bench {

struct SoakBenchOptions {
  // Seconds of load (default: 30 minutes).
  double duration_s = 1800;
  // Store client processes (default: 4).
  int clients = 4;
  // Bytes of each client's segment (default: 64 MiB: small, so eviction runs all the time).
  uint64_t segment_size = 64ull << 20;
  // Value sizes, per key, in [min_value, max_value] (default: 1 KiB to 64 KiB); keys per batch.
  uint64_t min_value = 1024;
  uint64_t max_value = 64 * 1024;
  size_t batch = 8;
  // Pause of each client after each batch, in milliseconds (default: 1).
  double interval_ms = 1;
  // Seconds before the first fault, and before a process's RSS and fds count as its baseline
  // (default: 20).
  double warmup_s = 20;
  // Seconds between faults (default: 30) and the faults, in the order they take turns.
  double fault_every_s = 30;
  std::vector<std::string> faults = {"client_kill", "master_restart", "master_pause", "peer_stall"};
  // The master's --client-ttl (default: 3 s); master_pause lasts this plus 2 s.
  double client_ttl_s = 3;
  // Seconds a peer_stall lasts (default: 2; less than the TTL).
  double stall_s = 2;
  // Seconds after a fault's end during which errors count as expected (default: 15).
  double grace_s = 15;
  uint64_t seed = 1;
  // Store protocol of the clients: auto (default), shm or tcp.
  std::string protocol = "auto";
  // The larder-master binary; empty (default): larder-master beside this executable.
  std::string master_binary;
  // The disk tier (docs/disk-tier.md): each client slot holds DIR/slot-<n> (kept across the
  // slot's restarts, so that a killed holder restarts on its own disk), disk_capacity bytes each.
  // Empty (default): memory only.
  std::string disk_path;
  uint64_t disk_capacity = 256ull << 20;
  // One JSON object on stdout instead of a table (progress goes to stderr).
  bool json = false;
};

// The names --faults takes.
const std::vector<std::string>& SoakFaultKinds();

// Runs the soak and prints its figures. Returns the process exit code: 0 when no value was wrong
// and no error unexpected, 3 when either happened, 1 when the cluster could not be set up.
int RunSoakBench(const SoakBenchOptions& options);

}  // namespace larder::bench
