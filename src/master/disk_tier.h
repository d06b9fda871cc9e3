// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The master's side of the disk tier: which clients hold a disk (holders), which objects have a
// copy on one (key -> holder, size, generation: never a file offset), and each holder's work.
//
// A holder polls for work (DiskPoll) on a thread of its own and reports what it did (DiskReport).
// Demotion: the sweeper queues the least recently used objects whose memory replica is on a
// holder's host (MasterState::ScheduleDemotions); the holder reads each through its engine (same
// host: the segment's mapping), writes it durably, and reports it; only then is the copy recorded,
// and only if nothing removed or overwrote the key since it was queued. Eviction then drops the
// memory replica of an object with a disk copy at no cost. A get of a key whose only copy is on
// disk queues a promotion and answers kOnDisk: the holder puts the object back into memory (a put
// with `promotion`, which keeps the disk copy) and the reader, repeating its get, reads it there.
// A put of a key (other than a promotion) and a removal drop its disk copy, and tell the holder.
//
// A holder that stops polling for client_ttl is offline: its copies are not served (a get answers
// NotFound) but kept, and are served again when it polls again. A holder new to this master (or
// after a master restart) is asked to announce every copy it has.
//
// Thread safety: every method may be called from any thread; none blocks on another lock of the
// master while holding its own (MasterState calls in with shard locks held).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "larder/status.h"
#include "master/latency_histogram.h"

namespace larder::master {

struct DiskTierOptions {
  // Once memory use passes this fraction of the pool, the objects above it, oldest first, are
  // demoted ahead of eviction, so that their copies are on disk before eviction needs their
  // memory (a copy of an object still in memory costs disk space only). 0, the default: every
  // object is written to disk shortly after its put (write-behind), since puts evict at once,
  // in batches that can take half the pool, and eviction can only keep what is on disk already.
  // 1: no demotion.
  double demote_watermark = 0.0;
  // Demotions queued or in flight per holder; past it, eviction drops objects as without a disk.
  size_t max_queued = 4096;
  // A demotion not reported within this long is given up (counted as timed out).
  std::chrono::milliseconds demote_timeout{30000};
  // A promotion not done within this long is asked for again by the next reader of the key.
  std::chrono::milliseconds promote_timeout{2000};
  // A holder silent this long is offline (its copies are not served until it polls again).
  std::chrono::milliseconds holder_ttl{10000};
  // An object just brought back from disk is not evicted for this long, so that the readers
  // waiting for it find it even while promotions and puts churn memory.
  std::chrono::milliseconds promoted_grace{2000};
};

struct DiskHolderReport {
  std::string identity;
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t records = 0;
};

struct DiskCopyReport {
  std::string key;
  uint64_t size = 0;
  uint64_t generation = 0;
};

struct DiskTasks {
  std::vector<std::string> demote;
  std::vector<std::string> promote;
  std::vector<std::string> drop;
  bool announce = false;
  // The client that held the disk before this poll's, on the same host (MasterState::MarkReplaced).
  std::string replaced_client;
};

// Why a demotion did not happen, for /metrics (larder_disk_demotions_total{outcome}).
struct DiskTierCounters {
  std::atomic<uint64_t> demotions_queued{0};
  std::atomic<uint64_t> demoted{0};            // recorded copies
  std::atomic<uint64_t> demote_failed{0};      // the holder could not (disk full, gone, I/O)
  std::atomic<uint64_t> demote_timed_out{0};   // not reported in time
  std::atomic<uint64_t> demote_refused{0};     // the key was removed or overwritten meanwhile
  std::atomic<uint64_t> queue_full{0};         // left to eviction: the holder's queue was full
  std::atomic<uint64_t> evicted_with_copy{0};  // memory replicas evicted, disk copy kept
  std::atomic<uint64_t> evicted_dropped{0};    // evicted with no disk copy (a holder was polling)
  std::atomic<uint64_t> disk_hits{0};          // gets answered kOnDisk
  std::atomic<uint64_t> promotions_queued{0};
  std::atomic<uint64_t> promote_failed{0};
  std::atomic<uint64_t> disk_evicted{0};  // copies the holders' disks evicted
  std::atomic<uint64_t> announced{0};     // copies taken from announcements
};

struct DiskHolderView {
  std::string client_id;
  std::string host_id;
  DiskHolderReport report;
  bool online = false;
  uint64_t copies = 0;
  uint64_t copy_bytes = 0;
  uint64_t queued = 0;
};

class DiskTier {
 public:
  using Clock = std::chrono::steady_clock;

  explicit DiskTier(DiskTierOptions options = {}) : options_(options) {}

  const DiskTierOptions& options() const { return options_; }
  // Whether any holder ever polled: until then nothing else here does any work.
  bool active() const { return active_.load(std::memory_order_acquire); }

  // A holder's poll: registers or refreshes `client_id` (on `host_id`) as the holder of disk
  // `report.identity`, and returns its work, waiting up to `wait` for some. Errors:
  // InvalidArgument (a bad identity), FailedPrecondition (another live client holds that disk).
  Result<DiskTasks> Poll(const std::string& client_id, const std::string& host_id,
                         const DiskHolderReport& report, std::chrono::milliseconds wait);
  // A holder's report. `accept_announced(key, size)` decides on copies announced without having
  // been asked for (after a restart): false when the master knows another object of that key.
  // Returns the stored keys refused (the holder drops them).
  Result<std::vector<std::string>> Report(
      const std::string& client_id, const DiskHolderReport& report,
      std::span<const DiskCopyReport> stored, std::span<const std::string> evicted,
      std::span<const std::string> failed, bool announce,
      const std::function<bool(std::string_view key, uint64_t size)>& accept_announced);

  // The key's disk copy, when its holder is online: its size.
  std::optional<uint64_t> Find(std::string_view key) const;
  bool Has(std::string_view key) const;
  // Whether a demotion of the key is queued or in flight.
  bool Pending(std::string_view key) const;
  bool HasHolderOn(std::string_view host_id) const;

  // Queues the demotion of `key`, whose memory replica is in a segment of `owner_client` on
  // `host_id`: to that client's disk when it holds one, else to the holder of that host with the
  // most room. False when there is no online holder there, its queue is full, or the key is on
  // disk or queued already.
  bool QueueDemote(std::string_view host_id, std::string_view owner_client, std::string_view key);
  // Queues a promotion of the key's disk copy (once until it is done). False when it has none
  // that is online.
  bool QueuePromote(std::string_view key);
  // The holder put the key back into memory (a put with `promotion`; the key may be in memory
  // already): the promotion is done. True when `client_id` holds the key's disk copy, so that the
  // copy stays.
  bool Promoted(std::string_view key, const std::string& client_id);
  // Whether `key` was brought back from disk within promoted_grace (eviction passes it over).
  bool JustPromoted(std::string_view key);
  // Whether a promotion put of `key` has started and not ended (however long it takes: a reader
  // that finds the key being written waits for it as for the promotion it is).
  bool BeingPromoted(std::string_view key) const;
  // Puts of the keys ended or were revoked.
  void PutsEnded(std::span<const std::string_view> keys);
  // Puts of the keys asked for write-through: when each ends, the master demotes its object at
  // once (MasterState::DemoteNow). Forgotten after demote_timeout (a put that never ended); at
  // most kMaxWriteThrough are remembered at once, past which write-through falls back to the
  // watermark's demotion.
  void ExpectWriteThrough(std::span<const std::string_view> keys);
  bool WriteThroughExpected() const { return write_through_count_.load() > 0; }
  // Whether a put of `key` asked for write-through (and forgets it).
  bool TakeWriteThrough(std::string_view key);
  // The keys were put anew (not a promotion) or removed: their copies go, their holders are told,
  // their queued demotions are void.
  void Invalidate(std::span<const std::string_view> keys);
  // As Invalidate, for every key that `match`es; returns how many copies went.
  uint64_t InvalidateIf(const std::function<bool(std::string_view key)>& match);
  // Gives up demotions queued longer than demote_timeout; marks silent holders offline.
  void Sweep();
  // The client left or expired: if it held a disk, its copies are offline until a process of that
  // disk polls again.
  void ClientGone(const std::string& client_id);
  // Wakes every poll (the master stops).
  void Stop();

  DiskTierCounters& counters() { return counters_; }
  const DiskTierCounters& counters() const { return counters_; }
  std::vector<DiskHolderView> Holders() const;
  uint64_t copies() const;
  // How long promotions took: from the first get that found the key only on disk to the holder's
  // put of it (the disk read and the copy into memory), for promotions that were asked for.
  LatencyHistogram::Snapshot PromotionTimes() const { return promotion_time_.Read(); }

 private:
  struct Copy {
    uint32_t holder = 0;
    uint64_t size = 0;
    uint64_t generation = 0;
  };
  struct Holder {
    std::string identity;
    std::string client_id;
    std::string host_id;
    DiskHolderReport report;
    Clock::time_point last_poll{};
    bool online = false;
    bool announced = false;  // this master has asked for (and got) its copies
    std::deque<std::string> demote, promote, drop;
    uint64_t copies = 0;
    uint64_t copy_bytes = 0;
  };
  struct PendingDemotion {
    uint32_t holder = 0;
    Clock::time_point queued{};
  };

  // Lookups by string_view without a copy of the key.
  struct KeyHash {
    using is_transparent = void;
    size_t operator()(std::string_view key) const { return std::hash<std::string_view>{}(key); }
  };
  template <typename V>
  using KeyMap = std::unordered_map<std::string, V, KeyHash, std::equal_to<>>;

  Holder* HolderOf(const std::string& client_id) LARDER_REQUIRES(mu_);
  void DropCopyLocked(std::string_view key, bool tell_holder) LARDER_REQUIRES(mu_);
  void TakeTasksLocked(Holder& holder, DiskTasks* tasks) LARDER_REQUIRES(mu_);
  // The holder's process is gone or silent: its copies are not served, its queued work is void
  // (demotions end as timed out when they would have; promotions are asked for again by the
  // readers' next gets, once the holder is back).
  void OfflineLocked(uint32_t index) LARDER_REQUIRES(mu_);

  const DiskTierOptions options_;
  std::atomic<bool> active_{false};
  DiskTierCounters counters_;

  mutable Mutex mu_;
  CondVar work_;
  bool stopping_ LARDER_GUARDED_BY(mu_) = false;
  std::vector<Holder> holders_ LARDER_GUARDED_BY(mu_);  // index: Copy::holder
  KeyMap<Copy> copies_ LARDER_GUARDED_BY(mu_);
  KeyMap<PendingDemotion> pending_ LARDER_GUARDED_BY(mu_);
  KeyMap<PendingDemotion> promoting_ LARDER_GUARDED_BY(mu_);   // promotions asked for
  KeyMap<Clock::time_point> promoted_ LARDER_GUARDED_BY(mu_);  // until when eviction spares it
  std::atomic<size_t> promoted_count_{0};                      // promoted_.size(), read unlocked
  LatencyHistogram promotion_time_;
  KeyMap<Clock::time_point> promotion_puts_ LARDER_GUARDED_BY(mu_);  // started, not ended
  std::atomic<size_t> promotion_puts_count_{0};  // promotion_puts_.size(), read unlocked
  static constexpr size_t kMaxWriteThrough = 1 << 20;
  KeyMap<Clock::time_point> write_through_ LARDER_GUARDED_BY(mu_);  // puts not ended yet
  std::atomic<size_t> write_through_count_{0};  // write_through_.size(), read unlocked
};

}  // namespace larder::master
