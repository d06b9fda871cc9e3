// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "larder/status.h"
#include "master/master_state.h"
#include "master/sessions.h"

namespace larder::master {

struct MasterServerOptions {
  // gRPC control plane and HTTP. Empty: every interface ("0.0.0.0") when the master has a cluster
  // token or `insecure`, else loopback only ("127.0.0.1"). Port 0 picks a free port (see
  // MasterServer::port()).
  std::string listen_host;
  uint16_t port = 50051;
  // HTTP (http_endpoint.h): /metrics, /health, /segments, /keys?prefix=, and Mooncake's
  // /get_all_segments, /get_all_keys, /query_key, /batch_query_keys, /query_segment. Port 0 picks
  // a free port; -1 disables.
  int http_port = 9003;
  MasterOptions master;
  // Cluster and admin tokens (docs/security.md). Without a cluster token every call is served
  // unauthenticated, so the master then refuses to listen beyond loopback unless `insecure`.
  AuthOptions auth;
  bool insecure = false;
  // TLS for gRPC (PEM files). Both or neither; clients then need the CA (LARDER_TLS_CA).
  std::string tls_cert_file;
  std::string tls_key_file;
};

// larder-master: the gRPC service and the HTTP endpoint over one MasterState.
// Thread-safe; Shutdown (or destruction) stops both servers and the sweeper.
class MasterServer {
 public:
  // Binds both ports and starts serving. Errors: Unavailable (a port is taken).
  static Result<std::unique_ptr<MasterServer>> Start(MasterServerOptions options);
  ~MasterServer();

  uint16_t port() const;
  const std::string& listen_host() const;  // as resolved (see MasterServerOptions::listen_host)
  int http_port() const;                   // -1 when disabled
  // "host:port" clients can dial on this machine.
  std::string address() const;
  MasterState& state();

  // Stops accepting calls, finishes in-flight ones, stops the sweeper. Idempotent.
  void Shutdown();

 private:
  struct Impl;
  explicit MasterServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Prometheus text exposition of the master's state (what /metrics serves).
std::string RenderMetrics(const MasterState& state);

}  // namespace larder::master
