// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Leader election of larder-master through etcd, and the fencing that keeps two masters of one
// cluster from ever serving at the same time (docs/store.md, "High availability").
//
// Every master of a cluster holds an etcd lease and campaigns for etcd::LeaderKey(cluster_id):
// the one whose put-if-absent creates it (attached to its lease, holding its LeaderRecord) leads;
// the others are standbys that poll the key (every lease_ttl/10) and campaign again once it is
// gone, i.e. once the leader stepped down or its lease lapsed. The leader keeps its lease alive
// every lease_ttl/3.
//
// Fencing: the leader serves only until
//     (steady time at which its last successful keep-alive request was SENT) + TTL - margin.
// etcd renews a lease when it receives the keep-alive, which is after it was sent, so this local
// deadline passes before etcd can expire the lease, and so before any standby can create the key.
// Past it (etcd unreachable, the lease expired or was revoked, the key deleted or taken) the
// master serves nothing, ever again: CheckServing says why and `on_lost` lets the process exit
// (a supervisor restarts it as a standby). Operators deleting the key by hand defeat this for up
// to lease_ttl/3 (the leader re-reads its key with every keep-alive).
//
// Thread safety: thread-safe. CheckServing is one atomic load and a clock read while serving;
// one background thread talks to etcd.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "etcd/etcd_client.h"
#include "larder/status.h"
#include "master/service.h"

namespace larder::master {

struct LeaderElectionOptions {
  // etcd members, "host:port" (etcd::ParseEtcdEndpoints). Required: at least one.
  std::vector<std::string> etcd_endpoints;
  // The cluster whose leadership this master seeks (etcd::ValidateClusterId). Required.
  std::string cluster_id;
  // What the leader publishes (etcd::LeaderRecord): the gRPC address clients dial (required),
  // its HTTP port (-1: none) and its MasterState incarnation.
  std::string advertise_address;
  int http_port = -1;
  uint64_t incarnation = 0;
  // TTL of the etcd lease: a crashed leader is replaced after about this long. etcd counts whole
  // seconds (rounded up) and may raise it to its minimum. Default 3 s; at least 1 s.
  std::chrono::milliseconds lease_ttl{3000};
  // How much earlier than its lease the leader stops serving (covers calls in flight and clock
  // rate differences). 0 (default): a tenth of the granted TTL, within [100 ms, 1 s].
  std::chrono::milliseconds fence_margin{0};
  // Deadline of each etcd call. 0 (default): a third of lease_ttl, within [200 ms, 2 s].
  std::chrono::milliseconds etcd_timeout{0};
  // Called once, from the election's thread, when this master led and lost the leadership; with
  // the reason (the Unavailable status CheckServing returns from then on). Empty: none.
  std::function<void(const Status& why)> on_lost;
  // Called from the election's thread on every role change, with RoleName of the new role.
  // Empty: none.
  std::function<void(std::string_view role)> on_role_change;
};

class LeaderElection final : public ServingGate {
 public:
  enum class Role {
    kStandby,  // campaigning or waiting: no leader known yet, or another master leads
    kLeader,   // leads and serves while its lease is current
    kFenced,   // led and lost the leadership: never serves again
    kStopped,  // Stop() ran
  };
  // "standby", "leader", "fenced", "stopped".
  static std::string_view RoleName(Role role);

  // Starts campaigning in the background; returns at once (etcd may be down: the master stays a
  // standby until it answers). Errors: InvalidArgument for missing or malformed options.
  static Result<std::unique_ptr<LeaderElection>> Start(LeaderElectionOptions options);
  // Stop().
  ~LeaderElection() override;
  LeaderElection(const LeaderElection&) = delete;
  LeaderElection& operator=(const LeaderElection&) = delete;

  // OK while this master leads and its fencing deadline has not passed. Otherwise Unavailable:
  //   "larder-master is a standby of cluster X; the leader is at ADDR" (or "no leader is known
  //   yet"), or "larder-master lost the leadership of cluster X: its etcd lease lapsed at TIME,
  //   etcd unreachable: ERROR" (or what else ended it).
  Status CheckServing() const override;

  // The current role; a leader whose deadline passed is kFenced even before the background
  // thread noticed.
  Role role() const;
  // The leader's record as this master last saw it (its own while it leads); nullopt when none
  // is known.
  std::optional<etcd::LeaderRecord> leader() const;
  const std::string& cluster_id() const { return options_.cluster_id; }

  // Stops campaigning. A leader first stops serving, then deletes its key (DeleteIfLease) and
  // revokes its lease, so that a standby takes over at once; a standby revokes its lease.
  // Blocks for at most a few etcd calls. Idempotent.
  void Stop();

  // For tests of fencing: stops the background thread as if the process hung, releasing
  // nothing. No keep-alive is sent any more; CheckServing turns Unavailable once the deadline
  // passes and the lease then lapses in etcd. Stop() afterwards releases nothing either.
  void AbandonForTesting();

 private:
  using Clock = std::chrono::steady_clock;

  LeaderElection(LeaderElectionOptions options, std::unique_ptr<etcd::EtcdClient> etcd);
  void Run();
  // One step of the campaign; returns when the next is due.
  Clock::time_point Step();
  Clock::time_point LeaderStep(Clock::time_point now);
  Clock::time_point StandbyStep(Clock::time_point now);
  // Keeps the lease alive when due. False when the lease is gone (NotFound).
  bool RenewIfDue(Clock::time_point now, bool* renewed);
  void BecomeLeader();
  void BecomeStandby(std::optional<etcd::LeaderRecord> leader);
  void Fence(std::string why);
  void NoteError(const Status& status);
  void SetRole(Role role);
  Clock::time_point ServingDeadline() const;
  // serving_until_ns_ when still serving (> 0); otherwise <= 0, marking a lapse as final.
  int64_t ServingUntil() const;
  std::chrono::milliseconds Margin() const;
  std::string LapsedMessage(Clock::time_point deadline, const std::string& last_error) const;

  const LeaderElectionOptions options_;
  const std::string key_;
  const std::string record_;  // our encoded LeaderRecord
  const std::unique_ptr<etcd::EtcdClient> etcd_;

  // Steady-clock nanoseconds until which this master may serve; 0 while it may not; -T once
  // deadline T passed (final: a late renewal no longer extends it). Mutable: a const
  // CheckServing marks the lapse.
  mutable std::atomic<int64_t> serving_until_ns_{0};

  // Owned by the background thread (and by Stop once it has joined it).
  int64_t lease_id_ = 0;
  std::chrono::milliseconds granted_ttl_{0};
  Clock::time_point renewal_sent_{};    // when the last successful grant/keep-alive was sent
  Clock::time_point next_keepalive_{};  // when the next keep-alive is due

  mutable Mutex mu_;
  CondVar wake_;
  bool stop_ LARDER_GUARDED_BY(mu_) = false;
  bool abandoned_ LARDER_GUARDED_BY(mu_) = false;
  Role role_ LARDER_GUARDED_BY(mu_) = Role::kStandby;
  std::optional<etcd::LeaderRecord> leader_ LARDER_GUARDED_BY(mu_);
  std::string last_error_ LARDER_GUARDED_BY(mu_);  // the last etcd error, or ""
  Status lost_ LARDER_GUARDED_BY(mu_);             // why it was fenced
  Mutex stop_mu_;                                  // serializes Stop and AbandonForTesting
  std::thread thread_;
};

}  // namespace larder::master
