// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The engine's tcp data server: answers descriptor queries and reads/writes of exported segments
// (tcp_frame.h). One thread per connection; every frame is bounds-checked against the segment
// table, and a bad frame gets an error frame, never silence or a crash. Thread-safe.
#pragma once

#include <atomic>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/net.h"
#include "transfer/transport.h"

namespace larder::transfer::tcp {

class TcpDataServer {
 public:
  explicit TcpDataServer(const EngineContext& context);
  ~TcpDataServer();

  // Binds `listen` (port 0: any free port) and starts accepting.
  Status Start(const HostPort& listen);
  // Closes the listener and every connection, then joins their threads.
  void Stop();
  uint16_t port() const { return port_; }

 private:
  struct Connection {
    Fd fd;
    std::string peer;
    std::thread thread;
    std::atomic<bool> done{false};
  };

  void AcceptLoop();
  void Serve(Connection* conn);
  // Handles one frame; false when the connection must be closed.
  bool HandleFrame(Connection* conn, const uint8_t* raw_header, bool* authenticated,
                   const uint8_t* nonce);
  Status SendError(Connection* conn, uint64_t request_id, const Status& status);
  void ReapFinished();

  EngineContext context_;
  Fd listener_;
  uint16_t port_ = 0;
  std::thread accept_thread_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::list<std::unique_ptr<Connection>> connections_;  // guarded by mu_
};

}  // namespace larder::transfer::tcp
