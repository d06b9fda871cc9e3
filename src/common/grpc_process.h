// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Process-wide settings for the gRPC runtime, applied once before this process opens its first
// channel or server.
#pragma once

namespace larder {

// Debian builds Abseil without NDEBUG, which leaves absl::Mutex's deadlock detection on: every
// lock that gRPC takes inside a call then records its lock order in a global graph (a few
// percent of a metadata call's CPU, and a global lock shared by every thread). Turns that
// detection off for this process; it is a debugging aid that no release build keeps. Idempotent
// and thread-safe; LARDER_ABSL_DEADLOCK_DETECTION=1 keeps it on (for debugging gRPC itself).
void PrepareGrpcRuntime();

}  // namespace larder
