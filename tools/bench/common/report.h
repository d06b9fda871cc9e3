// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Output helpers for benchmarks: percentiles, a progress bar on stderr, aligned tables, and reading
// the counts in workers' JSON replies.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace larder::bench {

// The p-th percentile (0..100) of `samples` by nearest rank; 0 for no samples. Sorts in place.
double Percentile(std::vector<double>& samples, double p);

// Draws "\r<label> [#####.....] 42% <status()>" on stderr every 200 ms while alive, when stderr is
// a terminal or `force` is set. Thread-safe to construct and destroy from one thread.
class ProgressBar {
 public:
  ProgressBar(std::string label, std::chrono::milliseconds total,
              std::function<std::string()> status, bool enabled);
  ~ProgressBar();

 private:
  std::string label_;
  std::chrono::milliseconds total_;
  std::function<std::string()> status_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// One line on stderr saying what a bench does before its measurement starts ("starting a target
// process", "warming up ..."), so that its first seconds are not silent. Nothing unless enabled.
void Stage(bool enabled, std::string_view what);

// A table printed with columns padded to their widest cell.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string ToString() const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

// printf-style formatting of one double with `precision` decimals.
std::string Fixed(double value, int precision);

// The count `field` of a JSON object, or 0 when the field is absent or not a number (a worker's
// reply read leniently: a count it did not report is none).
uint64_t JsonU64(const nlohmann::json& object, const char* field);

}  // namespace larder::bench
