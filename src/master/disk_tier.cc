// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "master/disk_tier.h"

#include <algorithm>
#include <cstdio>

#include "common/logging.h"
#include "master/types.h"

namespace larder::master {

namespace {

bool IsIdentity(std::string_view identity) {
  return identity.size() == 32 && std::all_of(identity.begin(), identity.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// Tasks handed out in one poll reply, per kind.
constexpr size_t kMaxTasksPerPoll = 1024;

}  // namespace

DiskTier::Holder* DiskTier::HolderOf(const std::string& client_id) {
  for (Holder& holder : holders_) {
    if (holder.client_id == client_id) return &holder;
  }
  return nullptr;
}

void DiskTier::TakeTasksLocked(Holder& holder, DiskTasks* tasks) {
  auto take = [](std::deque<std::string>& from, std::vector<std::string>* to) {
    while (!from.empty() && to->size() < kMaxTasksPerPoll) {
      to->push_back(std::move(from.front()));
      from.pop_front();
    }
  };
  take(holder.promote, &tasks->promote);  // a reader waits for these
  take(holder.drop, &tasks->drop);
  take(holder.demote, &tasks->demote);
}

Result<DiskTasks> DiskTier::Poll(const std::string& client_id, const std::string& host_id,
                                 const DiskHolderReport& report, std::chrono::milliseconds wait) {
  if (!IsIdentity(report.identity)) {
    return InvalidArgumentError("a disk identity is 32 hex digits, not " +
                                QuoteKey(report.identity.substr(0, 64)));
  }
  wait = std::clamp(wait, std::chrono::milliseconds(0), std::chrono::milliseconds(1000));
  MutexLock lock(mu_);
  const auto now = Clock::now();
  std::string replaced;
  auto it = std::find_if(holders_.begin(), holders_.end(),
                         [&](const Holder& h) { return h.identity == report.identity; });
  if (it == holders_.end()) {
    Holder holder;
    holder.identity = report.identity;
    holders_.push_back(std::move(holder));
    it = std::prev(holders_.end());
    Log().info("disk holder {} (client {}, host {}) joined", report.identity, client_id, host_id);
  } else if (it->client_id != client_id) {
    // Another client claims this disk: a restart of its holder on the same host (the directory's
    // lock keeps two processes apart there), or a holder that has gone silent.
    const bool silent = now - it->last_poll > options_.holder_ttl;
    if (!silent && it->host_id != host_id) {
      return FailedPreconditionError("disk " + report.identity + " is held by client " +
                                     QuoteKey(it->client_id) + " on another host");
    }
    Log().info("disk holder {} is now client {} (was {})", report.identity, client_id,
               it->client_id);
    if (it->host_id == host_id) replaced = it->client_id;
    // The old process's work is void (its reads were of its own mappings); the new one announces
    // what its disk holds.
    OfflineLocked(static_cast<uint32_t>(it - holders_.begin()));
    it->announced = false;
  }
  Holder& holder = *it;
  holder.client_id = client_id;
  holder.host_id = host_id;
  holder.report = report;
  holder.last_poll = now;
  holder.online = true;
  active_.store(true, std::memory_order_release);
  DiskTasks tasks;
  tasks.replaced_client = std::move(replaced);
  if (!holder.announced) {
    tasks.announce = true;
    return tasks;
  }
  const auto deadline = now + wait;
  while (!stopping_ && holder.promote.empty() && holder.drop.empty() && holder.demote.empty()) {
    if (!work_.WaitUntil(lock, deadline)) break;
  }
  // The holders' vector does not move while a poll waits: holders are only ever appended under
  // mu_, and `holder` is re-found after the wait.
  Holder* self = HolderOf(client_id);
  if (self == nullptr) return tasks;
  self->last_poll = Clock::now();
  TakeTasksLocked(*self, &tasks);
  return tasks;
}

Result<std::vector<std::string>> DiskTier::Report(
    const std::string& client_id, const DiskHolderReport& report,
    std::span<const DiskCopyReport> stored, std::span<const std::string> evicted,
    std::span<const std::string> failed, bool announce,
    const std::function<bool(std::string_view key, uint64_t size)>& accept_announced) {
  std::vector<std::string> refused;
  MutexLock lock(mu_);
  Holder* holder = HolderOf(client_id);
  if (holder == nullptr || holder->identity != report.identity) {
    return FailedPreconditionError("client " + QuoteKey(client_id) + " is not the holder of disk " +
                                   report.identity + " here: poll first");
  }
  const auto index = static_cast<uint32_t>(holder - holders_.data());
  holder->report = report;
  holder->last_poll = Clock::now();
  holder->online = true;
  for (const std::string& key : evicted) {
    auto it = copies_.find(key);
    if (it != copies_.end() && it->second.holder == index) {
      DropCopyLocked(key, false);
      counters_.disk_evicted.fetch_add(1, std::memory_order_relaxed);
    }
  }
  for (const std::string& key : failed) {
    if (auto it = pending_.find(key); it != pending_.end() && it->second.holder == index) {
      pending_.erase(it);
      counters_.demote_failed.fetch_add(1, std::memory_order_relaxed);
    }
    if (auto it = promoting_.find(key); it != promoting_.end()) {
      promoting_.erase(it);
      counters_.promote_failed.fetch_add(1, std::memory_order_relaxed);
    }
  }
  for (const DiskCopyReport& copy : stored) {
    auto pending = pending_.find(copy.key);
    const bool asked = pending != pending_.end() && pending->second.holder == index;
    bool take = asked;
    if (!take && announce) {
      // A copy this master did not ask for: one an earlier master (or this one, before the holder
      // restarted) recorded. Taken unless another holder has the key, or the master knows an
      // object of that key of another size.
      auto existing = copies_.find(copy.key);
      take = (existing == copies_.end() || existing->second.holder == index) &&
             (!accept_announced || accept_announced(copy.key, copy.size));
      if (take) counters_.announced.fetch_add(1, std::memory_order_relaxed);
    }
    if (asked) {
      pending_.erase(pending);
      counters_.demoted.fetch_add(1, std::memory_order_relaxed);
    }
    if (!take) {
      if (!asked) counters_.demote_refused.fetch_add(1, std::memory_order_relaxed);
      // Keep it when the master already counts it as this holder's (a repeat report).
      auto existing = copies_.find(copy.key);
      if (existing == copies_.end() || existing->second.holder != index)
        refused.push_back(copy.key);
      continue;
    }
    auto [it, inserted] = copies_.try_emplace(copy.key, Copy{index, copy.size, copy.generation});
    if (!inserted) {
      Holder& old = holders_[it->second.holder];
      old.copies -= 1;
      old.copy_bytes -= it->second.size;
      it->second = Copy{index, copy.size, copy.generation};
    }
    holder->copies += 1;
    holder->copy_bytes += copy.size;
  }
  if (announce) holder->announced = true;
  return refused;
}

void DiskTier::DropCopyLocked(std::string_view key, bool tell_holder) {
  auto it = copies_.find(key);
  if (it == copies_.end()) return;
  Holder& holder = holders_[it->second.holder];
  holder.copies -= 1;
  holder.copy_bytes -= it->second.size;
  if (tell_holder) holder.drop.emplace_back(key);
  copies_.erase(it);
}

std::optional<uint64_t> DiskTier::Find(std::string_view key) const {
  if (!active()) return std::nullopt;
  MutexLock lock(mu_);
  auto it = copies_.find(key);
  if (it == copies_.end() || !holders_[it->second.holder].online) return std::nullopt;
  return it->second.size;
}

bool DiskTier::Has(std::string_view key) const {
  if (!active()) return false;
  MutexLock lock(mu_);
  return copies_.contains(key);
}

bool DiskTier::Pending(std::string_view key) const {
  if (!active()) return false;
  MutexLock lock(mu_);
  return pending_.contains(key);
}

bool DiskTier::HasHolderOn(std::string_view host_id) const {
  if (!active()) return false;
  MutexLock lock(mu_);
  return std::any_of(holders_.begin(), holders_.end(),
                     [&](const Holder& h) { return h.online && h.host_id == host_id; });
}

bool DiskTier::QueueDemote(std::string_view host_id, std::string_view owner_client,
                           std::string_view key) {
  if (!active()) return false;
  MutexLock lock(mu_);
  if (copies_.contains(key) || pending_.contains(key)) return false;
  // The segment owner's own disk, else the one of its host with the fewest bytes of copies for
  // its capacity (so that several holders of a host fill evenly).
  Holder* chosen = nullptr;
  double chosen_fill = 0;
  for (Holder& holder : holders_) {
    if (!holder.online || !holder.announced || holder.host_id != host_id) continue;
    if (holder.client_id == owner_client) {
      chosen = &holder;
      break;
    }
    const double fill = static_cast<double>(holder.copy_bytes + holder.demote.size()) /
                        static_cast<double>(std::max<uint64_t>(holder.report.capacity_bytes, 1));
    if (chosen == nullptr || fill < chosen_fill) {
      chosen = &holder;
      chosen_fill = fill;
    }
  }
  if (chosen == nullptr) return false;
  if (chosen->demote.size() >= options_.max_queued) {
    counters_.queue_full.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  pending_.emplace(std::string(key),
                   PendingDemotion{static_cast<uint32_t>(chosen - holders_.data()), Clock::now()});
  chosen->demote.emplace_back(key);
  counters_.demotions_queued.fetch_add(1, std::memory_order_relaxed);
  work_.SignalAll();
  return true;
}

bool DiskTier::QueuePromote(std::string_view key) {
  if (!active()) return false;
  MutexLock lock(mu_);
  auto it = copies_.find(key);
  if (it == copies_.end()) return false;
  Holder& holder = holders_[it->second.holder];
  if (!holder.online) return false;
  counters_.disk_hits.fetch_add(1, std::memory_order_relaxed);
  // Asked for once until it is done; again when it has taken longer than promote_timeout (its
  // holder lost it: restarted, or its put failed without a report).
  const auto now = Clock::now();
  auto [p, inserted] =
      promoting_.try_emplace(std::string(key), PendingDemotion{it->second.holder, now});
  if (!inserted && now - p->second.queued > options_.promote_timeout) {
    p->second = PendingDemotion{it->second.holder, now};
    inserted = true;
  }
  if (inserted) {
    holder.promote.emplace_back(key);
    counters_.promotions_queued.fetch_add(1, std::memory_order_relaxed);
    work_.SignalAll();
  }
  return true;
}

bool DiskTier::Promoted(std::string_view key, const std::string& client_id) {
  if (!active()) return false;
  MutexLock lock(mu_);
  bool asked = false;
  if (auto p = promoting_.find(key); p != promoting_.end()) {
    promotion_time_.Observe(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - p->second.queued)
            .count());
    promoting_.erase(p);
    asked = true;
  }
  auto it = copies_.find(key);
  const bool own = it != copies_.end() && holders_[it->second.holder].client_id == client_id;
  if (own || asked) {
    // Readers wait for it (even if its copy left the disk meanwhile), and eviction spares it.
    promoted_.insert_or_assign(std::string(key), Clock::now() + options_.promoted_grace);
    promoted_count_.store(promoted_.size(), std::memory_order_relaxed);
    promotion_puts_.insert_or_assign(std::string(key), Clock::now());
    promotion_puts_count_.store(promotion_puts_.size(), std::memory_order_relaxed);
  }
  return own;
}

bool DiskTier::BeingPromoted(std::string_view key) const {
  if (promotion_puts_count_.load(std::memory_order_relaxed) == 0) return false;
  MutexLock lock(mu_);
  return promotion_puts_.contains(key);
}

void DiskTier::PutsEnded(std::span<const std::string_view> keys) {
  if (promotion_puts_count_.load(std::memory_order_relaxed) == 0) return;
  MutexLock lock(mu_);
  for (std::string_view key : keys) {
    if (auto it = promotion_puts_.find(key); it != promotion_puts_.end()) promotion_puts_.erase(it);
  }
  promotion_puts_count_.store(promotion_puts_.size(), std::memory_order_relaxed);
}

bool DiskTier::JustPromoted(std::string_view key) {
  if (promoted_count_.load(std::memory_order_relaxed) == 0) return false;
  MutexLock lock(mu_);
  auto it = promoted_.find(key);
  if (it == promoted_.end()) return false;
  if (it->second > Clock::now()) return true;
  promoted_.erase(it);
  promoted_count_.store(promoted_.size(), std::memory_order_relaxed);
  return false;
}

void DiskTier::Invalidate(std::span<const std::string_view> keys) {
  if (!active()) return;
  MutexLock lock(mu_);
  bool told = false;
  for (std::string_view key : keys) {
    if (auto p = pending_.find(key); p != pending_.end()) pending_.erase(p);
    if (auto p = promoting_.find(key); p != promoting_.end()) promoting_.erase(p);
    if (copies_.contains(key)) {
      DropCopyLocked(key, true);
      told = true;
    }
  }
  if (told) work_.SignalAll();
}

uint64_t DiskTier::InvalidateIf(const std::function<bool(std::string_view key)>& match) {
  if (!active()) return 0;
  MutexLock lock(mu_);
  std::vector<std::string> keys;
  for (const auto& [key, copy] : copies_) {
    if (match(key)) keys.push_back(key);
  }
  for (const std::string& key : keys) {
    pending_.erase(key);
    promoting_.erase(key);
    DropCopyLocked(key, true);
  }
  if (!keys.empty()) work_.SignalAll();
  return keys.size();
}

void DiskTier::ExpectWriteThrough(std::span<const std::string_view> keys) {
  if (!active() || keys.empty()) return;
  MutexLock lock(mu_);
  const auto now = Clock::now();
  for (std::string_view key : keys) {
    if (write_through_.size() >= kMaxWriteThrough) break;
    write_through_.insert_or_assign(std::string(key), now);
  }
  write_through_count_.store(write_through_.size(), std::memory_order_relaxed);
}

bool DiskTier::TakeWriteThrough(std::string_view key) {
  if (write_through_count_.load(std::memory_order_relaxed) == 0) return false;
  MutexLock lock(mu_);
  auto it = write_through_.find(key);
  if (it == write_through_.end()) return false;
  write_through_.erase(it);
  write_through_count_.store(write_through_.size(), std::memory_order_relaxed);
  return true;
}

void DiskTier::Sweep() {
  if (!active()) return;
  MutexLock lock(mu_);
  const auto now = Clock::now();
  std::erase_if(write_through_,
                [&](const auto& entry) { return now - entry.second > options_.demote_timeout; });
  write_through_count_.store(write_through_.size(), std::memory_order_relaxed);
  // A promotion put never ended (its holder died): the master revoked it by now.
  std::erase_if(promotion_puts_,
                [&](const auto& entry) { return now - entry.second > options_.demote_timeout; });
  promotion_puts_count_.store(promotion_puts_.size(), std::memory_order_relaxed);
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (now - it->second.queued > options_.demote_timeout) {
      counters_.demote_timed_out.fetch_add(1, std::memory_order_relaxed);
      pending_.erase(it++);
    } else {
      ++it;
    }
  }
  for (size_t i = 0; i < holders_.size(); ++i) {
    Holder& holder = holders_[i];
    if (holder.online && now - holder.last_poll > options_.holder_ttl) {
      Log().warn("disk holder {} (client {}) is silent: its {} copies are offline", holder.identity,
                 holder.client_id, holder.copies);
      OfflineLocked(static_cast<uint32_t>(i));
    }
  }
  std::erase_if(promoted_, [&](const auto& entry) { return entry.second <= now; });
  promoted_count_.store(promoted_.size(), std::memory_order_relaxed);
  // A promotion not done in time is asked for again by a reader's next get.
  for (auto it = promoting_.begin(); it != promoting_.end();) {
    if (now - it->second.queued > options_.promote_timeout) {
      promoting_.erase(it++);
    } else {
      ++it;
    }
  }
}

void DiskTier::OfflineLocked(uint32_t index) {
  Holder& holder = holders_[index];
  holder.online = false;
  holder.demote.clear();
  holder.promote.clear();
  std::erase_if(promoting_, [&](const auto& entry) { return entry.second.holder == index; });
  counters_.demote_failed.fetch_add(
      std::erase_if(pending_, [&](const auto& entry) { return entry.second.holder == index; }),
      std::memory_order_relaxed);
}

void DiskTier::ClientGone(const std::string& client_id) {
  if (!active()) return;
  MutexLock lock(mu_);
  Holder* holder = HolderOf(client_id);
  if (holder == nullptr || !holder->online) return;
  Log().info("disk holder {} (client {}) left: its {} copies are offline until it is back",
             holder->identity, client_id, holder->copies);
  OfflineLocked(static_cast<uint32_t>(holder - holders_.data()));
  work_.SignalAll();
}

void DiskTier::Stop() {
  MutexLock lock(mu_);
  stopping_ = true;
  work_.SignalAll();
}

std::vector<DiskHolderView> DiskTier::Holders() const {
  MutexLock lock(mu_);
  std::vector<DiskHolderView> views;
  for (size_t i = 0; i < holders_.size(); ++i) {
    const Holder& h = holders_[i];
    uint64_t queued = h.demote.size();
    views.push_back(
        DiskHolderView{h.client_id, h.host_id, h.report, h.online, h.copies, h.copy_bytes, queued});
  }
  return views;
}

uint64_t DiskTier::copies() const {
  MutexLock lock(mu_);
  return copies_.size();
}

}  // namespace larder::master
