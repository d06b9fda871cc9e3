// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "common/grpc_process.h"

#include <absl/synchronization/mutex.h>
#include <gtest/gtest.h>

namespace larder {
namespace {

// Two absl mutexes taken in one order, then in the other, by one thread: no deadlock can occur,
// but Abseil's deadlock detection (on in Debian's build) records a lock-order cycle and aborts the
// process. After PrepareGrpcRuntime it records nothing, so gRPC's own locks cost no graph update.
TEST(GrpcRuntimeTest, AbslDeadlockDetectionIsOff) {
  PrepareGrpcRuntime();
  PrepareGrpcRuntime();  // idempotent
  absl::Mutex a, b;
  {
    absl::MutexLock first(&a);
    absl::MutexLock second(&b);
  }
  {
    absl::MutexLock first(&b);
    absl::MutexLock second(&a);
  }
  SUCCEED();
}

}  // namespace
}  // namespace larder
