// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <mutex>
#include <unordered_set>

namespace larder {

spdlog::logger& Log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("larder");
    l->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %P %n] %v");
    l->set_level(spdlog::level::info);
    if (const char* env = std::getenv("LARDER_LOG_LEVEL"); env && *env) {
      l->set_level(spdlog::level::from_str(env));
    }
    return l;
  }();
  return *logger;
}

void SetLogLevel(const std::string& level) {
  auto parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off") return;
  Log().set_level(parsed);
}

void WarnOnce(const std::string& key, const std::string& message) {
  static std::mutex mu;
  static std::unordered_set<std::string> seen;
  {
    std::lock_guard lock(mu);
    if (!seen.insert(key).second) return;
  }
  Log().warn("{}", message);
}

}  // namespace larder
