// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The master's state in Prometheus' text exposition format: what GET /metrics serves.
#pragma once

#include <string>

namespace larder::master {

class MasterState;

// Every metric (docs/operations.md lists them), per-client traffic when the master's options ask
// for it.
std::string RenderMetrics(const MasterState& state);

}  // namespace larder::master
