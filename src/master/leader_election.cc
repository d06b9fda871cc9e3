// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/leader_election.h"

#include <ctime>

#include "common/logging.h"
#include "common/mutex.h"

namespace larder::master {

namespace {

using std::chrono::milliseconds;

int64_t ToNanos(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// "2024-05-01T12:00:03.250Z": the wall-clock time at which steady time `t` is (or was).
std::string WallTime(std::chrono::steady_clock::time_point t) {
  const auto wall = std::chrono::system_clock::now() +
                    std::chrono::duration_cast<std::chrono::system_clock::duration>(
                        t - std::chrono::steady_clock::now());
  const std::time_t seconds = std::chrono::system_clock::to_time_t(wall);
  const auto millis =
      std::chrono::duration_cast<milliseconds>(wall.time_since_epoch()).count() % 1000;
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char buffer[40];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%S", &utc);
  char out[48];
  snprintf(out, sizeof(out), "%s.%03dZ", buffer, static_cast<int>(millis));
  return out;
}

milliseconds Clamp(milliseconds value, milliseconds low, milliseconds high) {
  return std::max(low, std::min(value, high));
}

}  // namespace

std::string_view LeaderElection::RoleName(Role role) {
  switch (role) {
    case Role::kStandby:
      return "standby";
    case Role::kLeader:
      return "leader";
    case Role::kFenced:
      return "fenced";
    case Role::kStopped:
      return "stopped";
  }
  return "unknown";
}

Result<std::unique_ptr<LeaderElection>> LeaderElection::Start(LeaderElectionOptions options) {
  if (options.etcd_endpoints.empty()) {
    return InvalidArgumentError("leader election needs at least one etcd endpoint");
  }
  LARDER_RETURN_IF_ERROR(etcd::ValidateClusterId(options.cluster_id));
  if (options.advertise_address.empty()) {
    return InvalidArgumentError("leader election needs the address clients dial (advertise)");
  }
  if (options.lease_ttl < std::chrono::seconds(1)) {
    std::string message = "leader lease TTL must be at least 1 s (got ";
    message += std::to_string(options.lease_ttl.count());
    message += " ms)";
    return InvalidArgumentError(message);
  }
  if (options.fence_margin.count() < 0 || options.fence_margin >= options.lease_ttl) {
    return InvalidArgumentError("the fencing margin must be within [0, lease TTL)");
  }
  etcd::EtcdOptions etcd_options;
  etcd_options.endpoints = options.etcd_endpoints;
  etcd_options.timeout = options.etcd_timeout.count() > 0
                             ? options.etcd_timeout
                             : Clamp(options.lease_ttl / 3, milliseconds(200), milliseconds(2000));
  LARDER_ASSIGN_OR_RETURN(std::unique_ptr<etcd::EtcdClient> etcd,
                          etcd::EtcdClient::Create(std::move(etcd_options)));
  std::unique_ptr<LeaderElection> election(new LeaderElection(std::move(options), std::move(etcd)));
  election->thread_ = std::thread([raw = election.get()] { raw->Run(); });
  return election;
}

LeaderElection::LeaderElection(LeaderElectionOptions options,
                               std::unique_ptr<etcd::EtcdClient> etcd)
    : options_(std::move(options)),
      key_(etcd::LeaderKey(options_.cluster_id)),
      record_(etcd::EncodeLeaderRecord(
          {options_.advertise_address, options_.incarnation, options_.http_port})),
      etcd_(std::move(etcd)) {}

LeaderElection::~LeaderElection() { Stop(); }

int64_t LeaderElection::ServingUntil() const {
  int64_t until = serving_until_ns_.load(std::memory_order_acquire);
  while (until > 0) {
    if (ToNanos(Clock::now()) < until) return until;
    // Lapsed. Made final here, so that a keep-alive answered late (sent before the deadline)
    // cannot make this master serve again after it refused a call.
    if (serving_until_ns_.compare_exchange_weak(until, -until, std::memory_order_acq_rel)) {
      return -until;
    }
  }
  return until;
}

Status LeaderElection::CheckServing() const {
  const int64_t until = ServingUntil();
  if (until > 0) return Status();
  MutexLock lock(mu_);
  std::string message;
  switch (role_) {
    case Role::kLeader:
      // The deadline passed and the background thread has not fenced yet.
      return UnavailableError(
          LapsedMessage(Clock::time_point(std::chrono::nanoseconds(-until)), last_error_));
    case Role::kFenced:
      return lost_;
    case Role::kStopped:
      message = "larder-master of cluster ";
      message += options_.cluster_id;
      message += " is shutting down";
      return UnavailableError(message);
    case Role::kStandby:
      break;
  }
  message = "larder-master is a standby of cluster ";
  message += options_.cluster_id;
  if (leader_.has_value()) {
    message += "; the leader is at ";
    message += leader_->address;
  } else {
    message += "; no leader is known yet";
    if (!last_error_.empty()) {
      message += " (";
      message += last_error_;
      message += ")";
    }
  }
  return UnavailableError(message);
}

LeaderElection::Role LeaderElection::role() const {
  const int64_t until = ServingUntil();
  MutexLock lock(mu_);
  if (role_ == Role::kLeader && until <= 0) return Role::kFenced;
  return role_;
}

std::optional<etcd::LeaderRecord> LeaderElection::leader() const {
  MutexLock lock(mu_);
  return leader_;
}

void LeaderElection::Stop() {
  MutexLock stop_lock(stop_mu_);
  bool abandoned = false;
  {
    MutexLock lock(mu_);
    if (role_ == Role::kStopped) return;
    stop_ = true;
    abandoned = abandoned_;
  }
  wake_.SignalAll();
  if (thread_.joinable()) thread_.join();
  if (abandoned) return;  // a hung process releases nothing
  Role was;
  {
    MutexLock lock(mu_);
    was = role_;
    // Serving ends before the key goes, so that the next leader never overlaps with us.
    serving_until_ns_.store(0, std::memory_order_release);
    role_ = Role::kStopped;
  }
  if (lease_id_ != 0) {
    if (was == Role::kLeader) {
      auto deleted = etcd_->DeleteIfLease(key_, lease_id_);
      if (!deleted.ok()) {
        Log().warn("larder-master could not delete its leader key {}: {}", key_,
                   deleted.status().ToString());
      }
    }
    // Revoking also deletes the key when the delete above failed but etcd answers again.
    Status revoked = etcd_->RevokeLease(lease_id_);
    if (!revoked.ok() && revoked.code() != StatusCode::kNotFound) {
      Log().warn("larder-master could not revoke its etcd lease {}: {}",
                 etcd::LeaseIdText(lease_id_), revoked.ToString());
    }
  }
  if (was == Role::kLeader) {
    Log().info("larder-master stepped down as leader of cluster {}", options_.cluster_id);
  }
  if (options_.on_role_change) options_.on_role_change(RoleName(Role::kStopped));
}

void LeaderElection::AbandonForTesting() {
  MutexLock stop_lock(stop_mu_);
  {
    MutexLock lock(mu_);
    if (role_ == Role::kStopped || abandoned_) return;
    stop_ = true;
    abandoned_ = true;
  }
  wake_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void LeaderElection::Run() {
  MutexLock lock(mu_);
  while (!stop_) {
    lock.Unlock();
    const Clock::time_point next = Step();
    lock.Lock();
    while (!stop_ && wake_.WaitUntil(lock, next)) {
    }
  }
}

milliseconds LeaderElection::Margin() const {
  if (options_.fence_margin.count() > 0) return options_.fence_margin;
  return Clamp(granted_ttl_ / 10, milliseconds(100), milliseconds(1000));
}

LeaderElection::Clock::time_point LeaderElection::ServingDeadline() const {
  return renewal_sent_ + granted_ttl_ - Margin();
}

LeaderElection::Clock::time_point LeaderElection::Step() {
  const Clock::time_point now = Clock::now();
  const milliseconds poll = std::max(milliseconds(50), options_.lease_ttl / 10);
  Role role;
  {
    MutexLock lock(mu_);
    role = role_;
  }
  if (role == Role::kFenced) return now + std::chrono::hours(1);  // nothing left to do
  if (lease_id_ == 0) {
    const Clock::time_point sent = Clock::now();
    auto lease = etcd_->GrantLease(options_.lease_ttl);
    if (!lease.ok()) {
      NoteError(lease.status());
      return Clock::now() + poll;
    }
    lease_id_ = lease->id;
    granted_ttl_ = lease->ttl;
    renewal_sent_ = sent;
    next_keepalive_ = sent + granted_ttl_ / 3;
    Log().debug("larder-master holds etcd lease {} (TTL {} ms) for cluster {}",
                etcd::LeaseIdText(lease_id_), granted_ttl_.count(), options_.cluster_id);
  }
  return role == Role::kLeader ? LeaderStep(Clock::now()) : StandbyStep(Clock::now());
}

bool LeaderElection::RenewIfDue(Clock::time_point now, bool* renewed) {
  *renewed = false;
  if (now < next_keepalive_) return true;
  const Clock::time_point sent = Clock::now();
  auto ttl = etcd_->KeepAlive(lease_id_);
  if (ttl.ok()) {
    renewal_sent_ = sent;
    granted_ttl_ = *ttl;
    next_keepalive_ = sent + granted_ttl_ / 3;
    *renewed = true;
    MutexLock lock(mu_);
    last_error_.clear();
    return true;
  }
  if (ttl.status().code() == StatusCode::kNotFound) {
    NoteError(ttl.status());
    return false;
  }
  NoteError(ttl.status());
  // Retry soon: the deadline keeps running from the last renewal.
  next_keepalive_ = Clock::now() + std::max(milliseconds(50), options_.lease_ttl / 10);
  return true;
}

LeaderElection::Clock::time_point LeaderElection::LeaderStep(Clock::time_point now) {
  if (now >= ServingDeadline()) {
    std::string last_error;
    {
      MutexLock lock(mu_);
      last_error = last_error_;
    }
    Fence(LapsedMessage(ServingDeadline(), last_error));
    return Clock::now() + std::chrono::hours(1);
  }
  bool renewed = false;
  if (!RenewIfDue(now, &renewed)) {
    std::string why = "larder-master lost the leadership of cluster ";
    why += options_.cluster_id;
    why += ": etcd says its lease ";
    why += etcd::LeaseIdText(lease_id_);
    why += " no longer exists (expired or revoked)";
    Fence(std::move(why));
    return Clock::now() + std::chrono::hours(1);
  }
  if (renewed) {
    // Extend the deadline only while it has not passed (nor been seen to pass): a reply that
    // came too late fences all the same.
    int64_t expected = serving_until_ns_.load(std::memory_order_acquire);
    const bool current = expected > 0 && ToNanos(Clock::now()) < expected;
    if (!current || !serving_until_ns_.compare_exchange_strong(expected, ToNanos(ServingDeadline()),
                                                               std::memory_order_acq_rel)) {
      std::string last_error;
      {
        MutexLock lock(mu_);
        last_error = last_error_;
      }
      const int64_t lapsed = expected < 0 ? -expected : expected;
      Fence(LapsedMessage(Clock::time_point(std::chrono::nanoseconds(lapsed)), last_error));
      return Clock::now() + std::chrono::hours(1);
    }
    // The key must still be ours: only an operator deletes it while our lease lives.
    auto held = etcd_->Get(key_);
    if (held.ok() && (!held->has_value() || (*held)->lease != lease_id_)) {
      std::string why = "larder-master lost the leadership of cluster ";
      why += options_.cluster_id;
      why += ": its leader key ";
      why += key_;
      why += held->has_value() ? " was taken over by another lease" : " was deleted";
      Fence(std::move(why));
      return Clock::now() + std::chrono::hours(1);
    }
    if (!held.ok()) NoteError(held.status());
  }
  if (Clock::now() >= ServingDeadline()) return Clock::now();
  return std::min(next_keepalive_, ServingDeadline());
}

LeaderElection::Clock::time_point LeaderElection::StandbyStep(Clock::time_point now) {
  const milliseconds poll = std::max(milliseconds(50), options_.lease_ttl / 10);
  bool renewed = false;
  if (!RenewIfDue(now, &renewed) || Clock::now() >= renewal_sent_ + granted_ttl_) {
    lease_id_ = 0;  // gone, or as good as gone: take a fresh one
    return Clock::now();
  }
  auto held = etcd_->Get(key_);
  if (!held.ok()) {
    NoteError(held.status());
    return std::min(Clock::now() + poll, next_keepalive_);
  }
  if (held->has_value() && (*held)->lease == lease_id_) {
    BecomeLeader();  // an earlier put-if-absent of ours went through after all
    return Clock::now();
  }
  if (!held->has_value()) {
    auto created = etcd_->PutIfAbsent(key_, record_, lease_id_);
    if (created.ok() && *created) {
      BecomeLeader();
      return Clock::now();
    }
    if (!created.ok()) {
      NoteError(created.status());
      if (created.status().code() == StatusCode::kNotFound) lease_id_ = 0;  // our lease lapsed
    }
    return Clock::now();  // another master won the race: read who
  }
  auto record = etcd::DecodeLeaderRecord((*held)->value);
  if (!record.ok()) {
    std::string why = "the leader record at ";
    why += key_;
    why += " does not parse: ";
    why += record.status().message();
    NoteError(UnavailableError(why));
    BecomeStandby(std::nullopt);
  } else {
    BecomeStandby(*record);
  }
  return std::min(Clock::now() + poll, next_keepalive_);
}

void LeaderElection::BecomeLeader() {
  serving_until_ns_.store(ToNanos(ServingDeadline()), std::memory_order_release);
  {
    MutexLock lock(mu_);
    role_ = Role::kLeader;
    leader_ =
        etcd::LeaderRecord{options_.advertise_address, options_.incarnation, options_.http_port};
    last_error_.clear();
  }
  Log().info(
      "larder-master is now the leader of cluster {} at {} (etcd lease {}, TTL {} ms, serving "
      "until {} unless renewed)",
      options_.cluster_id, options_.advertise_address, etcd::LeaseIdText(lease_id_),
      granted_ttl_.count(), WallTime(ServingDeadline()));
  if (options_.on_role_change) options_.on_role_change(RoleName(Role::kLeader));
}

void LeaderElection::BecomeStandby(std::optional<etcd::LeaderRecord> leader) {
  bool changed = false;
  {
    MutexLock lock(mu_);
    const bool had = leader_.has_value();
    changed = had != leader.has_value() || (had && (leader_->address != leader->address ||
                                                    leader_->incarnation != leader->incarnation));
    leader_ = std::move(leader);
  }
  if (!changed) return;
  std::optional<etcd::LeaderRecord> now = this->leader();
  if (now.has_value()) {
    Log().info("larder-master is a standby of cluster {}; the leader is at {} (incarnation {:x})",
               options_.cluster_id, now->address, now->incarnation);
  } else {
    Log().warn("larder-master is a standby of cluster {}; the leader is unknown",
               options_.cluster_id);
  }
  if (options_.on_role_change) options_.on_role_change(RoleName(Role::kStandby));
}

void LeaderElection::Fence(std::string why) {
  Status lost = UnavailableError(std::move(why));
  {
    MutexLock lock(mu_);
    role_ = Role::kFenced;
    lost_ = lost;
    // Inside the lock, after the role: CheckServing never sees "not serving" with kLeader.
    serving_until_ns_.store(0, std::memory_order_release);
  }
  Log().error("{}; this master serves no more calls", lost.message());
  if (options_.on_role_change) options_.on_role_change(RoleName(Role::kFenced));
  if (options_.on_lost) options_.on_lost(lost);
  // Best effort: where etcd answers again, a standby need not wait for the lease to expire.
  // DeleteIfLease never touches a successor's key.
  auto deleted = etcd_->DeleteIfLease(key_, lease_id_);
  if (deleted.ok()) etcd_->RevokeLease(lease_id_).IgnoreError();
}

void LeaderElection::NoteError(const Status& status) {
  MutexLock lock(mu_);
  if (last_error_ != status.message()) {
    Log().warn("larder-master (cluster {}): {}", options_.cluster_id, status.ToString());
  }
  last_error_ = status.message();
}

std::string LeaderElection::LapsedMessage(Clock::time_point deadline,
                                          const std::string& last_error) const {
  std::string message = "larder-master lost the leadership of cluster ";
  message += options_.cluster_id;
  message += ": its etcd lease lapsed at ";
  message += WallTime(deadline);
  message += ", etcd unreachable: ";
  message += last_error.empty() ? std::string("no keep-alive answered in time") : last_error;
  return message;
}

}  // namespace larder::master
