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
}

std::pair<BatchId, BatchState*> BatchTable::Acquire() {
  std::lock_guard lock(lock_);
  uint32_t index;
  if (!free_.empty()) {
    index = free_.back();
    free_.pop_back();
  } else {
    index = static_cast<uint32_t>(slots_.size());
    slots_.push_back(std::make_unique<BatchState>());
  }
  BatchState* state = slots_[index].get();
  state->in_use = true;
  BatchId id = (static_cast<uint64_t>(state->generation) << 32) | (index + 1);
  return {id, state};
}

BatchState* BatchTable::Find(BatchId id) {
  uint64_t index = (id & 0xffffffffULL);
  if (index == 0) return nullptr;
  --index;
  std::lock_guard lock(lock_);
  if (index >= slots_.size()) return nullptr;
  BatchState* state = slots_[index].get();
  if (!state->in_use || state->generation != static_cast<uint32_t>(id >> 32)) return nullptr;
  return state;
}

Status BatchTable::Release(BatchId id) {
  uint64_t index = (id & 0xffffffffULL);
  std::lock_guard lock(lock_);
  BatchState* state = index == 0 || index > slots_.size() ? nullptr : slots_[index - 1].get();
  if (state == nullptr || !state->in_use || state->generation != static_cast<uint32_t>(id >> 32)) {
    return NotFoundError("no batch " + std::to_string(id));
  }
  if (state->pending_requests.load() != 0) {
    return FailedPreconditionError("batch " + std::to_string(id) +
                                   " still has requests in flight; Wait for it first");
  }
  state->keepalive.clear();
  state->in_use = false;
  ++state->generation;
  free_.push_back(static_cast<uint32_t>(index - 1));
  return Status();
}

}  // namespace larder::transfer
