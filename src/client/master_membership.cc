// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "client/master_membership.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>

#include "common/logging.h"
#include "common/segment_descriptor_proto.h"

namespace larder::client {

namespace {

using Stub = proto::Master::Stub;
using SteadyClock = std::chrono::steady_clock;

// How long a mount refused because another client holds the segment's name is tried again: the
// master hands the name over once that holder stayed silent for a third of its TTL.
constexpr auto kTakeOverWait = std::chrono::seconds(6);

bool ProcessExists(uint32_t pid) {
  if (pid == 0) return true;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH;
}

bool IsUnreachable(const Status& status) {
  return status.code() == StatusCode::kUnavailable ||
         status.code() == StatusCode::kDeadlineExceeded;
}

// The segment's bytes, when this process can read them: the catalog checks itself against them.
std::span<const uint8_t> ReadableBytes(const std::shared_ptr<MemoryRegion>& memory) {
  if (!memory || memory->kind() == MemoryKind::kDevice) return {};
  return {static_cast<const uint8_t*>(memory->data()), memory->size()};
}

}  // namespace

MasterMembership::MasterMembership(const MasterClient* master, MasterMembershipOptions options)
    : master_(master),
      options_(std::move(options)),
      catalog_(ReadableBytes(options_.segment_memory)) {}

MasterMembership::~MasterMembership() { Stop(); }

uint64_t MasterMembership::segment_id() const {
  MutexLock lock(mount_mu_);
  return segment_id_;
}

Status MasterMembership::Start() {
  LARDER_RETURN_IF_ERROR(MountWithTakeOver());
  MutexLock lock(loop_mu_);
  started_ = true;
  thread_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

void MasterMembership::Stop() {
  {
    MutexLock lock(loop_mu_);
    if (!started_ || stopping_) return;
    stopping_ = true;
  }
  loop_cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
  proto::UnmountSegmentsRequest request;
  proto::UnmountSegmentsReply reply;
  request.set_client_id(options_.client_id);
  if (uint64_t id = segment_id(); id != 0) request.add_segment_id(id);
  request.set_unregister_client(true);
  Status status = master_->Call("UnmountSegments", &Stub::UnmountSegments, request, &reply);
  if (!status.ok()) Log().debug("leaving the master: {}", status.ToString());
}

Status MasterMembership::MountWithTakeOver() {
  const auto start = SteadyClock::now();
  const auto deadline = start + options_.connect_timeout;
  auto backoff = std::chrono::milliseconds(50);
  auto next_log = start;
  uint32_t take_over_pid = 0;
  std::optional<SteadyClock::time_point> refused_since;
  for (;;) {
    proto::MountSegmentsReply reply;
    Status status;
    {
      MutexLock lock(mount_mu_);
      status = MountLocked(take_over_pid, &reply);
    }
    if (status.ok()) return status;
    const auto now = SteadyClock::now();
    if (status.code() == StatusCode::kAlreadyExists && reply.holder_pid_size() > 0) {
      // Another client holds the segment's name: a previous process of ours, if it is gone the
      // name is ours at once; otherwise the master hands it over once its holder is silent.
      const uint32_t holder = reply.holder_pid(0);
      const bool same_host =
          reply.holder_host_id_size() > 0 && reply.holder_host_id(0) == options_.host_id;
      if (same_host && holder != take_over_pid && !ProcessExists(holder)) {
        Log().info("segment '{}' is held by process {} of this host, which is gone: taking it over",
                   options_.segment_name, holder);
        take_over_pid = holder;
        continue;
      }
      if (!refused_since) refused_since = now;
      if (now - *refused_since > kTakeOverWait || now > deadline) return status;
    } else if (!IsUnreachable(status) || now > deadline) {
      if (IsUnreachable(status)) {
        return status.WithContext("no larder-master answered within " +
                                  std::to_string(options_.connect_timeout.count()) + " ms");
      }
      return status;
    }
    if (now >= next_log) {
      Log().info("waiting for larder-master {}: {}", master_->Describe(), status.message());
      next_log = now + std::chrono::seconds(5);
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
}

Status MasterMembership::Remount(uint64_t seen_generation) {
  MutexLock lock(mount_mu_);
  if (generation_.load() != seen_generation) return Status::Ok();
  proto::MountSegmentsReply reply;
  return MountLocked(0, &reply);
}

Status MasterMembership::MountLocked(uint32_t take_over_pid, proto::MountSegmentsReply* reply) {
  proto::MountSegmentsRequest request;
  request.set_client_id(options_.client_id);
  request.set_host_id(options_.host_id);
  request.set_pid(static_cast<uint32_t>(::getpid()));
  request.set_take_over_pid(take_over_pid);
  size_t reported = 0;
  if (options_.segment_memory) {
    proto::SegmentInfo* segment = request.add_segments();
    segment->set_name(options_.segment_name);
    segment->set_base(reinterpret_cast<uintptr_t>(options_.segment_memory->data()));
    segment->set_size(options_.segment_memory->size());
    ToProto(options_.descriptor, segment->mutable_segment_descriptor());
    segment->set_verifies_catalog(catalog_.verifies());
    if (catalog_.incarnation() != 0) {
      if (const size_t stale = catalog_.Fill(segment); stale > 0) {
        Log().warn(
            "segment '{}': {} catalog entr{} no longer match their bytes (their ranges were "
            "reused before this client learnt of the removal); not reported",
            options_.segment_name, stale, stale == 1 ? "y" : "ies");
      }
    }
    reported = static_cast<size_t>(segment->catalog_size());
  }
  LARDER_RETURN_IF_ERROR(master_->Call("MountSegments", &Stub::MountSegments, request, reply));
  if (options_.segment_memory) {
    if (reply->status_size() < 1 || reply->segment_id_size() < 1) {
      return InternalError("larder-master sent a malformed MountSegments reply");
    }
    Status status = FromItemStatus(reply->status(0));
    if (!status.ok()) return status.WithContext("mounting segment '" + options_.segment_name + "'");
    segment_id_ = reply->segment_id(0);
    catalog_.Restart();
    // What was kept of the catalog comes back with the first sync.
    catalog_full_sync_ = reported > 0;
  }
  const bool remount = generation_.load() > 0;
  if (reported > 0) {
    uint64_t restored = 0, dropped = 0;
    if (reply->recovery_size() > 0) {
      restored = reply->recovery(0).restored();
      dropped = reply->recovery(0).dropped();
    }
    Log().info(
        "larder-master {} (incarnation {:x}) rebuilt {} object(s) from segment '{}''s catalog of "
        "{} ({} refused)",
        master_->Describe(), reply->master_incarnation(), restored, options_.segment_name, reported,
        dropped);
  } else if (remount) {
    Log().warn(
        "larder-master {} had lost this client (it expired, or the master restarted); segment "
        "'{}' mounted again.",
        master_->Describe(), options_.segment_name);
  }
  incarnation_ = reply->master_incarnation();
  if (options_.on_mount) options_.on_mount();
  generation_.fetch_add(1);
  return Status::Ok();
}

void MasterMembership::Loop() {
  bool reachable = true;
  auto interval = options_.heartbeat_interval;
  auto next_heartbeat = SteadyClock::now() + interval;
  MutexLock lock(loop_mu_);
  while (!stopping_) {
    const auto wake =
        options_.segment_memory
            ? std::min(next_heartbeat, SteadyClock::now() + options_.catalog_sync_interval)
            : next_heartbeat;
    while (!stopping_ && loop_cv_.WaitUntil(lock, wake)) {
    }
    if (stopping_) break;
    lock.Unlock();
    if (SteadyClock::now() >= next_heartbeat) {
      Heartbeat(&reachable, &interval);
      next_heartbeat = SteadyClock::now() + interval;
    }
    if (options_.segment_memory) {
      // Applied REMOVEs are acknowledged at once, by one more round: the master holds the
      // ranges they free until then (so that no catalog names bytes another object wrote).
      bool removed = false;
      for (int rounds = 0; rounds < 64 && SyncCatalog(&removed); ++rounds) {
      }
      bool later = false;  // what this round brings is acknowledged by the next wake's
      if (removed) SyncCatalog(&later);
    }
    lock.Lock();
  }
}

void MasterMembership::Heartbeat(bool* reachable, std::chrono::milliseconds* interval) {
  const uint64_t generation = generation_.load();
  proto::HeartbeatRequest request;
  proto::HeartbeatReply reply;
  request.set_client_id(options_.client_id);
  if (options_.add_traffic) options_.add_traffic(&request);
  Status status = master_->Call("Heartbeat", &Stub::Heartbeat, request, &reply);
  if (!status.ok()) {
    if (*reachable) Log().warn("heartbeat failed: {}", status.ToString());
    *reachable = false;
    return;
  }
  if (!*reachable) Log().info("larder-master {} reachable again", master_->Describe());
  *reachable = true;
  // Three heartbeats per client TTL, so that one late beat never expires us.
  auto ttl = std::chrono::milliseconds(reply.client_ttl_ms());
  if (ttl.count() > 0) *interval = std::min(options_.heartbeat_interval, ttl / 3);
  uint64_t incarnation;
  {
    MutexLock lock(mount_mu_);
    incarnation = incarnation_;
  }
  if (reply.remount_required() || reply.master_incarnation() != incarnation) {
    Status mounted = Remount(generation);
    if (!mounted.ok()) Log().warn("remount failed: {}", mounted.ToString());
  }
  if (reply.segments_version() != segments_version_ && options_.on_segments_changed) {
    if (options_.on_segments_changed()) segments_version_ = reply.segments_version();
  }
}

bool MasterMembership::SyncCatalog(bool* removed) {
  const uint64_t generation = generation_.load();
  proto::SyncCatalogRequest request;
  proto::SyncCatalogReply reply;
  bool full = false;
  uint64_t id = 0;
  {
    MutexLock lock(mount_mu_);
    id = segment_id_;
    full = catalog_full_sync_;
  }
  if (id == 0) return false;
  request.set_client_id(options_.client_id);
  request.set_touches_apart(true);
  proto::CatalogAck* ack = request.add_acks();
  ack->set_segment_id(id);
  ack->set_seq(catalog_.seq());
  ack->set_full(full);
  Status status = master_->Call("SyncCatalog", &Stub::SyncCatalog, request, &reply);
  if (status.detail() == ErrorDetail::kRemountRequired) {
    // The master does not know this client: mount again (with the catalog).
    Status mounted = Remount(generation);
    if (!mounted.ok()) Log().warn("remount failed: {}", mounted.ToString());
    return false;
  }
  if (!status.ok()) {
    Log().debug("catalog sync: {}", status.ToString());
    return false;
  }
  bool more = false;
  for (const proto::SegmentCatalogChanges& changes : reply.segments()) {
    if (changes.segment_id() != id) continue;
    MutexLock lock(mount_mu_);
    if (segment_id_ != id) return false;  // remounted meanwhile: this reply is stale
    Status applied = catalog_.Apply(changes, reply.master_incarnation());
    if (!applied.ok()) {
      Log().warn("catalog of segment '{}': {}; asking for the whole catalog", options_.segment_name,
                 applied.ToString());
      catalog_full_sync_ = true;
      return false;
    }
    if (changes.reset()) catalog_full_sync_ = false;
    more = more || changes.more();
    // A reset drops entries too.
    *removed = *removed || changes.reset() ||
               std::any_of(changes.changes().begin(), changes.changes().end(),
                           [](const proto::CatalogChange& change) {
                             return change.kind() == proto::CatalogChange::REMOVE;
                           });
  }
  return more;
}

}  // namespace larder::client
