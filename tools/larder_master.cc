// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// larder-master: the store's metadata service (gRPC) and its HTTP endpoint. Holds no data.
// SIGTERM or SIGINT shuts it down cleanly.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <sstream>

#include "bench/process.h"
#include "common/env.h"
#include "common/logging.h"
#include "master/master_server.h"

namespace {

CLI::Validator Duration() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        auto parsed = larder::ParseDuration(value);
        return parsed.ok() ? "" : parsed.status().message();
      },
      "DURATION", "duration (500ms, 5s, 2m)");
}

std::chrono::milliseconds ToDuration(const std::string& text) {
  return *larder::ParseDuration(text);
}

// A token file's content without its trailing newline. Errors name the file.
larder::Result<std::string> ReadToken(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return larder::InvalidArgumentError("cannot read token file " + path);
  std::ostringstream text;
  text << in.rdbuf();
  std::string token = text.str();
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) {
    token.pop_back();
  }
  if (token.size() < 16) {
    return larder::InvalidArgumentError("token file " + path +
                                        " holds fewer than 16 bytes; use a long random secret "
                                        "(e.g. `openssl rand -hex 32`)");
  }
  return token;
}

}  // namespace

int main(int argc, char** argv) {
  larder::bench::BlockTerminationSignals();
  CLI::App app{
      "larder-master: metadata service of the Larder store (object placement, leases, eviction,\n"
      "client liveness). Clients reach it over gRPC; operators over HTTP (/metrics, /health,\n"
      "/segments, /keys?prefix=). It holds no object bytes."};
  larder::master::MasterServerOptions options;
  std::string lease_ttl = "5s", client_ttl = "10s", put_timeout = "30s", placement = "local-first";
  std::string log_level;
  bool parent_watch = false;
  std::string auth_token_file, admin_token_file;
  app.add_option("--host", options.listen_host,
                 "address to listen on (default: 0.0.0.0 with a cluster token or --insecure, "
                 "else 127.0.0.1)");
  app.add_option("--auth-token-file", auth_token_file,
                 "file holding the cluster token: every client proves it (LARDER_AUTH_TOKEN) and "
                 "the master proves it back (docs/security.md)")
      ->check(CLI::ExistingFile);
  app.add_option("--admin-token-file", admin_token_file,
                 "file holding the operator token that RemoveAll, /keys and /segments need "
                 "(LARDER_ADMIN_TOKEN on clients)")
      ->check(CLI::ExistingFile);
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
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error (LARDER_LOG_LEVEL)");
  app.add_flag("--parent-watch", parent_watch,
               "also exit when stdin closes (for tools that spawn the master)")
      ->group("");
  CLI11_PARSE(app, argc, argv);
  if (!log_level.empty()) larder::SetLogLevel(log_level);
  for (auto [file, token] : {std::pair{&auth_token_file, &options.auth.cluster_token},
                             std::pair{&admin_token_file, &options.auth.admin_token}}) {
    if (file->empty()) continue;
    auto read = ReadToken(*file);
    if (!read.ok()) {
      std::cerr << "larder-master: " << read.status() << "\n";
      return 2;
    }
    *token = *read;
  }
  options.master.lease_ttl = ToDuration(lease_ttl);
  options.master.client_ttl = ToDuration(client_ttl);
  options.master.put_timeout = ToDuration(put_timeout);
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
  if (parent_watch) {
    larder::bench::WaitForParentOrSignal();
  } else {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    int signal = 0;
    sigwait(&set, &signal);
  }
  std::cerr << "larder-master: shutting down\n";
  (*server)->Shutdown();
  return 0;
}
