// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Runs memory-to-memory slices for the routes that copy with the CPU (local, shm): inline in the
// caller when the batch is small, otherwise striped over the engine's copy pool in chunks of
// roughly equal size, so one large request uses every copy thread.
#pragma once

#include <algorithm>
#include <memory>
#include <span>
#include <vector>

#include "common/thread_pool.h"
#include "transfer/transport.h"

namespace larder::transfer {

// Smallest chunk handed to a pool thread; smaller ones cost more in hand-off than they gain.
inline constexpr uint64_t kMinStripeBytes = 256 * 1024;

// copy(Slice*) -> Status moves one slice. It must be safe to call from any thread and must stay
// callable until every slice is reported.
template <typename CopyFn>
void ExecuteCopies(ThreadPool* pool, uint64_t inline_bytes, std::span<Slice* const> slices,
                   SliceCallback* done, CopyFn copy) {
  uint64_t total = 0;
  for (const Slice* s : slices) total += s->length;
  if (pool == nullptr || total <= inline_bytes || (slices.size() == 1 && total <= kMinStripeBytes)) {
    for (Slice* s : slices) done->OnSliceDone(s, copy(s));
    return;
  }
  uint64_t stripe = std::max<uint64_t>(kMinStripeBytes, total / pool->size());
  auto shared_copy = std::make_shared<CopyFn>(std::move(copy));
  std::vector<Slice*> chunk;
  uint64_t chunk_bytes = 0;
  auto flush = [&] {
    if (chunk.empty()) return;
    pool->Schedule([slices = std::move(chunk), done, shared_copy] {
      for (Slice* s : slices) done->OnSliceDone(s, (*shared_copy)(s));
    });
    chunk.clear();
    chunk_bytes = 0;
  };
  for (Slice* s : slices) {
    chunk.push_back(s);
    chunk_bytes += s->length;
    if (chunk_bytes >= stripe) flush();
  }
  flush();
}

// Copies one slice between local memory and `segment_address` (the slice's offset already applied).
inline void CopySlice(const Slice& slice, uint8_t* segment_address) {
  if (slice.op == TransferOp::kRead) {
    std::memcpy(slice.local, segment_address, slice.length);
  } else {
    std::memcpy(segment_address, slice.local, slice.length);
  }
}

}  // namespace larder::transfer
