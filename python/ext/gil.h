// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Every call into the store or the transfer engine (an RPC, a transfer, a wait) runs without the
// GIL, so other Python threads keep running meanwhile.
#pragma once

#include <pybind11/pybind11.h>

#include <utility>

namespace larder::python {

// Runs `fn` with the GIL released and returns its result. `fn` must not touch Python objects.
template <typename Fn>
auto WithoutGil(Fn&& fn) {
  pybind11::gil_scoped_release release;
  return std::forward<Fn>(fn)();
}

}  // namespace larder::python
