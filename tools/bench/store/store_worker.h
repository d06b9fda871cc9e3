// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// A store client process driven over stdin/stdout, for `larder-bench store`, the demo and the
// multi-process tests. It mounts a segment, prints "READY <segment name>", then answers one JSON
// command per line with one JSON reply per line, and exits (unmounting) when stdin closes.
//
// Commands (fields in brackets are optional):
//   {"cmd":"put", "prefix":P, "first":F, "count":N | "keys":[...], "value_size":S, "batch":B,
//    ["duration":seconds], ["preferred":segment], ["replicas":R], ["zero_copy":bool]}
//     -> {"ok":n, "errors":n, "error_codes":{code name: n}, "first_error":s, "seconds":t,
//         "lat_us":[per batch], "next":i}
//   {"cmd":"get", same key selection, "value_size":S, "batch":B, ["duration":seconds, random keys],
//    ["zero_copy":bool]}
//     -> {"ok":n, "errors":n, "retryable":n (Unavailable), "missing":n (NotFound), "wrong":n,
//         "verified":n, "first_error":s, "seconds":t, "lat_us":[...]}
//   {"cmd":"exist", "keys":[...]}   -> {"exist":[true|false|null]}
//   {"cmd":"remove", "keys":[...]}  -> {"codes":[status code per key]}
//   {"cmd":"remove_all"}              -> {"code":"OK" or the error code name, "removed":n,
//   "message"}
//   {"cmd":"route", "segment":name} -> {"route":"shm"} or {"error":...}
//   {"cmd":"stats"}   -> the engine's EngineStats JSON, plus "client_id", "rss_bytes" and
//                        "rss_shmem_bytes" of this process
//   {"cmd":"unmount"} -> {"unmounted":true}: the client leaves (segment unmounted, engine gone)
//                        and the process stays; later commands get an error
//   {"cmd":"catalog"} -> {"objects":n}: the size of the client's catalog of its own segment
//   {"cmd":"probe_start", "put_prefix":P, "max_puts":n, "get_prefix":G, "get_count":n,
//    "value_size":S, "batch":B, "interval_us":u, ["preferred":segment]}
//     -> {"started":true, "now_ns":t}: starts the mixed put/get loop of `larder-bench failover`
//        on a thread of its own (bench/failover_probe.h); other commands keep being answered
//   {"cmd":"probe_status", "since_ns":t} -> FailoverProbe::Summary(t), the loop still running
//   {"cmd":"probe_stop", "since_ns":t}   -> the same, after which the loop is stopped
//   {"cmd":"soak_start", "prefix":P, ["min_value":S, "max_value":S, "batch":B, "get_share":f,
//    "remove_share":f, "interval_us":u, "seed":n]}
//     -> {"started":true, "now_ns":t}: starts the mixed load of `larder-bench soak` on a thread of
//        its own (bench/soak_load.h)
//   {"cmd":"soak_status", ["peers":{prefix: keys put}]} -> SoakLoad::Status() plus "rss_bytes";
//        the peers' ranges are what its gets read from
// Values are self-checking (bench/values.h); every get is verified.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "larder/store_client.h"
#include "master/master_server.h"

namespace larder::bench {

struct StoreWorkerOptions {
  std::string master;  // empty: LARDER_MASTER
  std::string protocol;
  uint64_t segment_size = 256ull << 20;
  std::string segment_name;
  // The device the worker's thread is bound to before its client starts (as a serving process
  // calls cudaSetDevice): the device transport initializes there. -1: none.
  int device = -1;
};

// Runs the command loop; returns the process exit code.
int RunStoreWorker(const StoreWorkerOptions& options);

// The store client of a worker process: StoreClientOptions::FromEnvironment() with the worker's
// master (when given), protocol, segment size and segment name (when given).
// Whether `protocol` enables the device transport: its workers then bind their thread to a device
// (--device) before their client starts, as a serving process does (cudaSetDevice).
bool SelectsDevice(const std::string& protocol);

Result<std::unique_ptr<StoreClient>> CreateWorkerClient(const StoreWorkerOptions& options);

// The master a benchmark or demo starts in its own process: loopback, a free gRPC port, HTTP on
// `http_port` (0: a free one; -1: off).
// A master on loopback for the tools' clusters, with LARDER_AUTH_TOKEN / LARDER_ADMIN_TOKEN as its
// tokens when they are set.
Result<std::unique_ptr<master::MasterServer>> StartEmbeddedMaster(int http_port = -1);

}  // namespace larder::bench
