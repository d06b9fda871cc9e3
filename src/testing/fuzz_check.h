// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// What a fuzz target asserts with: a broken invariant aborts, which libFuzzer reports as a crash
// with the input that caused it (an assert() would vanish from a release build). Header-only.
#pragma once

#include <cstdlib>

namespace larder::test {

inline void FuzzCheck(bool invariant) {
  if (!invariant) std::abort();
}

}  // namespace larder::test
