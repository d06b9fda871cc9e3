// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/batch.h"

#include <mutex>

namespace larder::transfer {

void BatchState::Prepare(size_t n) {
  if (n > capacity) {
    progress = std::make_unique<RequestProgress[]>(n);
    capacity = n;
  }
  for (size_t i = 0; i < n; ++i) {
    RequestProgress& p = progress[i];
    p.pending_slices.store(0, std::memory_order_relaxed);
    p.bytes.store(0, std::memory_order_relaxed);
    p.route.store(0, std::memory_order_relaxed);
    if (!p.status.ok()) p.status = Status();
  }
  count = n;
  request_segment.assign(n, nullptr);
  slices.clear();
  dispatch.clear();
  keepalive.clear();
  pending_requests.store(0, std::memory_order_relaxed);
  failed_requests.store(0, std::memory_order_relaxed);
}

BatchTable::BatchTable() : slots_(std::make_unique<std::atomic<BatchState*>[]>(kMaxBatches)) {}

Result<std::pair<BatchId, BatchState*>> BatchTable::Acquire() {
  std::lock_guard lock(lock_);
  uint32_t index;
  if (!free_.empty()) {
    index = free_.back();
    free_.pop_back();
  } else {
    if (owned_.size() >= kMaxBatches) {
      return ResourceExhaustedError("too many unreleased batches (" + std::to_string(kMaxBatches) +
                                    "); Release finished ones");
    }
    index = static_cast<uint32_t>(owned_.size());
    owned_.push_back(std::make_unique<BatchState>());
    slots_[index].store(owned_.back().get(), std::memory_order_release);
  }
  BatchState* state = owned_[index].get();
  uint64_t ticket = state->ticket.load(std::memory_order_relaxed) | 1;
  state->ticket.store(ticket, std::memory_order_release);
  BatchId id = ((ticket >> 1) << 32) | (index + 1);
  return std::make_pair(id, state);
}

BatchState* BatchTable::Find(BatchId id) const {
  uint64_t index = id & 0xffffffffULL;
  if (index == 0 || index > kMaxBatches) return nullptr;
  BatchState* state = slots_[index - 1].load(std::memory_order_acquire);
  if (state == nullptr) return nullptr;
  uint64_t expected = ((id >> 32) << 1) | 1;
  if (state->ticket.load(std::memory_order_acquire) != expected) return nullptr;
  return state;
}

Status BatchTable::Release(BatchId id) {
  std::lock_guard lock(lock_);
  BatchState* state = Find(id);
  if (state == nullptr) return NotFoundError("no batch " + std::to_string(id));
  if (state->pending_requests.load() != 0) {
    return FailedPreconditionError("batch " + std::to_string(id) +
                                   " still has requests in flight; Wait for it first");
  }
  state->keepalive.clear();
  // Bump the generation (and clear in_use): the id is now stale.
  uint64_t ticket = state->ticket.load(std::memory_order_relaxed);
  state->ticket.store((((ticket >> 1) + 1) & 0xffffffffULL) << 1, std::memory_order_release);
  free_.push_back(static_cast<uint32_t>((id & 0xffffffffULL) - 1));
  return Status();
}

}  // namespace larder::transfer
