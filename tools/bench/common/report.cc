// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "bench/common/report.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>

namespace larder::bench {

double Percentile(std::vector<double>& samples, double p) {
  if (samples.empty()) return 0;
  p = std::clamp(p, 0.0, 100.0);
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(samples.size())));
  size_t index = rank == 0 ? 0 : rank - 1;
  std::nth_element(samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(index),
                   samples.end());
  return samples[index];
}

void Stage(bool enabled, std::string_view what) {
  if (enabled) std::cerr << "larder-bench: " << what << "\n" << std::flush;
}

ProgressBar::ProgressBar(std::string label, std::chrono::milliseconds total,
                         std::function<std::string()> status, bool enabled)
    : label_(std::move(label)), total_(total), status_(std::move(status)) {
  if (!enabled || total_.count() <= 1000) return;
  thread_ = std::thread([this] {
    auto start = std::chrono::steady_clock::now();
    while (!stop_.load()) {
      double done =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count() /
          static_cast<double>(total_.count());
      done = std::clamp(done, 0.0, 1.0);
      int filled = static_cast<int>(done * 30);
      std::string bar(static_cast<size_t>(filled), '#');
      bar.append(static_cast<size_t>(30 - filled), '.');
      std::fprintf(stderr, "\r%-28s [%s] %3d%% %s\033[K", label_.c_str(), bar.c_str(),
                   static_cast<int>(done * 100), status_ ? status_().c_str() : "");
      std::fflush(stderr);
      for (int i = 0; i < 4 && !stop_.load(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  });
}

ProgressBar::~ProgressBar() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

std::string Table::ToString() const {
  std::vector<size_t> widths;
  for (const auto& row : rows_) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  std::string out;
  for (size_t r = 0; r < rows_.size(); ++r) {
    for (size_t i = 0; i < rows_[r].size(); ++i) {
      std::string cell = rows_[r][i];
      // Numbers right-aligned, text left-aligned.
      bool numeric =
          !cell.empty() && (std::isdigit(static_cast<unsigned char>(cell[0])) || cell[0] == '-');
      std::string pad(widths[i] - cell.size(), ' ');
      out += numeric && r > 0 ? pad + cell : cell + pad;
      if (i + 1 < rows_[r].size()) out += "  ";
    }
    out += "\n";
    if (r == 0) {
      size_t total = 0;
      for (size_t w : widths) total += w + 2;
      out += std::string(total > 2 ? total - 2 : 0, '-') + "\n";
    }
  }
  return out;
}

std::string Fixed(double value, int precision) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", precision, value);
  return buf;
}

uint64_t JsonU64(const nlohmann::json& object, const char* field) {
  auto it = object.find(field);
  return it != object.end() && it->is_number() ? it->get<uint64_t>() : 0;
}

}  // namespace larder::bench
