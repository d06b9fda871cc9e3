// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Waiting on a condition with a deadline: what tests and benches do instead of sleeping for a
// fixed time.
#pragma once

#include <chrono>
#include <thread>

namespace larder::test {

// Waits until `done()` holds or `timeout` passes, checking it every few milliseconds (for
// conditions no event announces, such as another thread's or process's progress). Returns done().
template <typename Pred>
bool WaitUntil(Pred done, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return done();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace larder::test
