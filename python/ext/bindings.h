// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The pieces of the _larder module, one function per concern; larder_module.cc calls them in
// order (errors first: the others raise them).
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "larder/transfer_engine.h"

namespace larder::python {

namespace py = pybind11;

// larder.Store over larder::StoreClient.
void BindStore(py::module_& module);
// larder.TransferEngine, MemoryRegion, SegmentDescriptor, TransferRequest, TransferResult.
void BindEngine(py::module_& module);
// parse_size, parse_duration, parse_protocol, resolve_protocol.
void BindHelpers(py::module_& module);

// Seconds (int or float) or a duration string ("500ms", "5s") as milliseconds.
// Throws larder.InvalidArgumentError for negative or unparsable values.
std::chrono::milliseconds ToMilliseconds(py::handle value, const char* what);
// Bytes as an int or a size string ("4gb", "512MiB"). Throws larder.InvalidArgumentError.
uint64_t ToByteSize(py::handle value, const char* what);
// "pd" (PD transfers: LARDER_PROTOCOL) or "store" (LARDER_STORE_PROTOCOL, then LARDER_PROTOCOL).
// "standalone", the earlier name of "pd", is read as "pd" with a DeprecationWarning.
// Throws larder.InvalidArgumentError for anything else.
EngineRole ToEngineRole(const std::string& role);

}  // namespace larder::python
