// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "common/env.h"

#include <sys/stat.h>

#include <sys/random.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>

namespace larder {

std::string GetEnv(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::string(value) : std::string();
}

Result<std::chrono::milliseconds> ParseDuration(std::string_view text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0 || digits > 12) {
    return InvalidArgumentError("bad duration '" + std::string(text) + "' (e.g. 500ms, 5s, 2m)");
  }
  int64_t value = std::stoll(std::string(text.substr(0, digits)));
  std::string_view unit = text.substr(digits);
  int64_t multiplier;
  if (unit.empty() || unit == "ms") {
    multiplier = 1;
  } else if (unit == "s") {
    multiplier = 1000;
  } else if (unit == "m") {
    multiplier = 60 * 1000;
  } else if (unit == "h") {
    multiplier = 3600 * 1000;
  } else {
    return InvalidArgumentError("bad duration unit in '" + std::string(text) +
                                "' (use ms, s, m or h)");
  }
  return std::chrono::milliseconds(value * multiplier);
}

Result<uint64_t> ParseByteSize(std::string_view text, bool allow_zero) {
  std::string s;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c))) s += static_cast<char>(std::tolower(c));
  }
  size_t digits = 0;
  while (digits < s.size() && std::isdigit(static_cast<unsigned char>(s[digits]))) ++digits;
  if (digits == 0) return InvalidArgumentError("bad size '" + std::string(text) + "'");
  std::string suffix = s.substr(digits);
  uint64_t multiplier = 1;
  if (suffix.empty() || suffix == "b") {
    multiplier = 1;
  } else if (suffix == "k" || suffix == "kb" || suffix == "kib") {
    multiplier = 1ULL << 10;
  } else if (suffix == "m" || suffix == "mb" || suffix == "mib") {
    multiplier = 1ULL << 20;
  } else if (suffix == "g" || suffix == "gb" || suffix == "gib") {
    multiplier = 1ULL << 30;
  } else if (suffix == "t" || suffix == "tb" || suffix == "tib") {
    multiplier = 1ULL << 40;
  } else {
    return InvalidArgumentError("bad size suffix in '" + std::string(text) +
                                "' (use K, M, G or T)");
  }
  uint64_t value = 0;
  for (size_t i = 0; i < digits; ++i) {
    uint64_t d = static_cast<uint64_t>(s[i] - '0');
    if (value > (UINT64_MAX - d) / 10) return InvalidArgumentError("size overflows: " + s);
    value = value * 10 + d;
  }
  if (value > UINT64_MAX / multiplier) return InvalidArgumentError("size overflows: " + s);
  value *= multiplier;
  if (value == 0 && !allow_zero) return InvalidArgumentError("size must be > 0: " + s);
  return value;
}

std::string FormatByteSize(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"T", "G", "M", "K"};
  static constexpr int kShifts[] = {40, 30, 20, 10};
  for (int i = 0; i < 4; ++i) {
    uint64_t unit = 1ULL << kShifts[i];
    if (bytes >= unit && bytes % unit == 0) return std::to_string(bytes / unit) + kUnits[i];
  }
  return std::to_string(bytes);
}

std::string FormatReadableBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 5) {
    bytes /= 1024;
    ++unit;
  }
  char text[64];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.1f %s", bytes, units[unit]);
  return text;
}

std::string FormatHex(uint64_t value) {
  char buf[24];
  snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(value));
  return buf;
}

std::string DefaultHostId() {
  std::string env = GetEnv("LARDER_HOST_ID");
  if (!env.empty()) return env;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (in && std::getline(in, id) && !id.empty()) {
    if (uint64_t netns = NetworkNamespaceId(); netns != 0) id += "-net" + std::to_string(netns);
    return id;
  }
  // No boot id (unusual container): a per-process random id keeps locality decisions safe, since
  // shm is then still confirmed by the handoff.
  static const std::string fallback = "unknown-" + std::to_string(RandomU64());
  return fallback;
}

uint64_t NetworkNamespaceId() {
  struct stat st {};
  if (stat("/proc/self/ns/net", &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

uint64_t RandomU64() {
  uint64_t value = 0;
  if (getrandom(&value, sizeof(value), 0) == sizeof(value)) return value;
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return rng();
}

}  // namespace larder
