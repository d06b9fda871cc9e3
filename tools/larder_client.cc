// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// larder-client: the per-host standalone daemon. It owns the host's global segment (a
// StoreClient) and serves inference processes of this host on a Unix socket, so that restarting
// them loses no cache (docs/standalone.md). SIGTERM or SIGINT: stop accepting, close the
// connections, unmount the segment.
#include <CLI/CLI.hpp>
#include <iostream>

#include "cli_common.h"
#include "common/child_process.h"
#include "common/env.h"
#include "larder/version.h"
#include "standalone/daemon.h"

int main(int argc, char** argv) {
  larder::BlockTerminationSignals();
  CLI::App app{
      "larder-client: the per-host standalone Larder daemon. It contributes this host's global\n"
      "segment to the store, talks to larder-master and heartbeats, and serves processes of this\n"
      "host (same uid or root) on a Unix socket: they attach with AttachStoreClient (C++) and\n"
      "move bytes through memory shared with it, contributing nothing themselves, so restarting\n"
      "them loses no cache. Settings not given as flags come from LARDER_* variables\n"
      "(docs/configuration.md). Prints \"READY <socket> <segment name>\" once serving."};
  app.set_version_flag("--version", std::string("larder-client ") + larder::Version(),
                       "print the version and exit");
  auto env = larder::StoreClientOptions::FromEnvironment();
  if (!env.ok()) {
    std::cerr << "larder-client: " << env.status() << "\n";
    return 2;
  }
  larder::standalone::ClientDaemonOptions options;
  options.store = *env;
  std::string segment_size, master, local_hostname, protocol, tenant, segment_name;
  std::string frame_timeout = "10s";
  larder::cli::TokenFlags tokens;
  larder::cli::ServiceFlags service;
  app.add_option("--socket", options.socket,
                 "where to serve: @name (abstract Unix socket), a path, or host:port (Mooncake's "
                 "client_server_address; serves @larder-client-<port>)")
      ->capture_default_str();
  app.add_option(
      "--master", master,
      "larder-master's gRPC address (LARDER_MASTER; default " + options.store.master_address + ")");
  app.add_option("--segment-size", segment_size,
                 "bytes this host contributes to the pool (LARDER_GLOBAL_SEGMENT_SIZE; default " +
                     larder::FormatByteSize(options.store.global_segment_size) + ")")
      ->check(larder::cli::ByteSize());
  app.add_option("--segment-name", segment_name,
                 "the segment's name in the cluster (LARDER_SEGMENT_NAME; default "
                 "<local hostname>:<data port>)");
  app.add_option("--local-hostname", local_hostname,
                 "address the data server listens on, \"ip\" or \"ip:port\" "
                 "(LARDER_LOCAL_HOSTNAME; default " +
                     options.store.local_hostname + ")");
  app.add_option("--protocol", protocol,
                 "transports of the store engine: auto, shm,tcp, tcp, ... "
                 "(LARDER_STORE_PROTOCOL, LARDER_PROTOCOL; default auto)");
  app.add_option("--tenant-id", tenant,
                 "key namespace of every attached client (LARDER_TENANT; default: the default "
                 "tenant)");
  larder::cli::AddTokenFlags(
      &app, &tokens,
      "file holding the cluster token, proven to the master and to peers "
      "(LARDER_AUTH_TOKEN; docs/security.md)",
      "file holding the operator token that RemoveAll needs (LARDER_ADMIN_TOKEN)");
  app.add_option("--disk-path", options.store.disk_path,
                 "the disk tier (docs/disk-tier.md): a directory of this daemon's own that makes "
                 "it this host's disk holder (LARDER_DISK_PATH; default: no disk)");
  app.add_option("--disk-capacity", options.store.disk_capacity,
                 "the most the disk tier takes: bytes (500G) or a percentage of the file system "
                 "(40%) (LARDER_DISK_CAPACITY; default 50%)");
  app.add_option("--max-clients", options.max_clients,
                 "attached processes served at once; more are refused")
      ->check(CLI::Range(size_t{1}, size_t{65536}))
      ->capture_default_str();
  app.add_option("--max-in-flight", options.max_in_flight,
                 "requests of one attached process served at once")
      ->check(CLI::Range(size_t{1}, size_t{256}))
      ->capture_default_str();
  app.add_option("--frame-timeout", frame_timeout,
                 "a request frame that has begun must arrive whole, and a reply be taken, within "
                 "this; otherwise that client's connection is closed")
      ->check(larder::cli::Duration())
      ->capture_default_str();
  larder::cli::AddServiceFlags(&app, &service, "daemon");
  CLI11_PARSE(app, argc, argv);
  larder::cli::ApplyLogLevel(service);

  if (!master.empty()) options.store.master_address = master;
  if (!segment_size.empty()) {
    options.store.global_segment_size = *larder::ParseByteSize(segment_size, true);
  }
  if (!segment_name.empty()) options.store.segment_name = segment_name;
  if (!local_hostname.empty()) options.store.local_hostname = local_hostname;
  if (!protocol.empty()) options.store.protocol = protocol;
  if (!tenant.empty()) options.store.tenant_id = tenant;
  if (larder::Status read = larder::cli::ReadTokens(
          tokens, /*min_bytes=*/1, &options.store.auth_token, &options.store.admin_token);
      !read.ok()) {
    std::cerr << "larder-client: " << read << "\n";
    return 2;
  }
  options.frame_timeout = *larder::ParseDuration(frame_timeout);

  auto daemon = larder::standalone::ClientDaemon::Start(options);
  if (!daemon.ok()) {
    std::cerr << "larder-client: " << daemon.status() << "\n";
    return 1;
  }
  std::cerr << "larder-client: serving " << (*daemon)->socket_address() << ", segment '"
            << (*daemon)->segment_name() << "' ("
            << larder::FormatByteSize(options.store.global_segment_size) << ") on master "
            << options.store.master_address << "\n";
  larder::AnnounceReady((*daemon)->socket_address() + " " + (*daemon)->segment_name());
  larder::cli::WaitForShutdown(service);
  std::cerr << "larder-client: shutting down\n";
  (*daemon)->Stop();
  return 0;
}
