// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "errors.h"

#include <array>

namespace larder::python {
namespace {

constexpr int kCodeCount = 17;

struct ErrorClass {
  StatusCode code;
  const char* name;
  // A builtin exception the class also derives from, so that generic handlers catch it
  // (`except ValueError` catches InvalidArgumentError); nullptr for none.
  PyObject* (*extra_base)();
  const char* doc;
};

PyObject* NoBase() { return nullptr; }
PyObject* ValueErrorBase() { return PyExc_ValueError; }
PyObject* LookupErrorBase() { return PyExc_LookupError; }
PyObject* TimeoutErrorBase() { return PyExc_TimeoutError; }
PyObject* NotImplementedErrorBase() { return PyExc_NotImplementedError; }

const std::array<ErrorClass, kCodeCount - 1> kErrorClasses = {{
    {StatusCode::kCancelled, "CancelledError", NoBase, "The operation was cancelled."},
    {StatusCode::kUnknown, "UnknownError", NoBase, "An error with no better code."},
    {StatusCode::kInvalidArgument, "InvalidArgumentError", ValueErrorBase,
     "A bad argument (empty key, bad size, mismatched batch lengths...). Fix the request."},
    {StatusCode::kDeadlineExceeded, "DeadlineExceededError", TimeoutErrorBase,
     "The deadline passed; the work may or may not have happened."},
    {StatusCode::kNotFound, "NotFoundError", LookupErrorBase,
     "No such key, segment or registration."},
    {StatusCode::kAlreadyExists, "AlreadyExistsError", NoBase,
     "The name or registration already exists."},
    {StatusCode::kPermissionDenied, "PermissionDeniedError", NoBase,
     "Refused: wrong auth token or uid policy."},
    {StatusCode::kResourceExhausted, "ResourceExhaustedError", NoBase,
     "No space left in the pool (and nothing evictable), or memory is short."},
    {StatusCode::kFailedPrecondition, "FailedPreconditionError", NoBase,
     "The system is not in a state that allows the call (e.g. buffer not registered, store "
     "closed). Do not retry until that changes."},
    {StatusCode::kAborted, "AbortedError", NoBase,
     "A concurrent change invalidated the operation; retry the whole operation."},
    {StatusCode::kOutOfRange, "OutOfRangeError", ValueErrorBase,
     "An offset or length outside a segment."},
    {StatusCode::kUnimplemented, "UnimplementedError", NotImplementedErrorBase,
     "Not supported here."},
    {StatusCode::kInternal, "InternalError", NoBase, "A bug or a broken invariant."},
    {StatusCode::kUnavailable, "UnavailableError", NoBase,
     "Master or peer unreachable, object being written, or lease expired; retry the call."},
    {StatusCode::kDataLoss, "DataLossError", NoBase, "Data was lost or corrupted."},
    {StatusCode::kUnauthenticated, "UnauthenticatedError", NoBase,
     "No valid proof of the cluster token (LARDER_AUTH_TOKEN missing or wrong)."},
}};

// Indexed by StatusCode; owned references held for the life of the process.
std::array<PyObject*, kCodeCount> error_types{};

PyObject* TypeFor(StatusCode code) {
  int index = static_cast<int>(code);
  if (index <= 0 || index >= kCodeCount || error_types[index] == nullptr) {
    return error_types[static_cast<int>(StatusCode::kUnknown)];
  }
  return error_types[index];
}

}  // namespace

void RegisterErrors(py::module_& module) {
  py::enum_<StatusCode>(module, "StatusCode",
                        "Canonical status codes (abseil's set); LarderError.code holds one.")
      .value("OK", StatusCode::kOk)
      .value("CANCELLED", StatusCode::kCancelled)
      .value("UNKNOWN", StatusCode::kUnknown)
      .value("INVALID_ARGUMENT", StatusCode::kInvalidArgument)
      .value("DEADLINE_EXCEEDED", StatusCode::kDeadlineExceeded)
      .value("NOT_FOUND", StatusCode::kNotFound)
      .value("ALREADY_EXISTS", StatusCode::kAlreadyExists)
      .value("PERMISSION_DENIED", StatusCode::kPermissionDenied)
      .value("RESOURCE_EXHAUSTED", StatusCode::kResourceExhausted)
      .value("FAILED_PRECONDITION", StatusCode::kFailedPrecondition)
      .value("ABORTED", StatusCode::kAborted)
      .value("OUT_OF_RANGE", StatusCode::kOutOfRange)
      .value("UNIMPLEMENTED", StatusCode::kUnimplemented)
      .value("INTERNAL", StatusCode::kInternal)
      .value("UNAVAILABLE", StatusCode::kUnavailable)
      .value("DATA_LOSS", StatusCode::kDataLoss)
      .value("UNAUTHENTICATED", StatusCode::kUnauthenticated);

  // The classes are named "larder.X": the package re-exports them, and that is where users see
  // them in tracebacks.
  PyObject* base = PyErr_NewExceptionWithDoc(
      "larder.LarderError",
      "Base class of every Larder error. Attributes: code (StatusCode), message (str), detail "
      "(str: 'None', or what the error means to a caller that acts on it: 'RemountRequired', "
      "'LeaseExpired', 'BeingWritten', 'Leased', 'Rebuilding').",
      PyExc_Exception, nullptr);
  if (base == nullptr) throw py::error_already_set();
  module.add_object("LarderError", py::reinterpret_borrow<py::object>(base));
  for (const ErrorClass& error : kErrorClasses) {
    PyObject* extra = error.extra_base();
    py::tuple bases = extra == nullptr ? py::make_tuple(py::handle(base))
                                       : py::make_tuple(py::handle(base), py::handle(extra));
    py::dict namespace_dict;
    namespace_dict["code"] = py::cast(error.code);
    std::string qualified = std::string("larder.") + error.name;
    PyObject* type =
        PyErr_NewExceptionWithDoc(qualified.c_str(), error.doc, bases.ptr(), namespace_dict.ptr());
    if (type == nullptr) throw py::error_already_set();
    error_types[static_cast<int>(error.code)] = type;
    module.add_object(error.name, py::reinterpret_borrow<py::object>(type));
  }
  error_types[0] = base;

  py::register_exception_translator([](std::exception_ptr exception) {
    try {
      if (exception) std::rethrow_exception(exception);
    } catch (const StatusError& error) {
      py::object value = ErrorObject(error.status());
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(value.ptr())), value.ptr());
    }
  });
}

py::object ErrorObject(const Status& status) {
  if (status.ok()) return py::none();
  // Messages quote keys, which need not be UTF-8.
  const std::string& text = status.message();
  PyObject* decoded =
      PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "replace");
  if (decoded == nullptr) throw py::error_already_set();
  py::str message = py::reinterpret_steal<py::str>(decoded);
  py::object type = py::reinterpret_borrow<py::object>(TypeFor(status.code()));
  py::object value = type(message);
  value.attr("code") = py::cast(status.code());
  value.attr("message") = message;
  value.attr("detail") = py::str(std::string(ErrorDetailName(status.detail())));
  return value;
}

}  // namespace larder::python
