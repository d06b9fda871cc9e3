// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The demo behind `make run`: a target process on this host, and this process moving data to and
// from its segment over shm (auto picks it) and over tcp (forced), plus the in-process local route.
#pragma once

#include <cstdint>
#include <ostream>

#include "larder/status.h"

namespace larder::bench {

struct DemoOptions {
  uint64_t transfer_bytes = 64ULL << 20;  // per direction and route
  int rounds = 8;                         // repetitions; the median round is reported
};

// Prints one line per (route, direction) with bandwidth and a verification verdict. Fails when a
// route other than the expected one is taken or any byte differs.
Status RunDemo(const DemoOptions& options, std::ostream& out);

}  // namespace larder::bench
