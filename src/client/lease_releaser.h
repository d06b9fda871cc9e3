// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The lease releases of a store client. A get's lease is released as soon as its copy has ended:
// the id waits here for the client's next master call to carry it (no round trip of its own while
// the client is busy), and a thread sends whatever is still waiting after `delay`. A release that
// is lost (the call carrying it failed) costs nothing but the lease's TTL.
//
// Every release queued before a call starts reaches the master before that call does: the call
// carries it (TakeForCall), or waits for the thread's send that carries it. So a client that read
// a key and then removes it never finds its own read in the way.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace larder::client {

// Thread-safe.
class LeaseReleaser {
 public:
  // `send` delivers a batch of ids to the master (on the thread, or in Stop).
  using SendFn = std::function<void(std::vector<uint64_t>)>;
  LeaseReleaser(std::chrono::microseconds delay, SendFn send)
      : delay_(delay), send_(std::move(send)) {}
  // Stops (see Stop).
  ~LeaseReleaser();
  LeaseReleaser(const LeaseReleaser&) = delete;
  LeaseReleaser& operator=(const LeaseReleaser&) = delete;

  // Starts the sending thread.
  void Start();
  // Stops the thread and sends what is still waiting. Idempotent.
  void Stop();
  // A lease to release (0: none).
  void Queue(uint64_t lease_id);
  // Every id waiting, for a call that carries them; first waits for a send in progress.
  std::vector<uint64_t> TakeForCall();

 private:
  using SteadyClock = std::chrono::steady_clock;
  void Loop();

  const std::chrono::microseconds delay_;
  const SendFn send_;
  Mutex mu_;
  CondVar cv_;
  std::vector<uint64_t> pending_ LARDER_GUARDED_BY(mu_);
  // When pending_[0] was queued.
  SteadyClock::time_point oldest_pending_ LARDER_GUARDED_BY(mu_);
  // The thread sleeps until a release is queued.
  bool idle_ LARDER_GUARDED_BY(mu_) = false;
  // The thread is sending some.
  bool in_flight_ LARDER_GUARDED_BY(mu_) = false;
  bool stopping_ LARDER_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace larder::client
