// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The module edge of larder::Status: one Python exception class per status code, all derived from
// larder.LarderError, and the helpers bindings use to raise them or to return them as values in
// batch results.
//
// Thread safety: RegisterErrors runs once at import; every other function needs the GIL, except
// that StatusError may be constructed and thrown without it (the translator runs with the GIL).
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <string>
#include <utility>

#include "larder/status.h"

namespace larder::python {

namespace py = pybind11;

// Carries a non-OK Status out of a binding; the registered translator turns it into the
// LarderError subclass of its code (message: the status message; attribute `code`: StatusCode).
class StatusError : public std::exception {
 public:
  explicit StatusError(Status status) : status_(std::move(status)), what_(status_.ToString()) {}
  const Status& status() const { return status_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  Status status_;
  std::string what_;
};

// Throws StatusError when `status` is not OK.
inline void ThrowIfError(const Status& status) {
  if (!status.ok()) throw StatusError(status);
}

// The value of `result`, or throws StatusError with its status.
template <typename T>
T ValueOrThrow(Result<T> result) {
  if (!result.ok()) throw StatusError(result.status());
  return std::move(result).value();
}

// Binds StatusCode, creates LarderError and its subclasses in `module`, and installs the
// StatusError translator. Call once, from the module initializer.
void RegisterErrors(py::module_& module);

// A new (not raised) exception object for a non-OK `status`, of the class of its code; None for
// OK. Batch calls return these in place of the failed items.
py::object ErrorObject(const Status& status);

}  // namespace larder::python
