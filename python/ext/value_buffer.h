// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// larder.Buffer: memory a get filled, handed to Python without a copy. Buffers come from a
// BufferCache that keeps freed memory for reuse, so a steady stream of gets of similar sizes
// touches memory that is already faulted in.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
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

// One value's bytes. Owns its block (returned to the cache when the Buffer goes); the cache
// outlives every Buffer taken from it.
class ValueBuffer {
 public:
  ValueBuffer(std::shared_ptr<BufferCache> cache, void* block, size_t capacity)
      : cache_(std::move(cache)), block_(block), capacity_(capacity) {}
  ~ValueBuffer() { cache_->Give(block_, capacity_); }
  ValueBuffer(const ValueBuffer&) = delete;
  ValueBuffer& operator=(const ValueBuffer&) = delete;

  void* data() const { return block_; }
  size_t size() const { return size_; }
  void set_size(size_t size) { size_ = size; }

 private:
  std::shared_ptr<BufferCache> cache_;
  void* block_;
  size_t capacity_;
  size_t size_ = 0;
};

// larder.Buffer.
void BindValueBuffer(py::module_& module);

}  // namespace larder::python
