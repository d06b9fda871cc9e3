// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Logging through spdlog. The level comes from LARDER_LOG_LEVEL (trace, debug, info, warn, error,
// off; default info) the first time a logger is used.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace larder {

// The process-wide logger ("larder"), writing to stderr. Thread-safe.
spdlog::logger& Log();

// Overrides the level ("debug", "warn", ...). Unknown names leave it unchanged.
void SetLogLevel(const std::string& level);

// Logs `message` at warn level once per distinct `key` for the life of the process. Thread-safe.
void WarnOnce(const std::string& key, const std::string& message);

}  // namespace larder
