// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The engine's frame server: one listener on the engine's listen address, speaking the frame
// protocol of frame.h. It does the connection set-up itself (hello, TLS, the mutual token proof)
// and hands every later frame to the handler registered for its type: the engine's bootstrap
// service answers kDescribe, the tcp transport kRead and kWrite. A frame no handler takes gets an
// error frame and the connection is closed. One thread per connection; with a cluster token it
// serves only clients that prove it on the connection (and proves it back); with a certificate it
// speaks only TLS. Thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "common/net.h"
#include "transfer/transport.h"
#include "transfer/wire/auth.h"
#include "transfer/wire/frame.h"
#include "transfer/wire/stream.h"

namespace larder::transfer::wire {

// One accepted connection, as a handler sees it.
class FrameConnection {
 public:
  TcpStream& stream() { return stream_; }
  // Sends an error frame for `request_id`.
  Status SendError(uint64_t request_id, const Status& status);
  // Sends a frame of `type` for `request_id` that carries `payload`.
  Status SendReply(FrameType type, uint64_t request_id, std::string_view payload);

 private:
  friend class FrameServer;
  TcpStream stream_;
  std::thread thread_;
  std::atomic<bool> done_{false};
  bool bulk_priority_ = false;
  bool latency_priority_ = false;  // this connection's thread runs at bulk priority
};

// Once a frame has started, the rest of it must arrive within this time.
inline constexpr auto kFrameTimeout = std::chrono::seconds(30);
inline Deadline FrameDeadline() { return Clock::now() + kFrameTimeout; }

class FrameServer {
 public:
  // Handles one authenticated frame of its type (header read, payload not); false when the
  // connection must be closed. Runs on the connection's thread.
  using Handler = std::function<bool(FrameConnection& connection, const FrameHeader& header)>;

  // Uses the context's engine_id, auth_token and TLS files.
  explicit FrameServer(const EngineContext& context);
  ~FrameServer();

  // Loads the TLS certificate and key when configured (and checks that the CA file loads, so that
  // a bad one fails at engine start whatever the routes) and binds `listen` (port 0: any free
  // port). InvalidArgument naming the file when a TLS file does not load, or when only one of
  // certificate and key is set.
  Status Listen(const HostPort& listen);
  // REQUIRES: between Listen and Serve. `type` is a request type (kDescribe, kRead, kWrite).
  void Handle(FrameType type, Handler handler);
  // The "ip:port" peers are told to dial. A client's proof names the endpoint it dialed; the
  // server accepts this one or the local address of the connection. REQUIRES: before Serve.
  void set_advertised_endpoint(std::string endpoint) { advertised_endpoint_ = std::move(endpoint); }
  // Starts accepting. REQUIRES: after Listen.
  void Serve();
  // Closes the listener and every connection, then joins their threads.
  void Stop();
  uint16_t port() const { return port_; }

 private:
  // Where a connection is in the auth exchange.
  struct AuthState {
    bool authenticated = false;
    AuthNonce server_nonce{};
  };

  void AcceptLoop();
  void ServeConnection(FrameConnection* conn);
  // Handles one frame; false when the connection must be closed.
  bool HandleFrame(FrameConnection* conn, const uint8_t* raw_header, AuthState* auth);
  // Checks a kAuth frame (header `h`, payload not read yet) and answers it; false when the
  // connection must be closed.
  bool HandleAuth(FrameConnection* conn, const FrameHeader& h, AuthState* auth);
  void ReapFinished();

  const EngineContext context_;
  std::shared_ptr<const TlsContext> tls_;  // set by Listen; null: plain tcp
  Fd listener_;
  uint16_t port_ = 0;
  std::string advertised_endpoint_;                                           // set before Serve
  std::array<Handler, static_cast<size_t>(FrameType::kError) + 1> handlers_;  // set before Serve
  std::thread accept_thread_;
  std::atomic<bool> stopping_{false};
  Mutex mu_;
  std::list<std::unique_ptr<FrameConnection>> connections_ LARDER_GUARDED_BY(mu_);
};

}  // namespace larder::transfer::wire
