// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "buffers.h"

#include <string>

#include "errors.h"

namespace larder::python {

namespace {

// `object` as a Python int when it is one or converts losslessly (numpy integer scalars, anything
// with __index__); nullopt otherwise. Arrays refuse __index__ unless 0-d, so they stay buffers.
std::optional<py::int_> AsIndex(py::handle object) {
  if (PyBool_Check(object.ptr())) return std::nullopt;
  if (PyLong_Check(object.ptr())) return py::reinterpret_borrow<py::int_>(object);
  if (!PyIndex_Check(object.ptr())) return std::nullopt;
  PyObject* index = PyNumber_Index(object.ptr());
  if (index == nullptr) {
    PyErr_Clear();
    return std::nullopt;
  }
  return py::reinterpret_steal<py::int_>(index);
}

}  // namespace

std::optional<uint64_t> OptionalSize(py::handle size, const char* what) {
  if (size.is_none()) return std::nullopt;
  std::optional<py::int_> index = AsIndex(size);
  if (!index) {
    throw py::type_error(std::string(what) + " must be an int, not " +
                         std::string(py::str(py::type::handle_of(size).attr("__name__"))));
  }
  int overflow = 0;
  long long value = PyLong_AsLongLongAndOverflow(index->ptr(), &overflow);
  if (value == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (overflow != 0 || value < 0) {
    throw StatusError(InvalidArgumentError(std::string(what) + " " + std::string(py::str(size)) +
                                           " is out of range"));
  }
  return static_cast<uint64_t>(value);
}

ByteRange ByteRange::From(py::handle object, py::handle size, bool writable) {
  ByteRange range;
  std::optional<uint64_t> wanted = OptionalSize(size, "size");
  if (AsIndex(object)) {
    if (!wanted) throw py::type_error("size is required with an integer address");
    range.data_ = reinterpret_cast<void*>(static_cast<uintptr_t>(*OptionalSize(object, "address")));
    range.size_ = *wanted;
    return range;
  }
  auto view = std::make_unique<Py_buffer>();
  int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(object.ptr(), view.get(), flags) != 0) throw py::error_already_set();
  range.data_ = view->buf;
  range.size_ = static_cast<size_t>(view->len);
  range.view_ = std::move(view);
  if (wanted) {
    if (*wanted > range.size_) {
      throw StatusError(InvalidArgumentError("size " + std::to_string(*wanted) +
                                             " exceeds the buffer's " +
                                             std::to_string(range.size_) + " bytes"));
    }
    range.size_ = *wanted;
  }
  return range;
}

ByteRange::ByteRange(ByteRange&& other) noexcept { *this = std::move(other); }

ByteRange& ByteRange::operator=(ByteRange&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = other.data_;
    size_ = other.size_;
    view_ = std::move(other.view_);
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

ByteRange::~ByteRange() { Release(); }

void ByteRange::Release() {
  if (view_) {
    PyBuffer_Release(view_.get());
    view_.reset();
  }
}

uintptr_t AddressOf(py::handle object) {
  if (AsIndex(object)) return static_cast<uintptr_t>(*OptionalSize(object, "address"));
  Py_buffer view;
  if (PyObject_GetBuffer(object.ptr(), &view, PyBUF_SIMPLE) != 0) throw py::error_already_set();
  auto address = reinterpret_cast<uintptr_t>(view.buf);
  PyBuffer_Release(&view);
  return address;
}

}  // namespace larder::python
