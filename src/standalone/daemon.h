// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// larder::standalone::ClientDaemon: the library behind the larder-client binary. It owns a
// StoreClient (the host's global segment, master traffic, heartbeats) and serves attached
// processes of this host on a Unix socket (protocol.h, docs/standalone.md).
//
// Isolation: every connection has its own reader thread and up to max_in_flight worker threads,
// so a client that stalls, floods or dies delays only itself. A peer that is neither this
// process's uid nor root is refused (SO_PEERCRED) before a byte is read. A malformed frame header
// ends that connection (with a Goodbye saying why); a malformed request gets an error reply.
// A client's shared regions are unmapped when its connection ends, after its running requests
// finish; the objects it stored stay in the segment.
//
// Thread-safety: Stop may be called from any thread, once or more; the accessors are constant.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "common/net.h"
#include "larder/status.h"
#include "larder/store_client.h"
#include "standalone/frame_io.h"

namespace larder::standalone {

// Every field has its default here and in docs/standalone.md.
struct ClientDaemonOptions {
  // The daemon's StoreClient (segment size, master, tenant, token, ...).
  StoreClientOptions store;
  // Where to listen: "@name", a path, or "host:port" (see ResolveSocketAddress).
  std::string socket = std::string(kDefaultSocket);
  // Connections served at once; more are refused with ResourceExhausted.
  size_t max_clients = 64;
  // Requests of one connection served at once; further ones wait in the socket.
  size_t max_in_flight = 8;
  // Shared regions one connection may register.
  size_t max_regions = 1024;
  // A frame that has begun must arrive whole within this, and a reply must be taken by the
  // client within this; otherwise the connection is closed.
  std::chrono::milliseconds frame_timeout{10000};
};

class ClientDaemon {
 public:
  // Listens, creates the StoreClient (mounting its segment) and starts serving. Errors:
  // InvalidArgument (bad socket or options), AlreadyExists (the socket is served already), and
  // StoreClient::Create's errors.
  static Result<std::unique_ptr<ClientDaemon>> Start(const ClientDaemonOptions& options);
  // Stops (see Stop).
  ~ClientDaemon();
  ClientDaemon(const ClientDaemon&) = delete;
  ClientDaemon& operator=(const ClientDaemon&) = delete;

  // Stops accepting, tells every client it is going (Goodbye, Unavailable), closes the
  // connections once their running requests end, and unmounts the segment (objects with no other
  // replica leave the pool).
  void Stop();

  // "@name" or the path.
  const std::string& socket_address() const { return address_.display; }
  const std::string& segment_name() const { return store_->segment_name(); }
  // Connections being served now.
  size_t connections() const;

 private:
  struct Connection;

  ClientDaemon(ClientDaemonOptions options, SocketAddress address, Fd listener);
  void AcceptLoop();
  void Refuse(Fd fd, const Status& why, const std::string& peer);
  void Serve(Connection* connection);
  void Work(Connection* connection);
  // Joins and frees connections whose reader has ended.
  void Reap();

  const ClientDaemonOptions options_;
  const SocketAddress address_;
  Fd listener_;
  Fd stop_read_, stop_write_;  // a byte on the pipe wakes the accept loop
  std::unique_ptr<StoreClient> store_;
  std::thread acceptor_;
  std::atomic<bool> stopping_{false};
  std::once_flag stopped_;

  mutable Mutex mu_;
  std::list<std::unique_ptr<Connection>> connections_ LARDER_GUARDED_BY(mu_);
};

}  // namespace larder::standalone
