// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// `larder-bench failover`: how the store recovers when its master dies.
//
// N store clients (`larder-bench store-worker` processes) each store their share of K objects
// in their own segment. The bench measures the steady-state put and get rates, waits until every
// client's catalog holds the objects it owns (so that what follows measures recovery, not the
// catalog's 200 ms sync lag), starts a mixed probe loop in every client (small batches of puts
// of fresh keys and gets of stored ones, bench/failover_probe.h), and kills the master with
// SIGKILL:
//   standby  two larder-masters of one cluster in etcd (its own etcd unless --etcd); the leader
//            is killed and the standby takes over; clients follow it through etcd://.
//   restart  one larder-master without etcd on a fixed port; killed and started again there.
// Then it reports when each client's first put and first get succeeded after the kill, when the
// new master had rebuilt the objects from the clients' catalogs (recovered_objects in its
// GetStats), which errors the clients saw meanwhile, and, once recovered, how many of the K
// objects every client reads back intact.
//
// With `ha = false` only the steady-state phase runs, against a plain master (no etcd);
// `compare` runs that first and then the failover run, so that one session shows what HA costs
// in steady state. Fields of the output: RunFailoverBench.
#pragma once

#include <cstdint>
#include <string>

namespace larder::bench {

struct FailoverBenchOptions {
  // "standby" (default) or "restart"; see above.
  std::string mode = "standby";
  // false: the steady-state phase only, against a plain master (default: true).
  bool ha = true;
  // The steady-state phase against a plain master, then the failover run (default: false).
  bool compare = false;
  // Client processes (default: 3), each owning objects / clients of the objects.
  int clients = 3;
  // Objects stored before the kill, over all clients (default: 100000; at most 1,000,000).
  uint64_t objects = 100000;
  // Bytes per object (default: 4 KiB).
  uint64_t value_size = 4096;
  // Keys per batch call while storing, in the steady-state phase and when reading back
  // (default: 64).
  size_t batch = 64;
  // Fresh keys each client puts in the steady-state put phase (default: 10000).
  uint64_t steady_puts = 10000;
  // Seconds of the steady-state get phase (default: 3).
  double steady_duration_s = 3;
  // Keys per batch of the probe loop (default: 8), its pause after each put+get round in
  // milliseconds (default: 5) and the most keys it puts per client (default: 50000).
  size_t probe_batch = 8;
  double probe_interval_ms = 5;
  uint64_t probe_max_puts = 50000;
  // etcd endpoints "HOST:PORT[,...]" for standby mode; empty (default): the bench starts its own
  // etcd (`etcd` on PATH or $LARDER_ETCD) on free loopback ports.
  std::string etcd;
  // The masters' --leader-ttl in standby mode (default: "3s").
  std::string leader_ttl = "3s";
  // Longest wait for the catalogs to hold every owned object (default: 120 s) and for the
  // clients to resume, the new master to rebuild and the read-back to find every object after
  // the kill (default: 60 s).
  double sync_timeout_s = 120;
  double recovery_timeout_s = 60;
  // Store protocol of the clients: auto (default), shm or tcp.
  std::string protocol = "auto";
  // The larder-master binary; empty (default): larder-master beside this executable.
  std::string master_binary;
  // One JSON object on stdout instead of a table (progress goes to stderr either way).
  bool json = false;
};

// Runs the bench and prints its figures. JSON fields (times in seconds from the kill):
//   bench "failover", mode ("standby" | "restart"; "plain" with ha off), ha ("on" | "off"),
//   clients, objects, value_size;
//   steady_put_ops, steady_get_ops: keys per second over all clients (time inside store calls);
//   catalog_sync_s: how long the catalogs took to hold every owned object after the last put;
//   and for the failover run:
//   takeover_s: the standby published as leader (standby) or the master started again and
//     ready (restart);
//   resume_put_s, resume_get_s: first successful put / get after the kill, median over clients
//     (null when a client never resumed); resume_put_max_s, resume_get_max_s: the slowest client;
//   rebuild_s: the new master's recovered_objects (plus catalog_entries_dropped) reached the
//     catalogs' total just before the kill (or, when it stopped short, last grew;
//     rebuild_complete false); when it reports no recovered object at all, readable_s instead
//     (rebuild_source: "recovered_objects" or "readable");
//   restored_objects, catalog_entries_dropped: the new master's last counts; expected_objects:
//     the catalogs' total;
//   objects_back_s: the new master's object count reached the catalogs' total (the probes' puts
//     after the kill count too, a few against the total);
//   readable_s: the end of the first read-back in which every object was readable (an upper
//     bound: it includes the read-back itself);
//   client_errors: {"put:<code>" | "get:<code>" | "get:NotFound" | "get:wrong": keys} the probes
//     saw from the kill on; first_errors: one message per class;
//   readable_fraction: objects read back intact / (clients x objects whose owner is alive);
//   wrong_bytes: reads that returned wrong bytes; missing, unreadable: NotFound / other errors
//     in the final read-back;
//   with compare: ha_off {steady_put_ops, steady_get_ops}.
// Returns 0 when the run completed, 1 when it could not be set up or a client never resumed or
// read wrong bytes, 2 for bad options.
int RunFailoverBench(const FailoverBenchOptions& options);

}  // namespace larder::bench
