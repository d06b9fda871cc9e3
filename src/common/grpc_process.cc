// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "common/grpc_process.h"

#include <absl/synchronization/mutex.h>

#include <mutex>

#include "common/env.h"

namespace larder {

void PrepareGrpcRuntime() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (GetEnv("LARDER_ABSL_DEADLOCK_DETECTION") == "1") return;
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  });
}

}  // namespace larder
