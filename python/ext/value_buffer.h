// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// larder.Buffer: memory a get filled, handed to Python without a copy. The values of one batch
// are carved out of a few large blocks (one allocation for many values, laid out as a pool
// would be), and blocks come from a BufferCache that keeps freed ones for reuse, so a steady
// stream of gets touches memory that is already faulted in. A block goes back to the cache when
// the last Buffer carved from it goes.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace larder::python {

namespace py = pybind11;

// Freed blocks by size class (powers of two from 4 KiB), up to `max_cached_bytes` in all.
// Thread-safe.
class BufferCache : public std::enable_shared_from_this<BufferCache> {
 public:
  explicit BufferCache(size_t max_cached_bytes) : max_cached_bytes_(max_cached_bytes) {}
  ~BufferCache();
  BufferCache(const BufferCache&) = delete;
  BufferCache& operator=(const BufferCache&) = delete;

  // A block of at least `size` bytes and its capacity; nullptr when memory is exhausted.
  std::pair<void*, size_t> Take(size_t size);
  // Returns a block from Take.
  void Give(void* block, size_t capacity);

 private:
  const size_t max_cached_bytes_;
  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;  // by capacity; guarded by mu_
  size_t cached_bytes_ = 0;                    // guarded by mu_
};

// A block from a BufferCache, given back when destroyed; the cache outlives its blocks.
class CachedBlock {
 public:
  CachedBlock(std::shared_ptr<BufferCache> cache, void* data, size_t capacity)
      : cache_(std::move(cache)), data_(data), capacity_(capacity) {}
  ~CachedBlock() { cache_->Give(data_, capacity_); }
  CachedBlock(const CachedBlock&) = delete;
  CachedBlock& operator=(const CachedBlock&) = delete;

  std::byte* data() const { return static_cast<std::byte*>(data_); }
  size_t capacity() const { return capacity_; }

 private:
  std::shared_ptr<BufferCache> cache_;
  void* data_;
  size_t capacity_;
};

// Carves the values of one batch out of blocks of at least kBlockBytes. Not thread-safe.
class BatchArena {
 public:
  static constexpr size_t kBlockBytes = 4u << 20;
  explicit BatchArena(std::shared_ptr<BufferCache> cache) : cache_(std::move(cache)) {}
  // `size` bytes (64-byte aligned) and the block that holds them; a null block when memory is
  // exhausted.
  std::pair<std::shared_ptr<CachedBlock>, size_t> Allocate(size_t size);

 private:
  std::shared_ptr<BufferCache> cache_;
  std::shared_ptr<CachedBlock> block_;
  size_t used_ = 0;
};

// One value's bytes: a range of a block, which it keeps alive.
class ValueBuffer {
 public:
  ValueBuffer(std::shared_ptr<CachedBlock> block, size_t offset, size_t size)
      : block_(std::move(block)), offset_(offset), size_(size) {}

  void* data() const { return block_->data() + offset_; }
  size_t size() const { return size_; }

 private:
  std::shared_ptr<CachedBlock> block_;
  size_t offset_;
  size_t size_;
};

// larder.Buffer.
void BindValueBuffer(py::module_& module);

}  // namespace larder::python
