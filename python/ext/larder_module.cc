// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The _larder extension module. The package larder (python/larder/__init__.py) re-exports it;
// users import larder, never _larder.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <string>

#include "bindings.h"
#include "buffers.h"
#include "common/env.h"
#include "errors.h"
#include "larder/transfer_engine.h"
#include "larder/version.h"
#include "transfer/device/device_transport.h"
#include "value_buffer.h"

namespace larder::python {

std::chrono::milliseconds ToMilliseconds(py::handle value, const char* what) {
  if (py::isinstance<py::str>(value)) {
    return ValueOrThrow(ParseDuration(value.cast<std::string>()));
  }
  if (PyBool_Check(value.ptr()) || !(PyLong_Check(value.ptr()) || PyFloat_Check(value.ptr()))) {
    throw py::type_error(std::string(what) +
                         " must be seconds (int or float) or a string such "
                         "as '500ms'");
  }
  double seconds = value.cast<double>();
  if (!std::isfinite(seconds) || seconds < 0 || seconds > 1e9) {
    throw StatusError(InvalidArgumentError(std::string(what) + " must be between 0 and 1e9 s"));
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000)));
}

uint64_t ToByteSize(py::handle value, const char* what) {
  if (py::isinstance<py::str>(value)) {
    auto parsed = ParseByteSize(value.cast<std::string>(), /*allow_zero=*/true);
    if (!parsed.ok()) throw StatusError(parsed.status().WithContext(what));
    return *parsed;
  }
  return *OptionalSize(value, what);
}

EngineRole ToEngineRole(const std::string& role) {
  if (role == "pd") return EngineRole::kPd;
  if (role == "store") return EngineRole::kStore;
  if (role == "standalone") {
    if (PyErr_WarnEx(PyExc_DeprecationWarning, "role 'standalone' is now called 'pd'", 1) != 0) {
      throw py::error_already_set();
    }
    return EngineRole::kPd;
  }
  throw StatusError(InvalidArgumentError("role must be 'pd' or 'store', not '" + role + "'"));
}

void BindHelpers(py::module_& module) {
  module.def(
      "parse_size", [](py::handle text) { return ToByteSize(text, "size"); }, py::arg("text"),
      "Bytes in a size such as '4096', '64KiB', '4M', '4gb' (binary multiples, case-insensitive); "
      "ints pass through. Raises InvalidArgumentError.");
  module.def(
      "parse_duration",
      [](py::handle value) { return ToMilliseconds(value, "duration").count() / 1000.0; },
      py::arg("value"),
      "Seconds in a duration such as '250ms', '5s', '2m' (a bare number string is ms); numbers "
      "pass through as seconds. Raises InvalidArgumentError.");
  module.def(
      "parse_protocol",
      [](const std::string& protocol) {
        std::vector<std::string> names;
        for (RouteKind route : ValueOrThrow(ParseProtocol(protocol))) {
          names.emplace_back(RouteKindName(route));
        }
        return names;
      },
      py::arg("protocol"),
      "Routes a protocol string enables, in preference order ('auto' -> ['local', 'shm', "
      "'tcp']). Raises InvalidArgumentError for unknown names.");
  module.def(
      "resolve_protocol",
      [](const std::string& configured, const std::string& role) {
        return ResolveProtocol(ToEngineRole(role), configured);
      },
      py::arg("configured") = "", py::arg("role") = "pd",
      "The protocol an engine of ``role`` uses given ``configured`` (wins when non-empty) and "
      "the environment (LARDER_STORE_PROTOCOL, LARDER_PROTOCOL).");
  module.def(
      "set_current_device",
      [](int device) { ThrowIfError(transfer::DefaultDeviceBackend()->SetCurrentDevice(device)); },
      py::arg("device"),
      "Makes ``device`` the calling thread's current device in the build's device backend "
      "(cudaSetDevice, as torch.cuda.set_device does; the emulated backend's own notion where "
      "there is no CUDA). The device transport of an engine (a protocol naming 'device') "
      "initializes on the current device of the thread that first allocates or registers device "
      "memory. Raises FailedPreconditionError where the backend is unavailable.");
}

}  // namespace larder::python

PYBIND11_MODULE(_larder, module) {
  module.doc() = "Larder's C++ core (StoreClient, TransferEngine); import it as `larder`.";
  module.attr("__version__") = larder::Version();
  larder::python::RegisterErrors(module);
  larder::python::BindHelpers(module);
  larder::python::BindValueBuffer(module);
  larder::python::BindStore(module);
  larder::python::BindEngine(module);
}
