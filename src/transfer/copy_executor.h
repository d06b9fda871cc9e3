// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Runs memory-to-memory slices for the routes that copy with the CPU (local, shm): inline in the
// caller when the batch is small, otherwise cut into stripes of roughly equal size, independent of
// slice boundaries, one for the calling thread and one for each copy-pool thread, so that even one
// large request uses every core (the caller would otherwise only sleep in Wait). A slice is
// reported once all of its stripes are done.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "common/mutex.h"
#include "common/priority.h"
#include "common/thread_pool.h"
#include "transfer/transport.h"

namespace larder::transfer {

// Smallest stripe handed to a pool thread; smaller ones cost more in hand-off than they gain.
inline constexpr uint64_t kMinStripeBytes = 256 * 1024;

// Runs copy(s, begin, length) as the slice's traffic class asks (common/priority.h): a latency
// slice in one call, marked as latency work of the process; a bulk slice in chunks of at most
// kBulkCopyChunk, stepping aside after each while latency work runs.
template <typename CopyFn>
Status CopyPiece(CopyFn& copy, Slice* s, uint64_t begin, uint64_t length) {
  if (s->latency) {
    LatencyWorkScope latency;
    return copy(s, begin, length);
  }
  for (uint64_t done = 0; done < length;) {
    uint64_t n = std::min(length - done, kBulkCopyChunk);
    Status st = copy(s, begin + done, n);
    if (!st.ok()) return st;
    done += n;
    YieldToLatencyWork();
  }
  return Status();
}

// copy(Slice*, begin, length) -> Status moves bytes [begin, begin + length) of one slice. It must
// be safe to call concurrently from any thread. It is destroyed before the last slice is reported,
// so whatever it holds for the copies' sake (a mapping) is let go by the time the batch completes.
template <typename CopyFn>
void ExecuteCopies(ThreadPool* pool, uint64_t inline_bytes, std::span<Slice* const> slices,
                   SliceCallback* done, CopyFn copy) {
  uint64_t total = 0;
  for (const Slice* s : slices) total += s->length;
  // This thread takes one stripe and each idle pool thread one more, up to one stripe per copy
  // thread: more stripes than cores only add stragglers, and when other submitters keep the pool
  // busy, copying in line beats queueing behind them.
  uint64_t workers = 1;
  if (pool != nullptr && total > inline_bytes && total > kMinStripeBytes) {
    workers = std::min<uint64_t>(pool->size(), pool->idle() + 1);
  }
  if (workers <= 1) {
    if (slices.empty()) return;
    // The copy function lives in this block only: it is gone before the last slice is reported.
    Status last;
    {
      CopyFn fn(std::move(copy));
      for (Slice* s : slices.first(slices.size() - 1)) {
        done->OnSliceDone(s, CopyPiece(fn, s, 0, s->length));
      }
      last = CopyPiece(fn, slices.back(), 0, slices.back()->length);
    }
    done->OnSliceDone(slices.back(), last);
    return;
  }

  struct Piece {
    uint32_t slice;
    uint64_t begin;
    uint64_t length;
  };
  struct Shared {
    // `status` is sized here, before any thread can see it, where the analysis needs no lock.
    Shared(CopyFn fn, size_t count) : copy(std::move(fn)), slices_left(count), status(count) {}
    // Reset by the thread that finishes the last slice: every copy has returned by then.
    std::optional<CopyFn> copy;
    std::vector<Slice*> slices;
    std::atomic<size_t> slices_left;
    std::unique_ptr<std::atomic<uint32_t>[]> stripes_left;
    Mutex mu;
    std::vector<Status> status LARDER_GUARDED_BY(mu);
  };
  auto shared = std::make_shared<Shared>(std::move(copy), slices.size());
  shared->slices.assign(slices.begin(), slices.end());
  shared->stripes_left = std::make_unique<std::atomic<uint32_t>[]>(slices.size());

  uint64_t stripe = std::max<uint64_t>(kMinStripeBytes, (total + workers - 1) / workers);
  std::vector<std::vector<Piece>> tasks(1);
  uint64_t task_bytes = 0;
  for (uint32_t i = 0; i < slices.size(); ++i) {
    uint32_t pieces = 0;
    for (uint64_t begin = 0; begin < slices[i]->length;) {
      if (task_bytes >= stripe) {
        tasks.emplace_back();
        task_bytes = 0;
      }
      uint64_t length = std::min(slices[i]->length - begin, stripe - task_bytes);
      tasks.back().push_back({i, begin, length});
      task_bytes += length;
      begin += length;
      ++pieces;
    }
    shared->stripes_left[i].store(pieces, std::memory_order_relaxed);
  }
  auto run = [shared, done](const std::vector<Piece>& task) {
    for (const Piece& p : task) {
      Slice* s = shared->slices[p.slice];
      Status st = CopyPiece(*shared->copy, s, p.begin, p.length);
      if (!st.ok()) {
        MutexLock lock(shared->mu);
        if (shared->status[p.slice].ok()) shared->status[p.slice] = st;
      }
      if (shared->stripes_left[p.slice].fetch_sub(1, std::memory_order_acq_rel) == 1) {
        Status result;
        {
          MutexLock lock(shared->mu);
          result = shared->status[p.slice];
        }
        if (shared->slices_left.fetch_sub(1, std::memory_order_acq_rel) == 1) shared->copy.reset();
        done->OnSliceDone(s, result);
      }
    }
  };
  for (size_t t = 1; t < tasks.size(); ++t) {
    pool->Schedule([run, task = std::move(tasks[t])] { run(task); });
  }
  run(tasks[0]);
}

// Copies bytes [begin, begin + length) of a slice between local memory and `segment_base`, the
// address of segment offset 0.
inline void CopySliceRange(const Slice& slice, uint8_t* segment_base, uint64_t begin,
                           uint64_t length) {
  uint8_t* remote = segment_base + slice.offset + begin;
  if (slice.op == TransferOp::kRead) {
    std::memcpy(slice.local + begin, remote, length);
  } else {
    std::memcpy(remote, slice.local + begin, length);
  }
}

}  // namespace larder::transfer
