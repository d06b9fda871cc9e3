// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Client side of the tcp transport: the per-peer connection pool that moves slices over the frame
// protocol (transfer/wire/frame.h) to a peer's frame server.
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
#include "transfer/wire/client.h"

namespace larder::transfer::tcp {

using wire::TcpClientConfig;
using wire::TcpStream;

// A pool of connections to one peer, each served by one thread that pipelines slices: it sends up
// to kPipelineDepth requests, then reads their replies in order. A peer that cannot be reached is
// backed off exponentially (100 ms doubling to 5 s); during the backoff its slices fail at once
// with Unavailable instead of hammering it. Thread-safe.
class TcpPeer {
 public:
  // REQUIRES: config is not null.
  TcpPeer(HostPort address, std::shared_ptr<const TcpClientConfig> config, size_t connections);
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
  void RunJobs(TcpStream* conn, std::vector<Job>& jobs);
  Status CheckBackoff();
  void RecordFailure(const Status& status);
  void RecordSuccess();

  const HostPort address_;
  const std::shared_ptr<const TcpClientConfig> config_;
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
