// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "bench/registration/registration_bench.h"

#include <chrono>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "transfer/device/emulated_device.h"
#include "transfer/registration_coverage.h"

namespace larder::bench {

std::string RegistrationBenchResult::ToJson() const {
  nlohmann::json j = {{"logical_registrations", logical_registrations},
                      {"native_calls", native_calls},
                      {"native_bytes", native_bytes},
                      {"native_calls_after_first_round", native_calls_after_first_round},
                      {"naive_native_calls", naive_native_calls},
                      {"naive_native_bytes", naive_native_bytes},
                      {"aligned_union_bytes", aligned_union_bytes},
                      {"rounds", rounds},
                      {"seconds", seconds}};
  return j.dump();
}

Result<RegistrationBenchResult> RunRegistrationBench(const RegistrationBenchOptions& o) {
  if (o.buffers == 0 || o.buffer_size == 0 || o.rounds == 0) {
    return InvalidArgumentError("--buffers, --buffer-size and --rounds must be > 0");
  }
  transfer::EmulatedDevice device;
  LARDER_RETURN_IF_ERROR(device.SetCurrentDevice(0));
  LARDER_RETURN_IF_ERROR(device.Init());
  const uint64_t g = device.registration_granularity();

  std::vector<void*> allocations;
  std::vector<uint64_t> buffers;
  if (o.adjacent) {
    LARDER_ASSIGN_OR_RETURN(void* base, device.Allocate(o.buffers * o.buffer_size));
    allocations.push_back(base);
    for (uint64_t i = 0; i < o.buffers; ++i) {
      buffers.push_back(reinterpret_cast<uint64_t>(base) + i * o.buffer_size);
    }
  } else {
    for (uint64_t i = 0; i < o.buffers; ++i) {
      LARDER_ASSIGN_OR_RETURN(void* p, device.Allocate(o.buffer_size));
      allocations.push_back(p);
      buffers.push_back(reinterpret_cast<uint64_t>(p));
    }
  }

  RegistrationBenchResult r;
  r.rounds = o.rounds;
  std::set<uint64_t> granules;  // the aligned union, granule by granule
  for (uint64_t b : buffers) {
    uint64_t begin = transfer::AlignDown(b, g), end = transfer::AlignUp(b + o.buffer_size, g);
    r.naive_native_bytes += (end - begin) * o.rounds;
    for (uint64_t p = begin; p < end; p += g) granules.insert(p);
  }
  r.aligned_union_bytes = granules.size() * g;
  r.naive_native_calls = o.buffers * o.rounds;

  transfer::RegistrationCoverage coverage(g);
  auto native = [&](uint64_t begin, uint64_t length) { return device.Register(begin, length); };
  auto start = std::chrono::steady_clock::now();
  for (uint64_t round = 0; round < o.rounds; ++round) {
    for (uint64_t b : buffers) {
      LARDER_RETURN_IF_ERROR(coverage.Register(b, o.buffer_size, native));
      ++r.logical_registrations;
    }
    for (uint64_t b : buffers) LARDER_RETURN_IF_ERROR(coverage.Deregister(b));
    if (round == 0) r.native_calls_after_first_round = coverage.native_calls();
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.native_calls = coverage.native_calls();
  r.native_bytes = coverage.native_bytes();
  r.native_calls_after_first_round = r.native_calls - r.native_calls_after_first_round;
  if (device.register_calls() != r.native_calls) {
    return InternalError("coverage counted " + std::to_string(r.native_calls) +
                         " native calls but the device saw " +
                         std::to_string(device.register_calls()));
  }
  for (void* p : allocations) device.Free(p).IgnoreError();
  return r;
}

}  // namespace larder::bench
