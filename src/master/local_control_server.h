// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// larder-master's local control socket (common/local_control.h, docs/wire-protocols.md): clients
// on the master's host send their calls here rather than over gRPC, and each is served as the
// gRPC method serves it (ServedMaster::ServeLocal): the same proofs, the same replies. A thread
// per connection, at most `max_connections`; a connection past that is closed at once, and its
// client goes on over gRPC.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "common/net.h"
#include "master/service.h"

namespace larder::master {

class LocalControlServer {
 public:
  static constexpr size_t kDefaultMaxConnections = 256;

  // Listens on a fresh abstract socket, "larder-master-<16 random hex digits>": a name no other
  // process can hold before this one (the master tells it to its clients, over gRPC). Serves
  // nothing before Start.
  static Result<std::unique_ptr<LocalControlServer>> Listen(
      size_t max_connections = kDefaultMaxConnections);
  ~LocalControlServer();
  LocalControlServer(const LocalControlServer&) = delete;
  LocalControlServer& operator=(const LocalControlServer&) = delete;

  const std::string& name() const { return name_; }
  // Serves calls through `service`, which outlives this server (or its Stop).
  void Start(ServedMaster* service);
  // Stops accepting, ends every connection (a call being served finishes first) and waits for
  // their threads. Idempotent.
  void Stop();
  // Calls served so far, and connections refused for the limit.
  uint64_t calls() const { return calls_.load(std::memory_order_relaxed); }
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  struct Connection {
    Fd fd;
    std::thread thread;
    std::atomic<bool> done{false};
  };

  LocalControlServer(std::string name, Fd listener, Fd wake, size_t max_connections);
  void AcceptLoop();
  void ServeConnection(int fd);

  const std::string name_;
  const size_t max_connections_;
  Fd listener_;
  Fd wake_;  // an eventfd: Stop wakes the accept loop with it
  ServedMaster* service_ = nullptr;
  std::thread acceptor_;
  Mutex mu_;
  bool stopping_ LARDER_GUARDED_BY(mu_) = false;
  std::list<std::unique_ptr<Connection>> connections_ LARDER_GUARDED_BY(mu_);
  std::atomic<uint64_t> calls_{0};
  std::atomic<uint64_t> refused_{0};
};

}  // namespace larder::master
