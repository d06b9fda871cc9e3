// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The store demo behind `make run`: a master and three client processes on this host. Two
// "prefill" processes write KV pages, a "decode" process reads every page back and verifies it;
// the demo prints the route each read took and the bandwidth, then repeats with the store
// protocol forced to tcp to show what the NIC-style path costs.
#pragma once

#include <cstdint>
#include <ostream>

#include "larder/status.h"

namespace larder::bench {

struct StoreDemoOptions {
  uint64_t page_size = 256 * 1024;
  int pages_per_writer = 256;  // 64 MiB per writer with the default page size
  int batch = 32;
  int rounds = 3;  // read passes; the median is reported
};

// Fails when a page is missing or wrong, or when same-host reads do not take shm under auto.
Status RunStoreDemo(const StoreDemoOptions& options, std::ostream& out);

}  // namespace larder::bench
