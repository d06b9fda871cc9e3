// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Limits that more than one side of a protocol checks, each defined once.
#pragma once

#include <cstdint>

namespace larder {

// Keys (put items, ranges, lease ids) of one batch call. The master refuses a call with more; the
// store client and the daemon's protocol refuse them before anything is sent or allocated.
inline constexpr uint32_t kMaxBatchKeys = 65536;

// The largest region of a disk tier, and so the largest value a disk copy can have: holders refuse
// a larger region size, and the master refuses a holder's report of a larger (or empty) copy.
inline constexpr uint64_t kMaxDiskRegionBytes = 1ull << 30;

}  // namespace larder
