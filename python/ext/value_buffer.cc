// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "value_buffer.h"

#include <bit>
#include <cstdlib>
#include <string>

#include "bindings.h"

namespace larder::python {

namespace {
constexpr size_t kMinClass = 4096;
}  // namespace

BufferCache::~BufferCache() {
  for (auto& [capacity, blocks] : free_) {
    for (void* block : blocks) std::free(block);
  }
}

std::pair<void*, size_t> BufferCache::Take(size_t size) {
  size_t capacity = std::bit_ceil(std::max(size, kMinClass));
  {
    std::lock_guard lock(mu_);
    auto it = free_.find(capacity);
    if (it != free_.end() && !it->second.empty()) {
      void* block = it->second.back();
      it->second.pop_back();
      cached_bytes_ -= capacity;
      return {block, capacity};
    }
  }
  return {std::aligned_alloc(kMinClass, capacity), capacity};
}

void BufferCache::Give(void* block, size_t capacity) {
  {
    std::lock_guard lock(mu_);
    if (cached_bytes_ + capacity <= max_cached_bytes_) {
      free_[capacity].push_back(block);
      cached_bytes_ += capacity;
      return;
    }
  }
  std::free(block);
}

std::pair<std::shared_ptr<CachedBlock>, size_t> BatchArena::Allocate(size_t size) {
  size_t aligned = (size + 63) & ~size_t{63};
  if (!block_ || block_->capacity() - used_ < aligned) {
    auto [data, capacity] = cache_->Take(std::max(aligned, kBlockBytes));
    if (data == nullptr) return {nullptr, 0};
    block_ = std::make_shared<CachedBlock>(cache_, data, capacity);
    used_ = 0;
  }
  size_t offset = used_;
  used_ += aligned;
  return {block_, offset};
}

void BindValueBuffer(py::module_& module) {
  py::class_<ValueBuffer, std::shared_ptr<ValueBuffer>>(
      module, "Buffer", py::buffer_protocol(),
      "A value read by Store.batch_get_buffers: writable bytes with the buffer protocol "
      "(memoryview(buf), numpy.frombuffer, torch.frombuffer), valid while the object lives.")
      .def(
          "ptr", [](const ValueBuffer& self) { return reinterpret_cast<uintptr_t>(self.data()); },
          "The address of the first byte.")
      .def("size", &ValueBuffer::size, "The length in bytes.")
      .def_property_readonly(
          "address",
          [](const ValueBuffer& self) { return reinterpret_cast<uintptr_t>(self.data()); })
      .def("__len__", &ValueBuffer::size)
      .def_buffer([](ValueBuffer& self) {
        return py::buffer_info(self.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(self.size())}, {1});
      })
      .def("__repr__", [](const ValueBuffer& self) {
        return "<larder.Buffer size=" + std::to_string(self.size()) + ">";
      });
}

}  // namespace larder::python
