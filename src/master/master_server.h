// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

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
  // HTTP (http_endpoint.h): the status page at /, /api/..., /metrics, /health, /segments,
  // /keys?prefix=, and Mooncake's
  // /get_all_segments, /get_all_keys, /query_key, /batch_query_keys, /query_segment. Port 0 picks
  // a free port; -1 disables.
  int http_port = 9003;
  // How often the HTTP endpoint samples the counters for /api/history and the status page; the
  // last 300 samples are kept.
  std::chrono::milliseconds status_interval{1000};
  MasterOptions master;
  // Cluster and admin tokens (docs/security.md). Without a cluster token every call is served
  // unauthenticated, so the master then refuses to listen beyond loopback unless `insecure`.
  AuthOptions auth;
  bool insecure = false;
  // Serve this host's clients on an abstract Unix socket too (local_control_server.h): their
  // calls then skip HTTP/2 and TCP. Clients learn its name over gRPC, and use it only when they
  // are on this host (the same host id). Not with TLS: clients with a CA stay on gRPC.
  bool local_control_socket = true;
  // TLS for gRPC (PEM files). Both or neither; clients then need the CA (LARDER_TLS_CA).
  std::string tls_cert_file;
  std::string tls_key_file;
  // High availability (leader_election.h). With etcd endpoints ("host:port"), the masters of
  // `cluster_id` elect one leader through etcd; the others are standbys that answer every call
  // with Unavailable naming the leader, and take over once its lease lapses. Empty: no etcd.
  std::vector<std::string> etcd_endpoints;
  // Required with etcd (etcd::ValidateClusterId). Without etcd, a cluster id makes the master
  // hold a host-wide lock for it, so that a second master of the cluster on this host refuses to
  // start. Empty: no cluster id.
  std::string cluster_id;
  // TTL of the leader's etcd lease: about how long a crashed leader takes to be replaced.
  std::chrono::milliseconds leader_ttl{3000};
  // "host:port" the leader publishes for clients to dial. Empty: address().
  std::string advertise_address;
  // With etcd: called once (from the election's thread) when this master led and lost the
  // leadership; it never serves again, so the process should exit. Empty: none.
  std::function<void(const Status& why)> on_leadership_lost;
  // With etcd: called on every role change with the new role() (and when the leader a standby
  // follows changes). Empty: none.
  std::function<void(std::string_view role)> on_role_change;
};

class GuardedHttpServer;

// larder-master: the gRPC service and the HTTP endpoint over one MasterState.
// Thread-safe; Shutdown (or destruction) stops both servers and the sweeper.
class MasterServer {
 public:
  // Binds both ports and starts serving (with etcd: starts campaigning; calls are served once it
  // leads). Errors: Unavailable (a port is taken); InvalidArgument (bad options);
  // FailedPrecondition (another master of `cluster_id` runs on this host, without etcd).
  static Result<std::unique_ptr<MasterServer>> Start(MasterServerOptions options);
  ~MasterServer();

  uint16_t port() const;
  // Calls served on the local control socket so far (0 without one).
  uint64_t local_control_calls() const;
  const std::string& listen_host() const;  // as resolved (see MasterServerOptions::listen_host)
  int http_port() const;                   // -1 when disabled
  // "host:port" clients can dial on this machine.
  std::string address() const;
  MasterState& state();
  // The HTTP server's gate (what it holds and refused), nullptr when HTTP is disabled.
  const GuardedHttpServer* http_server() const;
  // "leader", "standby" or "fenced" (lost the leadership; serves nothing) with etcd, "single"
  // without; "stopped" after Shutdown with etcd.
  std::string role() const;

  // Stops accepting calls, finishes in-flight ones, stops the sweeper; a leader then steps down
  // (deletes its key and revokes its lease) so that a standby takes over at once. Idempotent.
  void Shutdown();

 private:
  struct Impl;
  explicit MasterServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace larder::master
