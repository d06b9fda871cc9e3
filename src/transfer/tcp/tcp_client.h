// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Client side of the tcp data protocol: connecting (TLS and the mutual token proof, tcp_frame.h),
// asking a peer for its segment descriptors, and the per-peer connection pool that moves slices.
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
#include "transfer/tcp/tcp_stream.h"
#include "transfer/transport.h"

namespace larder::transfer::tcp {

// What an engine proves and checks when it dials a data server. Immutable; one is shared by all
// of a transport's connections.
struct TcpClientConfig {
  std::string engine_id;                  // named in this client's proofs
  std::string token;                      // the cluster token; empty: none
  std::shared_ptr<const TlsContext> tls;  // the CA to verify servers with; null: plain tcp only

  // From an engine's context (engine_id, auth_token, tls_ca_file). InvalidArgument naming the file
  // when the CA does not load.
  static Result<std::shared_ptr<const TcpClientConfig>> FromContext(const EngineContext& context);
};

// Connects to a data server and completes the exchange of tcp_frame.h: TLS when the server offers
// it, then the mutual token proof when the server asks for one. The returned stream is ready for
// data frames: the server proved the token (when `config` has one) on this very connection.
// Unavailable when unreachable; PermissionDenied when either side lacks the other's requirement
// (a token, TLS), when the server refuses our proof, when the server fails to prove the token,
// or when its certificate does not verify; DataLoss for a malformed hello or reply.
Result<TcpStream> ConnectAndAuthenticate(const HostPort& address, const TcpClientConfig& config,
                                         Deadline deadline);

// The descriptors of every segment exported by the engine at `address`. Errors as for
// ConnectAndAuthenticate, plus DataLoss for a malformed reply.
Result<std::vector<SegmentDescriptor>> FetchDescriptors(const HostPort& address,
                                                        const TcpClientConfig& config,
                                                        Deadline deadline);
// The same with the configuration of an engine's context (TcpClientConfig::FromContext).
Result<std::vector<SegmentDescriptor>> FetchDescriptors(const HostPort& address,
                                                        const EngineContext& context,
                                                        Deadline deadline);

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
