// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Client side of the tcp data protocol: connecting with the token challenge, asking a peer for its
// segment descriptors, and the per-peer connection pool that moves slices.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/net.h"
#include "transfer/transport.h"

namespace larder::transfer::tcp {

// Connects to a data server and completes the hello/auth exchange.
// Unavailable when unreachable; PermissionDenied when the token is missing or wrong.
Result<Fd> ConnectAndAuthenticate(const HostPort& address, const std::string& token,
                                  Deadline deadline);

// The descriptors of every segment exported by the engine at `address`.
Result<std::vector<SegmentDescriptor>> FetchDescriptors(const HostPort& address,
                                                        const std::string& token,
                                                        Deadline deadline);

// A pool of connections to one peer, each served by one thread that pipelines slices: it sends up
// to kPipelineDepth requests, then reads their replies in order. A peer that cannot be reached is
// backed off exponentially (100 ms doubling to 5 s); during the backoff its slices fail at once
// with Unavailable instead of hammering it. Thread-safe.
class TcpPeer {
 public:
  TcpPeer(HostPort address, std::string token, size_t connections);
  ~TcpPeer();

  const std::string& name() const { return name_; }
  // Queues slices of segment `segment_id`; each is reported to `done` exactly once.
  void Enqueue(uint64_t segment_id, std::span<Slice* const> slices, SliceCallback* done);
  // Fails queued slices with Cancelled and joins the connection threads.
  void Stop();

 private:
  struct Job {
    Slice* slice;
    uint64_t segment_id;
    SliceCallback* done;
  };

  void Worker();
  // Moves `jobs` over `conn`, reconnecting first if needed; reports every job.
  void RunJobs(Fd* conn, std::vector<Job>& jobs);
  Status CheckBackoff();
  void RecordFailure(const Status& status);
  void RecordSuccess();

  const HostPort address_;
  const std::string token_;
  const std::string name_;
  const size_t connections_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;             // guarded by mu_
  std::vector<std::thread> workers_;  // guarded by mu_
  bool stopping_ = false;             // guarded by mu_
  int failures_ = 0;                  // guarded by mu_
  Deadline retry_after_{};            // guarded by mu_
  Status last_failure_;               // guarded by mu_
};

}  // namespace larder::transfer::tcp
