// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "common/logging.h"
#include "common/mutex.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cctype>
#include <cstdlib>
#include <unordered_set>

namespace larder {
namespace {

// Sets the level named `name` (any case; "warning" too). False, leaving it unchanged, otherwise.
bool ApplyLevel(spdlog::logger& logger, std::string name) {
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  auto parsed = spdlog::level::from_str(name);
  if (parsed == spdlog::level::off && name != "off") return false;
  logger.set_level(parsed);
  return true;
}

}  // namespace

spdlog::logger& Log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("larder");
    l->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %P %n] %v");
    l->set_level(spdlog::level::info);
    if (const char* env = std::getenv("LARDER_LOG_LEVEL"); env && *env) {
      if (!ApplyLevel(*l, env)) {
        l->warn(
            "LARDER_LOG_LEVEL='{}' is not a level (trace, debug, info, warn, error, off); using "
            "info",
            env);
      }
    }
    return l;
  }();
  return *logger;
}

void SetLogLevel(const std::string& level) { ApplyLevel(Log(), level); }

void WarnOnce(const std::string& key, const std::string& message) {
  static Mutex mu;
  static std::unordered_set<std::string> seen;
  {
    MutexLock lock(mu);
    if (!seen.insert(key).second) return;
  }
  Log().warn("{}", message);
}

}  // namespace larder
