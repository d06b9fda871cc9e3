// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/batch.h"

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
  local_device.assign(n, 0);
  slices.clear();
  dispatch.clear();
  keepalive.clear();
  pending_requests.store(0, std::memory_order_relaxed);
  failed_requests.store(0, std::memory_order_relaxed);
}

namespace {
std::atomic<uint64_t> next_table_id{1};
}  // namespace

thread_local BatchTable::ThreadCache BatchTable::cache_;

BatchTable::BatchTable()
    : table_id_(next_table_id.fetch_add(1)),
      slots_(std::make_unique<std::atomic<BatchState*>[]>(kMaxBatches)) {}

Result<std::pair<BatchId, BatchState*>> BatchTable::Acquire() {
  uint32_t index;
  BatchState* state;
  if (cache_.table_id == table_id_) {
    cache_.table_id = 0;
    index = cache_.index;
    state = slots_[index].load(std::memory_order_acquire);
  } else {
    SpinLockHolder lock(lock_);
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else {
      if (owned_.size() >= kMaxBatches) {
        return ResourceExhaustedError("too many unreleased batches (" +
                                      std::to_string(kMaxBatches) + "); Release finished ones");
      }
      index = static_cast<uint32_t>(owned_.size());
      owned_.push_back(std::make_unique<BatchState>());
      slots_[index].store(owned_.back().get(), std::memory_order_release);
    }
    state = owned_[index].get();
  }
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
  BatchState* state = Find(id);
  if (state == nullptr) return NotFoundError("no batch " + std::to_string(id));
  if (state->pending_requests.load() != 0) {
    return FailedPreconditionError("batch " + std::to_string(id) +
                                   " still has requests in flight; Wait for it first");
  }
  // Bumping the generation (and clearing in_use) makes the id stale; of two concurrent releases
  // only one wins the exchange.
  uint64_t ticket = ((id >> 32) << 1) | 1;
  uint64_t next = ((((id >> 32) + 1) & 0xffffffffULL) << 1);
  if (!state->ticket.compare_exchange_strong(ticket, next, std::memory_order_acq_rel)) {
    return NotFoundError("no batch " + std::to_string(id));
  }
  state->keepalive.clear();
  auto index = static_cast<uint32_t>((id & 0xffffffffULL) - 1);
  if (cache_.table_id == 0) {
    cache_ = {table_id_, index};
    return Status();
  }
  SpinLockHolder lock(lock_);
  free_.push_back(index);
  return Status();
}

}  // namespace larder::transfer
