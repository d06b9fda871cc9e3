// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// larder-master: the store's metadata service (gRPC) and its HTTP endpoint. Holds no data.
// SIGTERM or SIGINT shuts it down cleanly.
#include <CLI/CLI.hpp>
#include <iostream>

#include "bench/process.h"
#include "cli_common.h"
#include "common/env.h"
#include "master/master_server.h"

namespace {

using larder::cli::Duration;

std::chrono::milliseconds ToDuration(const std::string& text) {
  return *larder::ParseDuration(text);
}

}  // namespace

int main(int argc, char** argv) {
  larder::bench::BlockTerminationSignals();
  CLI::App app{
      "larder-master: metadata service of the Larder store (object placement, leases, eviction,\n"
      "client liveness). Clients reach it over gRPC; operators over HTTP (/metrics, /health,\n"
      "/segments, /keys?prefix=, and Mooncake's /get_all_keys, /query_key?key=, ...). It holds\n"
      "no object bytes."};
  larder::master::MasterServerOptions options;
  std::string lease_ttl = "5s", client_ttl = "10s", put_timeout = "30s", placement = "local-first";
  std::string default_soft_pin_ttl = "30m", max_soft_pin_ttl = "24h";
  larder::cli::TokenFlags tokens;
  larder::cli::ServiceFlags service;
  app.add_option("--host", options.listen_host,
                 "address to listen on (default: 0.0.0.0 with a cluster token or --insecure, "
                 "else 127.0.0.1)");
  larder::cli::AddTokenFlags(
      &app, &tokens,
      "file holding the cluster token: every client proves it (LARDER_AUTH_TOKEN) and the "
      "master proves it back (docs/security.md)",
      "file holding the operator token that RemoveAll and every HTTP route but /metrics and "
      "/health need (LARDER_ADMIN_TOKEN on clients)");
  app.add_flag("--insecure", options.insecure,
               "serve every interface without a cluster token (anyone who reaches the master "
               "can read and change the cache)");
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

  auto server = larder::master::MasterServer::Start(options);
  if (!server.ok()) {
    std::cerr << "larder-master: " << server.status() << "\n";
    return 1;
  }
  std::cerr << "larder-master: gRPC on " << (*server)->listen_host() << ":" << (*server)->port()
            << ", HTTP on " << (*server)->http_port() << "\n";
  larder::bench::AnnounceReady((*server)->address() + " " + std::to_string((*server)->http_port()));
  larder::cli::WaitForShutdown(service);
  std::cerr << "larder-master: shutting down\n";
  (*server)->Shutdown();
  return 0;
}
