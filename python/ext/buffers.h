// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Memory named by Python arguments. Every call that takes a buffer accepts either an integer
// address plus a size (what frameworks hand out: tensor.data_ptr(), ndarray.ctypes.data) or any
// object exporting a C-contiguous buffer (bytes, bytearray, memoryview, numpy arrays, mmap).
//
// Thread safety: creating and destroying a ByteRange needs the GIL; data() and size() do not, so
// a binding resolves its ranges, releases the GIL for the transfer, and drops them after.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

namespace larder::python {

namespace py = pybind11;

class ByteRange {
 public:
  // Resolves `object`. An int (or an integer scalar such as numpy.uint64) is an address and
  // `size` is required. Any other object
  // must export a C-contiguous buffer, writable when `writable`; `size`, when not None, must not
  // exceed the buffer's length and selects its first `size` bytes. The buffer view is held until
  // the range is destroyed, which keeps the memory alive and unresized (bytearray) meanwhile.
  // Throws TypeError / BufferError (not a buffer, not contiguous, read-only) and
  // larder.InvalidArgumentError (negative size, size beyond the buffer).
  static ByteRange From(py::handle object, py::handle size, bool writable);

  ByteRange() = default;
  ByteRange(ByteRange&& other) noexcept;
  ByteRange& operator=(ByteRange&& other) noexcept;
  ByteRange(const ByteRange&) = delete;
  ByteRange& operator=(const ByteRange&) = delete;
  // Releases the buffer view. REQUIRES: the GIL is held.
  ~ByteRange();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  // True when the range holds a buffer view (it came from an object, not an address).
  bool holds_view() const { return view_ != nullptr; }

 private:
  void Release();

  void* data_ = nullptr;
  size_t size_ = 0;
  std::unique_ptr<Py_buffer> view_;  // null for an integer address
};

// The address `object` names: the integer itself, or the start of its buffer.
uintptr_t AddressOf(py::handle object);

// `size` (an int or an integer scalar) as a byte count: None gives nullopt; other types raise
// TypeError, negative values InvalidArgumentError.
std::optional<uint64_t> OptionalSize(py::handle size, const char* what);

}  // namespace larder::python
