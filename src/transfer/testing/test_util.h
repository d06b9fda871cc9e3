// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Small helpers shared by the transfer tests: reproducible byte patterns and scoped environment
// variables. Header-only and free of GoogleTest so that any test binary can include it.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <ostream>
#include <string>
#include <thread>

#include "larder/transfer_engine.h"
#include "testing/wait.h"

namespace larder::testutil {

// Fills `size` bytes with a pseudo-random stream determined by `seed` (splitmix64). Different
// seeds give unrelated streams, so a buffer filled with one seed never matches another by chance.
inline void FillPattern(void* data, size_t size, uint64_t seed) {
  auto* out = static_cast<uint8_t*>(data);
  uint64_t state = seed * 0x9e3779b97f4a7c15ULL + 1;
  auto next = [&state] {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t word = next();
    std::memcpy(out + i, &word, 8);
  }
  if (i < size) {
    uint64_t word = next();
    std::memcpy(out + i, &word, size - i);
  }
}

// Sets (or, with nullopt, unsets) an environment variable for the life of the object and restores
// the previous state afterwards, so tests never leak configuration into each other.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) previous_ = old;
    if (value) {
      setenv(name, value->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (previous_) {
      setenv(name_.c_str(), previous_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> previous_;
};

using larder::test::WaitUntil;

}  // namespace larder::testutil

namespace larder {

// Lets GoogleTest print a route by its name (found by argument-dependent lookup).
inline void PrintTo(const RouteKind& route, std::ostream* os) { *os << route.name(); }

}  // namespace larder
