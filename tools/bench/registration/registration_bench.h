// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// `larder-bench registration`: what registration coverage saves. Registers many buffers through
// RegistrationCoverage on the emulated device (2 MiB native granularity, overlapping native
// registrations rejected), deregisters them, and repeats; compares with registering each buffer's
// whole aligned range natively every time (what a transport without coverage does, and what the
// native layer rejects as soon as two aligned ranges overlap).
#pragma once

#include <cstdint>
#include <string>

#include "larder/status.h"

namespace larder::bench {

struct RegistrationBenchOptions {
  uint64_t buffers = 1000;
  uint64_t buffer_size = 3ULL << 20;
  bool adjacent = true;  // one allocation, buffers back to back; else one allocation each
  uint64_t rounds = 3;
};

struct RegistrationBenchResult {
  uint64_t logical_registrations = 0;  // Register calls made (buffers x rounds)
  uint64_t native_calls = 0;           // native registrations made through coverage
  uint64_t native_bytes = 0;
  uint64_t native_calls_after_first_round = 0;
  uint64_t naive_native_calls = 0;   // one native call per logical registration
  uint64_t naive_native_bytes = 0;   // each buffer's aligned range, every round
  uint64_t aligned_union_bytes = 0;  // bytes of the union of the buffers' aligned ranges
  uint64_t rounds = 0;
  double seconds = 0;

  std::string ToJson() const;
};

Result<RegistrationBenchResult> RunRegistrationBench(const RegistrationBenchOptions& options);

}  // namespace larder::bench
