// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Batch bookkeeping of the engine: per-request progress counters and the slot table that hands
// out BatchIds without allocating on the hot path.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/mutex.h"
#include "larder/status.h"
#include "larder/transfer_engine.h"
#include "transfer/transport.h"

namespace larder::transfer {

struct OpenedSegment;

struct RequestProgress {
  std::atomic<uint32_t> pending_slices{0};
  std::atomic<uint64_t> bytes{0};
  // 1 + the index of the route that moved the (last) bytes, with kStagedRoute set when they went
  // through a pinned staging buffer on this side; 0 before any did.
  std::atomic<uint8_t> route{0};
  static constexpr uint8_t kStagedRoute = 0x80;
  Status status;  // guarded by BatchState::mu
};

struct BatchState {
  // Resets for `count` requests, keeping allocated capacity.
  void Prepare(size_t count);

  // (generation << 1) | in_use. Read without a lock by BatchTable::Find.
  std::atomic<uint64_t> ticket{0};
  size_t count = 0;
  size_t capacity = 0;
  std::unique_ptr<RequestProgress[]> progress;
  std::vector<OpenedSegment*> request_segment;  // null for requests that failed validation
  std::vector<uint8_t> local_device;  // 1 where the request's local buffer is device memory
  std::vector<Slice> slices;          // never reallocated while the batch runs
  std::vector<Slice*> dispatch;
  std::vector<std::shared_ptr<OpenedSegment>> keepalive;
  // The last segment this slot looked up, kept across uses of the slot so that a thread that keeps
  // submitting to one segment skips the handle table. Valid while `cached_version` equals the
  // engine's close counter; it may keep a closed segment alive until the slot looks up another.
  std::shared_ptr<OpenedSegment> cached_segment;
  uint64_t cached_version = 0;
  std::atomic<size_t> pending_requests{0};
  std::atomic<size_t> failed_requests{0};
  std::atomic<int> waiters{0};
  Mutex mu;
  CondVar cv;
};

// A tiny test-and-set lock for short critical sections on the submit path.
class LARDER_CAPABILITY("spin lock") SpinLock {
 public:
  void lock() LARDER_ACQUIRE() {
    while (flag_.exchange(true, std::memory_order_acquire)) {
      while (flag_.load(std::memory_order_relaxed)) {
      }
    }
  }
  void unlock() LARDER_RELEASE() { flag_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> flag_{false};
};

// Holds a SpinLock for a scope (std::lock_guard, with the annotations the analysis needs).
class LARDER_SCOPED_CAPABILITY SpinLockHolder {
 public:
  explicit SpinLockHolder(SpinLock& lock) LARDER_ACQUIRE(lock) : lock_(lock) { lock_.lock(); }
  ~SpinLockHolder() LARDER_RELEASE() { lock_.unlock(); }
  SpinLockHolder(const SpinLockHolder&) = delete;
  SpinLockHolder& operator=(const SpinLockHolder&) = delete;

 private:
  SpinLock& lock_;
};

// Hands out batch slots; a BatchId is (generation << 32 | index + 1), so stale ids are detected.
// Slots live for the table's life, so Find needs no lock.
class BatchTable {
 public:
  // Most batches alive at once.
  static constexpr uint32_t kMaxBatches = 1 << 16;

  BatchTable();
  // ResourceExhausted when kMaxBatches batches are alive.
  Result<std::pair<BatchId, BatchState*>> Acquire();
  // Null when `id` is unknown or released.
  BatchState* Find(BatchId id) const;
  // NotFound for unknown ids, FailedPrecondition while running.
  Status Release(BatchId id);

 private:
  // Each thread keeps at most one released slot of one table, so a thread that submits and
  // releases in a loop never touches the shared free list. Table ids are never reused.
  struct ThreadCache {
    uint64_t table_id = 0;
    uint32_t index = 0;
  };
  static thread_local ThreadCache cache_;

  const uint64_t table_id_;
  std::unique_ptr<std::atomic<BatchState*>[]> slots_;  // written under lock_, read lock-free
  SpinLock lock_;
  std::vector<std::unique_ptr<BatchState>> owned_ LARDER_GUARDED_BY(lock_);
  std::vector<uint32_t> free_ LARDER_GUARDED_BY(lock_);
};

}  // namespace larder::transfer
