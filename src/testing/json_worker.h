// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Talking to a benchmark worker process (`larder-bench store-worker` and the like), which reads
// one JSON command per line and answers each with one JSON object per line.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>

#include "common/child_process.h"
#include "larder/status.h"

namespace larder::test {

// Writes `command` to `worker`, waits up to `timeout` for its reply, and returns it without its
// "lat_us" latency array (which would drown failure messages). Errors: the write's or read's
// (Unavailable: the worker exited; DeadlineExceeded), InvalidArgument naming the line when the
// reply is not a JSON object. A reply carrying "error" is returned as it is.
Result<nlohmann::json> Exchange(ChildProcess& worker, const nlohmann::json& command,
                                std::chrono::milliseconds timeout);

}  // namespace larder::test
