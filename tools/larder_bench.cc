// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// larder-bench: benchmarks that print numbers. Subcommands:
//   transfer  READ/WRITE bandwidth and latency of the transfer engine next to memcpy
//   target    serve one segment for `transfer --target` (started automatically otherwise)
//   registration  native registrations saved by registration coverage (emulated device)
//   tier      the disk tier's store (demote, read back) against raw O_DIRECT/io_uring on one
//             file system
//   store     puts and gets through the store across client processes
//   master    metadata-only load on the master: ops/s and bytes per object
//   replay    a request trace through the store: prefix hit rate against exact LRU
//   mount     owner mount, peer open and first gets on large segments, and the memory they cost
//   deployment  docs/deployment.md's topology: two prefills hammering the store on host A, a
//             decode pulling PD KV pages from them on host B (a network namespace when root
//             allows)
//   failover  kill -9 the master under load: when puts and gets resume, how long the rebuild
//             takes, and how many stored objects stay readable
//   soak      mixed load for a long time with faults injected on a schedule: wrong bytes,
//             errors expected and not, and every process's RSS and fds over time
// Every subcommand accepts --json (the internal workers speak JSON anyway).
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>

#include "bench/common/target.h"
#include "bench/deployment/deployment_bench.h"
#include "bench/deployment/deployment_worker.h"
#include "bench/failover/failover_bench.h"
#include "bench/master/master_bench.h"
#include "bench/mount/mount_bench.h"
#include "bench/mount/mount_worker.h"
#include "bench/registration/registration_bench.h"
#include "bench/replay/replay_bench.h"
#include "bench/replay/replay_trace.h"
#include "bench/replay/replay_worker.h"
#include "bench/soak/soak_bench.h"
#include "bench/store/store_bench.h"
#include "bench/store/store_worker.h"
#include "bench/tier/tier_bench.h"
#include "bench/transfer/transfer_bench.h"
#include "common/child_process.h"
#include "common/env.h"
#include "larder/version.h"
#include "transfer/transport_registry.h"

namespace {

// CLI11 transform that accepts sizes such as 4K, 64M, 1G and rewrites them to bytes.
CLI::Validator ByteSize(bool allow_zero = false) {
  return CLI::Validator(
      [allow_zero](std::string& value) -> std::string {
        auto parsed = larder::ParseByteSize(value, allow_zero);
        if (!parsed.ok()) return parsed.status().message();
        value = std::to_string(*parsed);
        return "";
      },
      "SIZE", "byte size (4K, 64M, 1G)");
}

// A store protocol this build has: "auto", a transport's name, or a comma list of them.
CLI::Validator StoreProtocol() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        auto selected = larder::transfer::TransportRegistry::Global().Select(value);
        return selected.ok() ? "" : selected.status().message();
      },
      "PROTOCOL",
      "auto, or transports of this build (" +
          larder::transfer::TransportRegistry::Global().ProtocolNames() + ")");
}

}  // namespace

int main(int argc, char** argv) {
  larder::BlockTerminationSignals();
  CLI::App app{"larder-bench: Larder benchmarks (numbers, not pass/fail)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("larder-bench ") + larder::Version(),
                       "print the version and exit");

  larder::bench::TransferBenchOptions transfer;
  std::string ops = "read,write";
  std::string block_sizes = "4K,64K,4M,64M";
  auto* t = app.add_subcommand("transfer", "READ/WRITE bandwidth and latency vs memcpy");
  t->add_option("--transport", transfer.transport,
                "auto, or one transport of this build: local, shm, tcp, ucx (with libucx), ...")
      ->capture_default_str();
  t->add_option("--op", ops, "read, write, or read,write")->capture_default_str();
  t->add_option("--block-size", block_sizes, "comma list of block sizes (4K, 64K, 4M, 64M)")
      ->capture_default_str();
  t->add_option("--batch", transfer.batch, "requests per Submit")->capture_default_str();
  t->add_option("--threads", transfer.threads, "submitting threads (memcpy uses as many)")
      ->capture_default_str();
  t->add_option("--duration", transfer.duration_s, "seconds per measurement")
      ->capture_default_str();
  t->add_option("--segment-size", transfer.segment_size, "bytes of the target segment")
      ->transform(ByteSize())
      ->default_str("1G");
  t->add_option("--working-set", transfer.working_set,
                "bytes of the segment swept by offsets (default: the whole segment; equal to the "
                "block size: one cache-hot range)")
      ->transform(ByteSize());
  t->add_option("--target", transfer.target, "ip:port of a running `larder-bench target`");
  t->add_option("--segment-name", transfer.segment_name, "segment to open on --target")
      ->capture_default_str();
  t->add_option("--copy-threads", transfer.copy_threads, "engine copy threads (0: default)");
  t->add_option("--token", transfer.auth_token, "cluster token (default: LARDER_AUTH_TOKEN)");
  t->add_option("--memory", transfer.memory,
                "host, or device: the target's segment and this side's buffers in device memory "
                "(device 0), the target in its own network namespace (another host id without "
                "root), beside the same run's host-memory figures")
      ->check(CLI::IsMember({"host", "device"}))
      ->capture_default_str();
  t->add_flag("--json", transfer.json, "one JSON object per line");

  larder::bench::TargetOptions target;
  uint64_t target_segment = target.segment_size;
  auto* g = app.add_subcommand("target", "export one segment and serve it");
  g->add_option("--listen", target.listen_address, "data server address")->capture_default_str();
  g->add_option("--segment-size", target_segment, "bytes to export")
      ->transform(ByteSize())
      ->default_str("1G");
  g->add_option("--segment-name", target.segment_name, "segment name")->capture_default_str();
  g->add_option("--protocol", target.protocol, "routes this engine enables")->capture_default_str();
  g->add_flag("--huge-pages", target.huge_pages, "use 2 MiB huge pages when available");
  g->add_option("--device", target.device,
                "bind this device first (with a protocol naming device: a device segment)");
  g->add_flag("--json", target.json,
              "also announce the segment as one JSON object (after the READY line)");

  larder::bench::RegistrationBenchOptions registration;
  bool scattered = false;
  auto* r = app.add_subcommand(
      "registration", "native registrations with coverage vs without, on the emulated device");
  r->add_option("--buffers", registration.buffers, "buffers registered per round")
      ->capture_default_str();
  r->add_option("--buffer-size", registration.buffer_size, "bytes per buffer")
      ->transform(ByteSize())
      ->default_str("3M");
  r->add_flag("--adjacent", registration.adjacent,
              "buffers back to back in one allocation (default)");
  r->add_flag("--scattered", scattered, "one allocation per buffer");
  r->add_option("--rounds", registration.rounds, "register/deregister rounds")
      ->capture_default_str();
  bool registration_json = true;
  r->add_flag("--json", registration_json, "one JSON object (the default and only output)");

  larder::bench::TierBenchOptions tier;
  std::string tier_value_sizes = "64K,4M";
  auto* ti = app.add_subcommand(
      "tier", "the disk tier's store: demote and read back, next to raw O_DIRECT reads");
  ti->footer(
      "In a fresh subdirectory of --disk-path (removed at the end), per value size: DiskStore "
      "writes of self-checking values until --bytes are written, reads of every key back (each "
      "value verified), and one plain file of the same bytes written and read with io_uring and "
      "O_DIRECT. Read figures are medians over --repeat passes. Exit status: 0, 3 when a value "
      "read back was wrong, 1 when the bench could not run (e.g. too little free space).");
  ti->add_option("--disk-path", tier.disk_path, "directory on the file system to measure")
      ->required()
      ->check(CLI::ExistingDirectory);
  ti->add_option("--value-sizes", tier_value_sizes, "comma list of value sizes (64K, 4M)")
      ->capture_default_str();
  ti->add_option("--bytes", tier.bytes, "bytes of values written per value size")
      ->transform(ByteSize())
      ->default_str("1G");
  ti->add_option("--batch", tier.batch, "values per Write/Read call, ops per raw DiskIo::Run")
      ->check(CLI::Range(uint64_t{1}, uint64_t{4096}))
      ->capture_default_str();
  ti->add_option("--queue-depth", tier.queue_depth, "I/Os in flight, the store's and raw")
      ->check(CLI::Range(1u, 4096u))
      ->capture_default_str();
  ti->add_option("--repeat", tier.repeat, "read passes of each kind per value size (medians)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{100}))
      ->capture_default_str();
  bool tier_json = true;
  ti->add_flag("--json", tier_json, "one JSON object (the default and only output)");

  larder::bench::StoreBenchOptions store;
  auto* s = app.add_subcommand("store",
                               "puts and gets through the store, each crossing a process boundary");
  bool embedded = false;
  s->add_flag("--embedded", embedded,
              "start a master in this process (the default without --master)");
  s->add_option("--master", store.master, "ip:port of a running larder-master");
  s->add_option("--clients", store.clients, "client processes on this host")
      ->check(CLI::Range(2, 64))
      ->capture_default_str();
  s->add_option("--active", store.active,
                "clients that run the operation (default: all); the others only contribute "
                "their segments")
      ->check(CLI::Range(1, 64));
  s->add_option("--segment-size", store.segment_size, "bytes each client contributes")
      ->transform(ByteSize())
      ->default_str("1G");
  s->add_option("--op", store.ops, "comma list of put, get, mixed (half the clients put)")
      ->capture_default_str();
  s->add_option("--value-size", store.value_sizes, "comma list of value sizes (4K, 64K, 4M)")
      ->capture_default_str();
  s->add_option("--batch", store.batch, "keys per batch call")->capture_default_str();
  s->add_option("--duration", store.duration_s, "seconds per measurement")->capture_default_str();
  s->add_option("--protocol", store.protocol,
                "store protocol of the clients: auto, or a comma list of this build's transports")
      ->check(StoreProtocol())
      ->capture_default_str();
  s->add_option("--working-set", store.working_set,
                "bytes per client read by gets (default: min(segment/2, 256M))")
      ->transform(ByteSize());
  s->add_flag("!--copy", store.zero_copy,
              "use the copying Put/Get API instead of registered buffers (PutFrom/GetInto)");
  s->add_flag("--json", store.json, "one JSON object per line");

  larder::bench::MasterBenchOptions master_bench;
  auto* m = app.add_subcommand("master", "metadata-only load on a larder-master process");
  m->add_option("--batch", master_bench.batch, "keys per RPC")->capture_default_str();
  m->add_option("--threads", master_bench.threads, "concurrent callers")->capture_default_str();
  m->add_option("--duration", master_bench.duration_s, "seconds per operation")
      ->capture_default_str();
  m->add_option("--objects", master_bench.objects, "objects inserted for the memory figure")
      ->capture_default_str();
  m->add_option("--key-size", master_bench.key_size, "bytes per key")->capture_default_str();
  m->add_flag("--auth", master_bench.auth,
              "give the master a cluster token: every call proves it (the cost of auth)");
  m->add_flag("--grpc", master_bench.grpc_only,
              "call over gRPC: the master serves no local control socket (--no-local-socket)");
  m->add_flag("--json", master_bench.json, "one JSON object");
  m->add_option("--rebuild", master_bench.rebuild,
                "instead: time a master's rebuild from catalogs of N objects (in process)");

  larder::bench::ReplayOptions replay;
  std::string replay_speed = "max";
  bool replay_embedded = false;
  auto* p = app.add_subcommand("replay", "a request trace through the store, against exact LRU");
  p->add_option("--trace", replay.trace,
                std::string("JSONL trace (default: $LARDER_TRACE, else ") +
                    larder::bench::kFetchedTracePath + ", fetched as docs/replay.md says)");
  p->add_flag("--embedded", replay_embedded,
              "start a master in this process (the default without --master)");
  p->add_option("--master", replay.master, "ip:port of a running larder-master");
  p->add_option("--clients", replay.clients, "client processes on this host")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  p->add_option("--page-size", replay.page_size, "bytes per block")
      ->transform(ByteSize())
      ->default_str("64K");
  p->add_option("--capacity", replay.capacity, "pool bytes, split evenly over the clients")
      ->transform(ByteSize())
      ->default_str("1G");
  p->add_option("--speed", replay_speed, "arrival-time compression factor, or max")
      ->capture_default_str();
  p->add_option("--protocol", replay.protocol,
                "store protocol of the clients: auto, or a comma list of this build's transports")
      ->check(StoreProtocol())
      ->capture_default_str();
  p->add_option("--requests", replay.requests, "replay the first N requests (0: all)")
      ->capture_default_str();
  p->add_option("--repeat-prefixes", replay.repeat_prefixes,
                "more reuse: follow each request, this many requests later, by one that shares "
                "its prefix (0: the trace as it is)")
      ->capture_default_str();
  p->add_option("--inflight", replay.inflight,
                "requests outstanding at once, at most one per client (0: --clients; 1: "
                "sequential)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  p->add_option("--disk-path", replay.disk_path,
                "the disk tier: each client holds a directory of its own under this one (removed "
                "after the run); the figures add exact LRU at memory + disk and the disk hits")
      ->check(CLI::ExistingDirectory);
  p->add_option("--disk-capacity", replay.disk_capacity,
                "disk tier bytes across all clients (with --disk-path)")
      ->transform(ByteSize())
      ->default_str("1G");
  p->add_flag("--json", replay.json, "one JSON object per run");
  p->add_option("--plot", replay.plot,
                "also sweep capacities and draw hit rate vs capacity into this SVG file");

  bool worker_json = false;  // the internal workers always reply in JSON
  larder::bench::ReplayWorkerOptions replay_worker;
  auto* pw = app.add_subcommand("replay-worker", "a replay client driven over stdin (internal)");
  pw->group("");
  pw->add_option("--master", replay_worker.master, "larder-master address");
  pw->add_option("--protocol", replay_worker.protocol, "store protocol");
  pw->add_option("--segment-size", replay_worker.segment_size, "bytes to contribute")
      ->transform(ByteSize(/*allow_zero=*/true));
  pw->add_option("--segment-name", replay_worker.segment_name, "segment name");
  pw->add_option("--page-size", replay_worker.page_size, "bytes per block")->transform(ByteSize());
  pw->add_option("--device", replay_worker.device,
                 "device the worker's thread binds to before its client starts (-1: none)");
  pw->add_flag("--json", worker_json, "accepted; replies are JSON anyway");

  larder::bench::StoreWorkerOptions worker;
  auto* w = app.add_subcommand("store-worker", "a store client driven over stdin (internal)");
  w->group("");
  w->add_option("--master", worker.master, "larder-master address");
  w->add_option("--protocol", worker.protocol, "store protocol");
  w->add_option("--segment-size", worker.segment_size, "bytes to contribute")
      ->transform(ByteSize(/*allow_zero=*/true));
  w->add_option("--segment-name", worker.segment_name, "segment name");
  w->add_option("--device", worker.device,
                "device to bind the client's thread to (device protocol)");
  w->add_flag("--json", worker_json, "accepted; replies are JSON anyway");

  larder::bench::MountBenchOptions mount;
  std::string mount_sizes = "1G,64G,1T";
  auto* mt = app.add_subcommand(
      "mount", "owner mount, peer open and first gets on large segments, and their memory");
  mt->add_option("--sizes", mount_sizes, "comma list of segment sizes (1G, 64G, 1T)")
      ->capture_default_str();
  mt->add_option("--huge-pages", mount.huge_pages,
                 "page size of the owner's segment (2m, 1g: reserves hugetlb pages as root)")
      ->check(CLI::IsMember({"off", "2m", "1g", "auto"}))
      ->capture_default_str();
  mt->add_option("--repeat", mount.repeat, "runs per size with fresh processes (medians)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  mt->add_flag("--json", mount.json, "one JSON object per size");

  larder::bench::MountWorkerOptions mount_worker;
  auto* mw = app.add_subcommand("mount-worker", "a mount client driven over stdin (internal)");
  mw->group("");
  mw->add_option("--master", mount_worker.master, "larder-master address");
  mw->add_option("--segment-size", mount_worker.segment_size, "bytes to contribute")
      ->transform(ByteSize(/*allow_zero=*/true));
  mw->add_option("--segment-name", mount_worker.segment_name, "segment name");
  mw->add_option("--huge-pages", mount_worker.huge_pages, "off, 2m, 1g or auto");
  mw->add_flag("--json", worker_json, "accepted; replies are JSON anyway");

  larder::bench::DeploymentBenchOptions deployment;
  std::string deployment_protocols = "auto,tcp";
  auto* dep = app.add_subcommand(
      "deployment",
      "docs/deployment.md's topology on one machine: two prefills on host A hammer the store "
      "(each puts its own KV pages and reads the other's) while a decode on host B pulls PD KV "
      "pages from both; one run per store protocol, PD latency with the store hammered vs idle");
  dep->footer(
      "Host B is a network namespace joined by a veth pair (root and iproute2; removed on exit, "
      "leftovers of crashed runs are removed on start); otherwise the decode runs here under "
      "another LARDER_HOST_ID. Every byte read is verified. Faults: --kill-decode-after and "
      "--kill-prefill-after (SIGKILL, seconds into the load). LARDER_PROTOCOL selects the PD "
      "engines' routes; see docs/deployment.md.");
  dep->add_option("--duration", deployment.duration_s, "seconds of load per run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  dep->add_option("--idle-baseline", deployment.idle_baseline_s,
                  "seconds of PD with the store idle before the load (pd_idle_p99_ms); 0: none")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  dep->add_option("--segment-size", deployment.segment_size,
                  "bytes of each prefill's global segment (sparse memfd: 700G is fine)")
      ->transform(ByteSize())
      ->default_str("1G");
  dep->add_option("--page-size", deployment.page_size, "bytes per store KV page")
      ->transform(ByteSize())
      ->default_str("64K");
  dep->add_option("--batch", deployment.batch, "store pages per batch call")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  dep->add_option("--pd-pages", deployment.pd_pages, "KV pages per PD request")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  dep->add_option("--pd-page-size", deployment.pd_page_size, "bytes per PD KV page")
      ->transform(ByteSize())
      ->default_str("64K");
  dep->add_option("--pd-segment-size", deployment.pd_segment_size,
                  "bytes of each prefill's PD segment (pages are drawn at random from it)")
      ->transform(ByteSize())
      ->default_str("64M");
  dep->add_option("--pd-timeout-ms", deployment.pd_timeout_ms, "deadline of one PD request")
      ->check(CLI::Range(1, 600000))
      ->capture_default_str();
  dep->add_option("--pd-rate", deployment.pd_rate,
                  "PD requests per second the decode starts on a fixed schedule, like a decode "
                  "admitting requests; latency counts from each request's start time, so a slow "
                  "pull delays the ones due behind it (0: back to back)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  auto* dep_store_protocol =
      dep->add_option("--store-protocol", deployment_protocols,
                      "comma list of LARDER_STORE_PROTOCOL values for the prefills, one run each "
                      "(tcp: the NIC-style hairpin that Larder avoids); with --memory device each "
                      "is run as device,<protocol>, and the default is auto alone")
          ->capture_default_str();
  dep->add_option("--memory", deployment.memory,
                  "where the KV lives: host, or device: the prefills' PD and store segments and "
                  "the decode's KV buffers in device memory (device 0 of each process; emulated "
                  "without a device), the PD engines on device plus LARDER_PROTOCOL (else auto), "
                  "so that the decode's pulls go tcp-staged and the prefills' store traffic over "
                  "the device route; every byte is still verified, through host copies")
      ->check(CLI::IsMember({"host", "device"}))
      ->capture_default_str();
  dep->add_option("--kill-decode-after", deployment.kill_decode_after_s,
                  "SIGKILL the decode this many seconds into the load (reported as decode_died)")
      ->check(CLI::NonNegativeNumber);
  dep->add_option("--kill-prefill-after", deployment.kill_prefill_after_s,
                  "SIGKILL prefill-1 this many seconds into the load (the decode's requests to it "
                  "must fail fast with Unavailable)")
      ->check(CLI::NonNegativeNumber);
  dep->add_flag("--json", deployment.json,
                "each run's summary as one JSON object per line (progress on stderr)");
  dep->add_flag("--no-netns", deployment.no_netns,
                "keep the decode in this namespace (another LARDER_HOST_ID) even as root");

  larder::bench::FailoverBenchOptions failover;
  std::string failover_ha = "on";
  auto* fo = app.add_subcommand(
      "failover",
      "kill -9 the master under mixed load and measure recovery: when each client's puts and "
      "gets resume, how long the new master takes to rebuild the stored objects from the "
      "clients' catalogs, and how many of them every client reads back intact");
  fo->footer(
      "Phases: the clients store --objects (each its share, in its own segment); steady state "
      "(every client puts --steady-puts fresh keys, then gets random stored keys for "
      "--steady-duration); the bench then waits until every client's catalog holds all the "
      "objects it owns (polling each client, up to --sync-timeout), so that what follows "
      "measures recovery and not the catalog's sync lag (200 ms); every client starts a probe "
      "loop (a batch of fresh puts and a batch of gets of stored keys every "
      "--probe-interval-ms); the master is killed with SIGKILL; the bench waits (up to "
      "--recovery-timeout) until every client has put and got again and the new master's "
      "recovered_objects (GetStats) reached the catalogs' total; finally every client reads "
      "back all stored objects, verified (again while some are still being rebuilt). When the "
      "master reports no recovered object, rebuild_s is the end of the first read-back that "
      "found every object readable. Times are from the kill.");
  fo->add_option("--mode", failover.mode,
                 "standby: two masters with --etcd on one cluster id, clients on etcd://, the "
                 "leader is killed; restart: one master without etcd on a fixed port, killed and "
                 "started again on it")
      ->check(CLI::IsMember({"standby", "restart"}))
      ->capture_default_str();
  fo->add_option("--ha", failover_ha,
                 "off: only the steady-state phase, against a plain master (no etcd, no kill)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  fo->add_flag("--compare", failover.compare,
               "run the steady-state phase against a plain master first, then the failover run, "
               "and print both steady-state rates (in restart mode both masters are plain, so "
               "the difference is noise)");
  fo->add_option("--clients", failover.clients, "store client processes")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  fo->add_option("--objects", failover.objects,
                 "objects stored before the kill, over all clients (at most 1000000)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1000000}))
      ->capture_default_str();
  fo->add_option("--value-size", failover.value_size,
                 "bytes per object; segments are sized for the objects, the steady-state puts "
                 "and the probe's puts, so nothing is evicted")
      ->transform(ByteSize())
      ->default_str("4K");
  fo->add_option("--batch", failover.batch,
                 "keys per batch call when storing, in steady state and when reading back")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  fo->add_option("--steady-puts", failover.steady_puts,
                 "fresh keys each client puts in the steady-state put phase (0: no put phase)")
      ->capture_default_str();
  fo->add_option("--steady-duration", failover.steady_duration_s,
                 "seconds of the steady-state get phase")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  fo->add_option("--probe-batch", failover.probe_batch, "keys per batch of the probe loop")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  fo->add_option("--probe-interval-ms", failover.probe_interval_ms,
                 "pause of the probe loop after each put+get round (the resolution of resume_*)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  fo->add_option("--probe-puts", failover.probe_max_puts,
                 "most keys the probe puts per client (after that it only gets)")
      ->capture_default_str();
  fo->add_option("--etcd", failover.etcd,
                 "HOST:PORT[,...] of etcd for standby mode (default: start one, `etcd` on PATH "
                 "or $LARDER_ETCD)");
  fo->add_option("--leader-ttl", failover.leader_ttl, "the masters' --leader-ttl (standby mode)")
      ->capture_default_str();
  fo->add_option("--sync-timeout", failover.sync_timeout_s,
                 "seconds to wait for the catalogs to hold every owned object")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  fo->add_option("--recovery-timeout", failover.recovery_timeout_s,
                 "seconds after the kill to wait for the clients to resume, the rebuild and a "
                 "read-back that finds every object")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  fo->add_option("--protocol", failover.protocol, "store protocol of the clients")
      ->check(CLI::IsMember({"auto", "shm", "tcp"}))
      ->capture_default_str();
  fo->add_option("--master-binary", failover.master_binary,
                 "larder-master to run (default: the one beside larder-bench)");
  fo->add_flag(
      "--json", failover.json,
      "one JSON object (mode, objects, readable_fraction, wrong_bytes, resume_put_s, "
      "resume_get_s, rebuild_s, client_errors, steady_put_ops, steady_get_ops, ...; "
      "tools/bench/failover/failover_bench.h) instead of a table; progress goes to stderr");

  larder::bench::SoakBenchOptions soak;
  std::string soak_faults = "client_kill,master_restart,master_pause,peer_stall";
  auto* so = app.add_subcommand(
      "soak",
      "mixed put/get/remove across client processes for a long time, with faults injected on a "
      "schedule; reports wrong bytes, errors (expected during a fault, unexpected otherwise) and "
      "every process's RSS and open fds over time");
  so->footer(
      "A larder-master process and --clients store clients, each with a small segment (eviction "
      "runs all the time), put fresh keys (sizes vary per key), get their own and the others' "
      "keys (every value verified) and remove some. After --warmup, every --fault-every seconds "
      "one fault, in turn from --faults: client_kill (SIGKILL a random client, start a new one "
      "with its segment name), master_restart (SIGKILL the master, start one on its port), "
      "master_pause (SIGSTOP the master for --client-ttl + 2 s), peer_stall (SIGSTOP a random "
      "client for --stall s). An error during a fault or within --grace s after it is "
      "expected; any other error, and any wrong value, is not. Exit status: 0 clean, 3 when a "
      "value was wrong or an error unexpected, 1 when the cluster could not be set up.");
  so->add_option("--duration", soak.duration_s, "seconds of load")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  so->add_option("--clients", soak.clients, "store client processes")
      ->check(CLI::Range(2, 64))
      ->capture_default_str();
  so->add_option("--segment-size", soak.segment_size, "bytes of each client's segment")
      ->transform(ByteSize())
      ->default_str("64M");
  so->add_option("--min-value", soak.min_value, "smallest value (sizes vary per key)")
      ->transform(ByteSize())
      ->default_str("1K");
  so->add_option("--max-value", soak.max_value, "largest value")
      ->transform(ByteSize())
      ->default_str("64K");
  so->add_option("--batch", soak.batch, "keys per batch call")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  so->add_option("--interval-ms", soak.interval_ms, "pause of each client after each batch")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  so->add_option("--warmup", soak.warmup_s,
                 "seconds before the first fault, and after a process starts before its RSS and "
                 "fds are its baseline")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  so->add_option("--fault-every", soak.fault_every_s, "seconds between faults")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  so->add_option("--faults", soak_faults,
                 "faults that take turns, comma-separated (none: \"\" for a run without faults)")
      ->capture_default_str();
  so->add_option("--client-ttl", soak.client_ttl_s,
                 "the master's --client-ttl in seconds; master_pause lasts this plus 2 s")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  so->add_option("--stall", soak.stall_s, "seconds of a peer_stall (less than --client-ttl)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  so->add_option("--grace", soak.grace_s,
                 "seconds after a fault's end during which errors are expected")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  so->add_option("--seed", soak.seed, "which client each fault takes, and the first fault")
      ->capture_default_str();
  so->add_option("--protocol", soak.protocol, "store protocol of the clients")
      ->check(CLI::IsMember({"auto", "shm", "tcp"}))
      ->capture_default_str();
  so->add_option("--master-binary", soak.master_binary,
                 "larder-master to run (default: the one beside larder-bench)");
  so->add_option("--disk-path", soak.disk_path,
                 "the disk tier: each client slot holds DIR/slot-N, kept across its restarts, so "
                 "client_kill kills a holder mid-demotion and restarts it on its disk")
      ->check(CLI::ExistingDirectory);
  so->add_option("--disk-capacity", soak.disk_capacity, "disk tier bytes per client")
      ->transform(ByteSize())
      ->default_str("256M");
  so->add_flag("--json", soak.json,
               "one JSON object (duration_s, ops, faults_injected, wrong_bytes, "
               "unexpected_errors, expected_errors, rss_growth_bytes, fd_growth, ...; "
               "tools/bench/soak/soak_bench.h) instead of a table; progress goes to stderr");

  bool deployment_worker_json = false;  // the deployment workers always print JSON
  larder::bench::DeploymentPrefillOptions deployment_prefill;
  auto* dp = app.add_subcommand("deployment-prefill", "a host-A prefill of deployment (internal)");
  dp->group("");
  dp->add_option("--name", deployment_prefill.name, "prefill name, key prefix, segment name");
  dp->add_option("--master", deployment_prefill.master, "larder-master address");
  dp->add_option("--segment-size", deployment_prefill.segment_size, "bytes to contribute")
      ->transform(ByteSize());
  dp->add_option("--page-size", deployment_prefill.page_size, "bytes per store page")
      ->transform(ByteSize());
  dp->add_option("--batch", deployment_prefill.batch, "pages per batch call");
  dp->add_option("--pd-listen", deployment_prefill.pd_listen, "PD engine address (ip:port)");
  dp->add_option("--pd-segment-size", deployment_prefill.pd_segment_size, "PD segment bytes")
      ->transform(ByteSize());
  dp->add_option("--pd-page-size", deployment_prefill.pd_page_size, "bytes per PD page")
      ->transform(ByteSize());
  dp->add_option("--pd-protocol", deployment_prefill.pd_protocol,
                 "PD engine protocol (default: LARDER_PROTOCOL, else auto)");
  dp->add_flag("--device-memory", deployment_prefill.device_memory,
               "bind device 0; the PD segment in device memory (the PD protocol must name device)");
  dp->add_flag("--json", deployment_worker_json, "accepted; lines are JSON anyway");

  larder::bench::DeploymentDecodeOptions deployment_decode;
  int deployment_decode_timeout_ms = 2000;
  auto* dd = app.add_subcommand("deployment-decode", "the host-B decode of deployment (internal)");
  dd->group("");
  dd->add_option("--listen", deployment_decode.listen, "engine address (ip:port)");
  dd->add_option("--prefill", deployment_decode.prefills, "name=ip:port of a prefill's PD engine");
  dd->add_option("--pd-pages", deployment_decode.pd_pages, "pages per request");
  dd->add_option("--pd-page-size", deployment_decode.pd_page_size, "bytes per page")
      ->transform(ByteSize());
  dd->add_option("--timeout-ms", deployment_decode_timeout_ms, "deadline of one request");
  dd->add_option("--rate", deployment_decode.rate, "requests per second (0: back to back)")
      ->check(CLI::NonNegativeNumber);
  dd->add_option("--protocol", deployment_decode.protocol,
                 "engine protocol (default: LARDER_PROTOCOL, else auto)");
  dd->add_flag("--device-memory", deployment_decode.device_memory,
               "bind device 0; the KV buffers in device memory (the protocol must name device)");
  dd->add_flag("--json", deployment_worker_json, "accepted; lines are JSON anyway");

  CLI11_PARSE(app, argc, argv);

  if (dep->parsed()) {
    // With device memory the device route carries the prefills' store traffic under any store
    // protocol: the tcp run would repeat the auto one (deployment_bench.h).
    if (deployment.memory == "device" && dep_store_protocol->count() == 0) {
      deployment_protocols = "auto";
    }
    deployment.store_protocols.clear();
    for (size_t start = 0; start <= deployment_protocols.size();) {
      size_t comma = deployment_protocols.find(',', start);
      std::string protocol = deployment_protocols.substr(
          start, comma == std::string::npos ? std::string::npos : comma - start);
      if (auto parsed = larder::ParseProtocol(protocol); protocol.empty() || !parsed.ok()) {
        std::cerr << "larder-bench deployment: --store-protocol: '" << protocol
                  << "' is not a protocol (auto, shm, tcp)\n";
        return 2;
      }
      deployment.store_protocols.push_back(protocol);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    return larder::bench::RunDeploymentBench(deployment);
  }
  if (dp->parsed()) return larder::bench::RunDeploymentPrefill(deployment_prefill);
  if (dd->parsed()) {
    deployment_decode.timeout = std::chrono::milliseconds(deployment_decode_timeout_ms);
    return larder::bench::RunDeploymentDecode(deployment_decode);
  }

  if (so->parsed()) {
    soak.faults.clear();
    for (size_t at = 0; at < soak_faults.size();) {
      size_t comma = soak_faults.find(',', at);
      if (comma == std::string::npos) comma = soak_faults.size();
      if (comma > at) soak.faults.push_back(soak_faults.substr(at, comma - at));
      at = comma + 1;
    }
    return larder::bench::RunSoakBench(soak);
  }
  if (fo->parsed()) {
    failover.ha = failover_ha == "on";
    return larder::bench::RunFailoverBench(failover);
  }
  if (s->parsed()) {
    if (embedded && !store.master.empty()) {
      std::cerr << "larder-bench store: --embedded and --master exclude each other\n";
      return 2;
    }
    return larder::bench::RunStoreBench(store);
  }
  if (w->parsed()) return larder::bench::RunStoreWorker(worker);
  if (p->parsed()) {
    if (replay_embedded && !replay.master.empty()) {
      std::cerr << "larder-bench replay: --embedded and --master exclude each other\n";
      return 2;
    }
    if (replay_speed != "max") {
      char* end = nullptr;
      replay.speed = std::strtod(replay_speed.c_str(), &end);
      if (end == replay_speed.c_str() || *end != '\0' || !(replay.speed > 0)) {
        std::cerr << "larder-bench replay: --speed must be a positive number or max\n";
        return 2;
      }
    }
    return larder::bench::RunReplayBench(replay);
  }
  if (pw->parsed()) return larder::bench::RunReplayWorker(replay_worker);
  if (m->parsed()) return larder::bench::RunMasterBench(master_bench);
  if (mw->parsed()) return larder::bench::RunMountWorker(mount_worker);
  if (mt->parsed()) {
    mount.sizes.clear();
    for (size_t start = 0; start <= mount_sizes.size();) {
      size_t comma = mount_sizes.find(',', start);
      auto size = larder::ParseByteSize(mount_sizes.substr(
          start, comma == std::string::npos ? std::string::npos : comma - start));
      if (!size.ok()) {
        std::cerr << "larder-bench mount: --sizes: " << size.status().message() << "\n";
        return 2;
      }
      mount.sizes.push_back(*size);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    return larder::bench::RunMountBench(mount, std::cout);
  }

  if (r->parsed()) {
    if (scattered) registration.adjacent = false;
    auto result = larder::bench::RunRegistrationBench(registration);
    if (!result.ok()) {
      std::cerr << "larder-bench registration: " << result.status() << "\n";
      return 1;
    }
    std::cout << result->ToJson() << std::endl;
    return 0;
  }

  if (ti->parsed()) {
    tier.value_sizes.clear();
    for (size_t start = 0; start <= tier_value_sizes.size();) {
      size_t comma = tier_value_sizes.find(',', start);
      auto size = larder::ParseByteSize(tier_value_sizes.substr(
          start, comma == std::string::npos ? std::string::npos : comma - start));
      if (!size.ok()) {
        std::cerr << "larder-bench tier: --value-sizes: " << size.status().message() << "\n";
        return 2;
      }
      tier.value_sizes.push_back(*size);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    auto result = larder::bench::RunTierBench(tier);
    if (!result.ok()) {
      std::cerr << "larder-bench tier: " << result.status() << "\n";
      return 1;
    }
    std::cout << result->ToJson() << std::endl;
    if (uint64_t wrong = result->wrong_values(); wrong > 0) {
      std::cerr << "larder-bench tier: " << wrong << " value(s) read back wrong\n";
      return 3;
    }
    return 0;
  }

  if (g->parsed()) {
    target.segment_size = target_segment;
    auto status = larder::bench::RunTarget(target);
    if (!status.ok()) {
      std::cerr << "larder-bench target: " << status << "\n";
      return 1;
    }
    return 0;
  }

  transfer.ops.clear();
  for (size_t start = 0; start <= ops.size();) {
    size_t comma = ops.find(',', start);
    transfer.ops.push_back(
        ops.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  transfer.block_sizes.clear();
  for (size_t start = 0; start <= block_sizes.size();) {
    size_t comma = block_sizes.find(',', start);
    auto size = larder::ParseByteSize(
        block_sizes.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (!size.ok()) {
      std::cerr << "larder-bench transfer: --block-size: " << size.status().message() << "\n";
      return 2;
    }
    transfer.block_sizes.push_back(*size);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  auto rows = larder::bench::RunTransferBench(transfer, std::cout);
  if (!rows.ok()) {
    std::cerr << "larder-bench transfer: " << rows.status() << "\n";
    return 1;
  }
  return 0;
}
