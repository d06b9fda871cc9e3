// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The attach side's connection to larder-client: requests from any number of threads travel over
// one socket, each with its own request id, and a reader thread hands every reply to the thread
// that waits for it. Once the daemon is gone (it closed the socket, said Goodbye, sent garbage, or
// a reply did not come within the timeout), every waiting and later call fails with the same
// status: Unavailable "larder-client at <socket> is gone: <why>" (or the code of the daemon's
// Goodbye, e.g. PermissionDenied for a refused uid).
//
// Thread-safety: Call may be called from any thread at once.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "common/mutex.h"
#include "common/net.h"
#include "larder/status.h"
#include "standalone/frame_io.h"
#include "standalone/protocol.h"

namespace larder::standalone {

class Channel {
 public:
  // Connects and checks that the daemon runs as this process's uid or as root. Errors:
  // Unavailable (nobody serves the socket), PermissionDenied (another uid serves it).
  static Result<std::unique_ptr<Channel>> Open(const SocketAddress& address,
                                               std::chrono::milliseconds timeout);
  // Closes the socket and joins the reader.
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // Sends a request with `payload` (and `pass_fd` when >= 0) and returns the reply payload: its
  // leading status, then the body. Errors: the gone status (above).
  Result<std::string> Call(MessageType type, std::string_view payload, int pass_fd = -1);

  const SocketAddress& address() const { return address_; }
  // OK while the daemon serves us.
  Status gone() const;

 private:
  Channel(SocketAddress address, Fd fd, std::chrono::milliseconds timeout);
  void ReadLoop();
  void MarkGone(const Status& why);
  Status Gone(std::string_view why) const;

  const SocketAddress address_;
  const Fd fd_;
  const std::chrono::milliseconds timeout_;
  std::atomic<uint64_t> next_id_{1};
  Mutex send_mu_;  // one frame at a time on fd_

  struct Pending {
    uint16_t type = 0;  // of the request
    bool done = false;
    std::string payload;
  };
  mutable Mutex mu_;
  CondVar cv_;
  std::unordered_map<uint64_t, Pending*> pending_ LARDER_GUARDED_BY(mu_);
  Status gone_ LARDER_GUARDED_BY(mu_);
  std::thread reader_;
};

}  // namespace larder::standalone
