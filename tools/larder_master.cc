// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// larder-master: the store's metadata service (gRPC) and its HTTP endpoint. Holds no data.
// SIGTERM or SIGINT shuts it down cleanly. With --etcd, a leader that lost its leadership exits
// with status 3 (after one more lease TTL), for its supervisor to restart it as a standby.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <iostream>
#include <thread>

#include "cli_common.h"
#include "common/child_process.h"
#include "common/env.h"
#include "common/logging.h"
#include "etcd/etcd_client.h"
#include "larder/version.h"
#include "master/master_server.h"

namespace {

using larder::cli::Duration;

std::chrono::milliseconds ToDuration(const std::string& text) {
  return *larder::ParseDuration(text);
}

}  // namespace

int main(int argc, char** argv) {
  larder::BlockTerminationSignals();
  CLI::App app{
      "larder-master: metadata service of the Larder store (object placement, leases, eviction,\n"
      "client liveness). Clients reach it over gRPC; operators over HTTP (the status page at /,\n"
      "/api/..., /metrics, /health, /keys?prefix=, Mooncake's /get_all_keys, ...; larder-ctl\n"
      "uses them). It holds no object bytes."};
  app.set_version_flag("--version", std::string("larder-master ") + larder::Version(),
                       "print the version and exit");
  larder::master::MasterServerOptions options;
  std::string lease_ttl = "5s", client_ttl = "10s", put_timeout = "30s", placement = "local-first";
  std::string default_soft_pin_ttl = "30m", max_soft_pin_ttl = "24h";
  std::string etcd_endpoints, leader_ttl = "3s";
  larder::cli::TokenFlags tokens;
  larder::cli::ServiceFlags service;
  app.add_option("--host", options.listen_host,
                 "address to listen on (default: 0.0.0.0 with a cluster token or --insecure, "
                 "else 127.0.0.1)");
  larder::cli::AddTokenFlags(
      &app, &tokens,
      "file holding the cluster token: every client proves it (LARDER_AUTH_TOKEN) and the "
      "master proves it back (docs/security.md)",
      "file holding the operator token that RemoveAll and every HTTP route but /, "
      "/api/summary, /api/history, /metrics and /health need (LARDER_ADMIN_TOKEN on clients); "
      "needs --auth-token-file");
  app.add_flag("--insecure", options.insecure,
               "serve every interface without a cluster token (anyone who reaches the master "
               "can read and change the cache)");
  app.add_flag("!--no-local-socket", options.local_control_socket,
               "serve clients on this host over gRPC only, not also on the local control socket "
               "(an abstract Unix socket that clients learn over gRPC: docs/wire-protocols.md)");
  app.add_option("--tls-cert", options.tls_cert_file, "PEM certificate for gRPC TLS")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-key", options.tls_key_file, "PEM private key of --tls-cert")
      ->check(CLI::ExistingFile);
  app.add_option("--port", options.port, "gRPC port (0: pick a free one)")->capture_default_str();
  app.add_option("--http-port", options.http_port, "HTTP port (0: pick a free one; -1: off)")
      ->capture_default_str();
  app.add_option("--lease-ttl", lease_ttl,
                 "how long a get's lease protects an object when its reader never releases it "
                 "(readers release leases when their copy ends)")
      ->check(Duration())
      ->capture_default_str();
  app.add_option("--client-ttl", client_ttl,
                 "a client silent this long is expired and its segments unmounted")
      ->check(Duration())
      ->capture_default_str();
  app.add_option("--eviction-slack", options.master.eviction_slack,
                 "a put that finds the pool full evicts what it needs plus this fraction of the "
                 "capacity (in whole objects)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--eviction-high-watermark", options.master.eviction_high_watermark,
                 "background eviction: when used/capacity exceeds this, the sweeper evicts "
                 "--eviction-ratio of the capacity (1: off, puts evict what they need)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--eviction-ratio", options.master.eviction_ratio,
                 "fraction of the capacity background eviction frees")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--disk-demote-watermark", options.master.disk.demote_watermark,
                 "the disk tier (docs/disk-tier.md): objects above this fraction of the pool, "
                 "oldest first, are written to their host's disk ahead of eviction (0: every "
                 "object, shortly after its put; 1: none)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--put-timeout", put_timeout, "a put not ended within this is revoked")
      ->check(Duration())
      ->capture_default_str();
  app.add_option("--default-soft-pin-ttl", default_soft_pin_ttl,
                 "how long a soft pin lasts when a put enables one without a TTL")
      ->check(Duration())
      ->capture_default_str();
  app.add_option("--max-soft-pin-ttl", max_soft_pin_ttl,
                 "longest soft pin a put may ask for (longer: refused)")
      ->check(Duration())
      ->capture_default_str();
  app.add_option("--evict-soft-pinned", options.master.evict_soft_pinned,
                 "whether eviction may take soft-pinned objects (least recently used first) once "
                 "no unpinned object is left to evict; false: only after their pin ran out")
      ->capture_default_str();
  app.add_option("--max-key-size", options.master.max_key_size, "longest key in bytes")
      ->check(CLI::Range(size_t{1}, larder::master::kMaxKeyBytes))
      ->capture_default_str();
  app.add_option("--placement", placement,
                 "replica placement: local-first (writer's process, then host, then free ratio) "
                 "or free-ratio")
      ->check(CLI::IsMember({"local-first", "free-ratio"}))
      ->capture_default_str();
  app.add_option("--shards", options.master.shards, "metadata shards (one lock each)")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  app.add_flag("--metrics-per-client", options.master.metrics_per_client,
               "/metrics also has series per client engine and peer (larder_client_*): their "
               "labels hold pids, so each client restart starts new series; off, it has the "
               "totals by route and locality (larder_transfer_*)");
  app.add_option("--etcd", etcd_endpoints,
                 "etcd endpoints HOST:PORT[,HOST:PORT...]: masters of one --cluster-id elect a "
                 "leader there; the others are standbys that refuse calls (naming the leader) "
                 "and take over when its lease lapses. Clients then use "
                 "LARDER_MASTER=etcd://ENDPOINTS/CLUSTER_ID");
  app.add_option("--cluster-id", options.cluster_id,
                 "name of the cluster this master serves ([A-Za-z0-9._-], at most 128); "
                 "required with --etcd. Without --etcd, a second master of the same cluster on "
                 "this host refuses to start");
  app.add_option("--leader-ttl", leader_ttl,
                 "TTL of the leader's etcd lease: a crashed leader is replaced after about this "
                 "long, and a leader cut off from etcd stops serving before it (etcd counts "
                 "whole seconds)")
      ->check(Duration())
      ->capture_default_str();
  app.add_option("--advertise", options.advertise_address,
                 "HOST:PORT the leader publishes in etcd for clients to dial (default: the "
                 "--host address and gRPC port, 127.0.0.1 when listening on every interface)");
  larder::cli::AddServiceFlags(&app, &service, "master");
  CLI11_PARSE(app, argc, argv);
  larder::cli::ApplyLogLevel(service);
  if (larder::Status read = larder::cli::ReadTokens(
          tokens, /*min_bytes=*/16, &options.auth.cluster_token, &options.auth.admin_token);
      !read.ok()) {
    std::cerr << "larder-master: " << read << "\n";
    return 2;
  }
  options.master.lease_ttl = ToDuration(lease_ttl);
  options.master.client_ttl = ToDuration(client_ttl);
  options.master.put_timeout = ToDuration(put_timeout);
  options.master.default_soft_pin_ttl = ToDuration(default_soft_pin_ttl);
  options.master.max_soft_pin_ttl = ToDuration(max_soft_pin_ttl);
  if (options.master.default_soft_pin_ttl > options.master.max_soft_pin_ttl) {
    std::cerr << "larder-master: --default-soft-pin-ttl " << default_soft_pin_ttl
              << " exceeds --max-soft-pin-ttl " << max_soft_pin_ttl << "\n";
    return 2;
  }
  options.master.placement = placement == "free-ratio"
                                 ? larder::master::PlacementStrategy::kFreeRatio
                                 : larder::master::PlacementStrategy::kLocalHostFirst;

  if (!etcd_endpoints.empty()) {
    auto endpoints = larder::etcd::ParseEtcdEndpoints(etcd_endpoints);
    if (!endpoints.ok()) {
      std::cerr << "larder-master: --etcd: " << endpoints.status() << "\n";
      return 2;
    }
    options.etcd_endpoints = std::move(endpoints).value();
    if (options.cluster_id.empty()) {
      std::cerr << "larder-master: --etcd needs --cluster-id (the cluster whose leader it "
                   "elects)\n";
      return 2;
    }
  }
  options.leader_ttl = ToDuration(leader_ttl);
  if (options.leader_ttl < std::chrono::seconds(1)) {
    std::cerr << "larder-master: --leader-ttl " << leader_ttl << " is below 1s\n";
    return 2;
  }
  // A leader that lost its lease serves nothing more; it exits after one more TTL (by then a
  // standby leads), with status 3, so that its supervisor restarts it as a standby.
  static std::atomic<bool> leadership_lost{false};
  const std::chrono::milliseconds exit_delay = options.leader_ttl;
  options.on_leadership_lost = [exit_delay](const larder::Status& why) {
    larder::Log().error(
        "larder-master exits with status 3 in {} ms, to be restarted as a standby ({})",
        exit_delay.count(), why.message());
    if (leadership_lost.exchange(true)) return;
    std::thread([exit_delay] {
      std::this_thread::sleep_for(exit_delay);
      kill(getpid(), SIGTERM);  // ends WaitForShutdown below
    }).detach();
  };
  std::string cluster_id = options.cluster_id;
  options.on_role_change = [cluster_id](std::string_view role) {
    std::cerr << "larder-master: role " << role << " in cluster " << cluster_id << "\n";
  };

  auto server = larder::master::MasterServer::Start(options);
  if (!server.ok()) {
    std::cerr << "larder-master: " << server.status() << "\n";
    return 1;
  }
  std::cerr << "larder-master: gRPC on " << (*server)->listen_host() << ":" << (*server)->port()
            << ", HTTP on " << (*server)->http_port() << "\n";
  larder::AnnounceReady((*server)->address() + " " + std::to_string((*server)->http_port()));
  larder::cli::WaitForShutdown(service);
  std::cerr << "larder-master: shutting down\n";
  (*server)->Shutdown();
  return leadership_lost.load() ? 3 : 0;
}
