// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The engine's tcp data server: answers descriptor queries and reads/writes of exported segments
// (tcp_frame.h). One thread per connection; every frame is bounds-checked against the segment
// table, and a bad frame gets an error frame, never silence or a crash. With a cluster token it
// serves only clients that prove it on the connection (and proves it back); with a certificate it
// speaks only TLS. Thread-safe.
#pragma once

#include <atomic>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/net.h"
#include "transfer/tcp/tcp_auth.h"
#include "transfer/tcp/tcp_frame.h"
#include "transfer/tcp/tcp_stream.h"
#include "transfer/transport.h"

namespace larder::transfer::tcp {

class TcpDataServer {
 public:
  // Uses the context's engine_id, auth_token, TLS files and exports (context.tcp_endpoint is not
  // known yet when the engine creates its server: see set_advertised_endpoint).
  explicit TcpDataServer(const EngineContext& context);
  ~TcpDataServer();

  // Loads the TLS certificate and key when configured (and checks that the CA file loads, so that
  // a bad one fails at engine start whatever the routes), binds `listen` (port 0: any free port)
  // and starts accepting. InvalidArgument naming the file when a TLS file does not load, or when
  // only one of certificate and key is set.
  Status Start(const HostPort& listen);
  // The "ip:port" peers are told to dial (the descriptors' tcp_endpoint). A client's proof names
  // the endpoint it dialed; the server accepts this one or the local address of the connection.
  void set_advertised_endpoint(std::string endpoint);
  // Closes the listener and every connection, then joins their threads.
  void Stop();
  uint16_t port() const { return port_; }

 private:
  struct Connection {
    TcpStream stream;
    std::thread thread;
    std::atomic<bool> done{false};
  };
  // Where a connection is in the auth exchange.
  struct AuthState {
    bool authenticated = false;
    AuthNonce server_nonce{};
  };

  void AcceptLoop();
  void Serve(Connection* conn);
  // Handles one frame; false when the connection must be closed.
  bool HandleFrame(Connection* conn, const uint8_t* raw_header, AuthState* auth);
  // Checks a kAuth frame (header `h`, payload not read yet) and answers it; false when the
  // connection must be closed.
  bool HandleAuth(Connection* conn, const FrameHeader& h, AuthState* auth);
  Status SendError(Connection* conn, uint64_t request_id, const Status& status);
  void ReapFinished();
  std::string advertised_endpoint() const;

  const EngineContext context_;
  std::shared_ptr<const TlsContext> tls_;  // set by Start; null: plain tcp
  Fd listener_;
  uint16_t port_ = 0;
  std::thread accept_thread_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::list<std::unique_ptr<Connection>> connections_;  // guarded by mu_
  mutable std::mutex endpoint_mu_;
  std::string advertised_endpoint_;  // guarded by endpoint_mu_
};

}  // namespace larder::transfer::tcp
