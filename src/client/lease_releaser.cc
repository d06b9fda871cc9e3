// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "client/lease_releaser.h"

namespace larder::client {

LeaseReleaser::~LeaseReleaser() { Stop(); }

void LeaseReleaser::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void LeaseReleaser::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
  std::vector<uint64_t> left;
  {
    MutexLock lock(mu_);
    left.swap(pending_);
  }
  if (!left.empty()) send_(std::move(left));
}

void LeaseReleaser::Queue(uint64_t lease_id) {
  if (lease_id == 0) return;
  bool wake;
  {
    MutexLock lock(mu_);
    if (pending_.empty()) oldest_pending_ = SteadyClock::now();
    pending_.push_back(lease_id);
    // The thread is woken only when it sleeps with nothing to do: a busy reader's gets cost no
    // wake-up each.
    wake = idle_;
    idle_ = false;
  }
  if (wake) cv_.SignalAll();
}

std::vector<uint64_t> LeaseReleaser::TakeForCall() {
  std::vector<uint64_t> taken;
  MutexLock lock(mu_);
  if (pending_.empty() && !in_flight_) return taken;
  while (in_flight_) cv_.Wait(lock);
  taken.swap(pending_);
  return taken;
}

void LeaseReleaser::Loop() {
  MutexLock lock(mu_);
  while (!stopping_) {
    if (pending_.empty()) {
      idle_ = true;
      while (!stopping_ && pending_.empty()) cv_.Wait(lock);
      idle_ = false;
      continue;
    }
    // Give a call the time to carry them; a call may take them, and newer ones arrive.
    auto due = oldest_pending_ + delay_;
    if (SteadyClock::now() < due) {
      while (!stopping_ && cv_.WaitUntil(lock, due)) {
      }
      continue;
    }
    std::vector<uint64_t> ids;
    ids.swap(pending_);
    in_flight_ = true;
    lock.Unlock();
    send_(std::move(ids));
    lock.Lock();
    in_flight_ = false;
    cv_.SignalAll();
  }
}

}  // namespace larder::client
