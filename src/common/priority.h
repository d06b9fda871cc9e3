// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// How bulk transfer work gives way to latency work on one host (TrafficClass in
// larder/transfer_engine.h): threads that only serve or copy bulk work run at a higher nice value,
// threads that only carry latency work at a lower one where the process may, and bulk copies on
// the CPU routes step aside between bounded chunks while latency work of this process is running.
// Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>

namespace larder {

// Nice value added to threads that serve or copy bulk work: such a thread gets about a tenth of a
// core's time against a busy nice 0 thread, and all of it when nothing else runs.
inline constexpr int kBulkNice = 10;

// Bulk copies on the CPU routes run in pieces of at most this many bytes (~20-50 us of memcpy),
// with YieldToLatencyWork between them.
inline constexpr uint64_t kBulkCopyChunk = 256 * 1024;

// Adds `increment` (> 0) to the calling thread's nice value. Raising a nice value needs no
// privilege; it cannot be undone without one, so only threads that stay bulk call this. Best
// effort: a failure leaves the thread as it was.
void LowerThisThreadPriority(int increment);

// Latency threads ask for this much below nice 0 where the process may (CAP_SYS_NICE, or an
// RLIMIT_NICE that allows it); elsewhere they stay at nice 0.
inline constexpr int kLatencyNice = -5;
// Sets the calling thread's nice value to kLatencyNice if permitted. Best effort.
void RaiseThisThreadPriority();

// Marks latency work of this process as running while it lives (a served PD frame, a latency copy).
class LatencyWorkScope {
 public:
  LatencyWorkScope() { running_.fetch_add(1, std::memory_order_relaxed); }
  ~LatencyWorkScope() { running_.fetch_sub(1, std::memory_order_relaxed); }
  LatencyWorkScope(const LatencyWorkScope&) = delete;
  LatencyWorkScope& operator=(const LatencyWorkScope&) = delete;

  static bool Running() { return running_.load(std::memory_order_relaxed) > 0; }

 private:
  static std::atomic<int> running_;
};

// Called by bulk work between chunks: gives the CPU to other runnable threads (sched_yield) while
// latency work of this process is running; otherwise returns at once.
void YieldToLatencyWork();

}  // namespace larder
