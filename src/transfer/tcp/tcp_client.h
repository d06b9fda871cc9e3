// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Client side of the tcp transport: the per-peer connection pool that moves slices over the frame
// protocol (transfer/wire/frame.h) to a peer's frame server.
#pragma once

#include <deque>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/net.h"
#include "transfer/transport.h"
#include "transfer/wire/client.h"

namespace larder::transfer::tcp {

using wire::TcpClientConfig;
using wire::TcpStream;

// A pool of connections to one peer for one traffic class, each served by one thread that
// pipelines slices: it sends up to kPipelineDepth requests, then reads their replies in order.
// Queued slices are taken earliest deadline first. A latency pool's requests carry kFlagLatency;
// a bulk pool's threads run at bulk priority (common/priority.h). The transport keeps one pool of
// each class per peer, so a latency request never waits behind a bulk window on a connection. A
// peer that cannot be reached is backed off exponentially (100 ms doubling to 5 s); during the
// backoff its slices fail at once with Unavailable instead of hammering it. Thread-safe.
class TcpPeer {
 public:
  // REQUIRES: config is not null. `engine_id`: the engine the server must prove to be (with a
  // token; see ConnectAndAuthenticate).
  TcpPeer(HostPort address, std::string engine_id, std::shared_ptr<const TcpClientConfig> config,
          size_t connections, bool latency);
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
  const std::string engine_id_;
  const std::shared_ptr<const TcpClientConfig> config_;
  const std::string name_;
  const size_t connections_;
  const bool latency_;

  Mutex mu_;
  CondVar cv_;
  std::deque<Job> queue_ LARDER_GUARDED_BY(mu_);
  std::vector<std::thread> workers_ LARDER_GUARDED_BY(mu_);
  bool stopping_ LARDER_GUARDED_BY(mu_) = false;
  size_t idle_ LARDER_GUARDED_BY(mu_) = 0;  // workers waiting for work
  int failures_ LARDER_GUARDED_BY(mu_) = 0;
  Deadline retry_after_ LARDER_GUARDED_BY(mu_) = {};
  Status last_failure_ LARDER_GUARDED_BY(mu_);
};

}  // namespace larder::transfer::tcp
