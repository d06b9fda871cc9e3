// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

// The master's HTTP server: httplib's, behind a gate that no client can hold open.
//
// httplib reads a request on one of a fixed number of worker threads, with a timeout on each
// read() rather than on the whole request, so a client that sends half a header and stops holds
// a worker for seconds, and one that sends a byte now and then holds it for good: a few dozen
// such connections, without any token, freeze /health. The gate runs first on each connection:
//   - the whole request (header, and a body up to max_request_bytes) must arrive within
//     request_deadline, or the connection is closed without an answer;
//   - a peer (an IP address) holds at most connections_per_peer connections; one more closes that
//     peer's oldest connection still waiting for its request, or, when none waits, is closed;
//   - each connection carries one request (no keep-alive), so that every request passes the gate.
// The gate reads the request itself; httplib then parses it from memory (process_request over a
// Stream of those bytes) and writes its answer with a deadline on the whole response, so /health
// is answered while other connections stall.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>

#include <httplib.h>

#include "common/mutex.h"

namespace larder::master {

struct HttpServerLimits {
  size_t threads = 64;
  size_t connections_per_peer = 16;
  std::chrono::milliseconds request_deadline{5000};
  // Writing the whole answer (a client that reads it slowly loses it).
  std::chrono::milliseconds response_deadline{30000};
  // Header and body together: a longer header gets 431, a longer body 413.
  size_t max_header_bytes = 8 * 1024;
  size_t max_request_bytes = 64 * 1024;
};

class GuardedHttpServer : public httplib::Server {
 public:
  explicit GuardedHttpServer(HttpServerLimits limits = {});

  // httplib's bind_to_port / bind_to_any_port, with a listen backlog of kBacklog instead of
  // httplib's 5: a burst of connections (stalled ones among them) would otherwise overflow the
  // accept queue, and each dropped SYN costs its client a 1 s retransmission.
  bool Bind(const std::string& host, int port);
  int BindToAnyPort(const std::string& host);
  static constexpr int kBacklog = 1024;

  // Connections the gate closed unserved: no whole request by the deadline (or too long), or one
  // too many for their peer.
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }
  // Connections inside the gate now, their request not yet whole (not those it has evicted).
  size_t waiting() const;

 protected:
  bool process_and_close_socket(socket_t sock) override;

 private:
  struct Connection {
    int fd = -1;
    bool waiting = true;  // still inside the gate; only such a connection is ever evicted
    bool evicted = false;
  };
  using Connections = std::list<Connection>;

  // Registers `fd` for `peer`; false when the peer has its share in requests being served.
  bool Admit(const std::string& peer, int fd, Connections::iterator* out);
  // Leaves the gate: true when the connection may be served (not evicted).
  bool Pass(Connections::iterator connection);
  void Forget(const std::string& peer, Connections::iterator connection);
  // Reads one whole request from `fd` into `request` by the deadline; false: none came whole.
  bool ReadRequest(int fd, std::string* request) const;

  const HttpServerLimits limits_;
  std::atomic<uint64_t> refused_{0};
  mutable Mutex mu_;
  std::unordered_map<std::string, Connections> peers_ LARDER_GUARDED_BY(mu_);
};

}  // namespace larder::master
