// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "bench/replay/replay_trace.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <random>
#include <tuple>
#include <unordered_set>

#include "common/env.h"

namespace larder::bench {

Result<std::vector<TraceRequest>> LoadTrace(const std::string& path, uint64_t max_requests) {
  std::ifstream in(path);
  if (!in) return NotFoundError("cannot open trace '" + path + "'");
  std::vector<TraceRequest> requests;
  std::unordered_set<uint64_t> seen;
  std::string line;
  for (uint64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto where = [&] { return path + ":" + std::to_string(number); };
    nlohmann::json object = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (object.is_discarded() || !object.is_object()) {
      return InvalidArgumentError(where() + ": not a JSON object");
    }
    auto ids = object.find("hash_ids");
    if (ids == object.end() || !ids->is_array()) {
      return InvalidArgumentError(where() + ": no \"hash_ids\" array");
    }
    TraceRequest request;
    if (auto timestamp = object.find("timestamp");
        timestamp != object.end() && timestamp->is_number()) {
      request.timestamp_ms = timestamp->get<int64_t>();
    }
    request.blocks.reserve(ids->size());
    seen.clear();
    for (const nlohmann::json& id : *ids) {
      if (!id.is_number_unsigned()) {
        return InvalidArgumentError(where() + ": block id " + id.dump() +
                                    " is not a non-negative integer");
      }
      uint64_t block = id.get<uint64_t>();
      // One batch put cannot carry a key twice, and a prefix chain never repeats a block.
      if (!seen.insert(block).second) {
        return InvalidArgumentError(where() + ": block " + std::to_string(block) +
                                    " appears twice in one request");
      }
      request.blocks.push_back(block);
    }
    requests.push_back(std::move(request));
  }
  if (in.bad()) return DataLossError("error reading trace '" + path + "'");
  std::stable_sort(
      requests.begin(), requests.end(),
      [](const TraceRequest& a, const TraceRequest& b) { return a.timestamp_ms < b.timestamp_ms; });
  if (max_requests != 0 && requests.size() > max_requests) requests.resize(max_requests);
  return requests;
}

std::string DefaultTracePath() {
  if (std::string path = GetEnv("LARDER_TRACE"); !path.empty()) return path;
  std::string fetched(kFetchedTracePath);
  std::error_code error;
  return std::filesystem::is_regular_file(fetched, error) ? fetched : "";
}

std::string BlockKey(uint64_t id) { return "blk/" + std::to_string(id); }

uint64_t CountBlockRefs(const std::vector<TraceRequest>& requests) {
  uint64_t refs = 0;
  for (const TraceRequest& request : requests) refs += request.blocks.size();
  return refs;
}

std::vector<TraceRequest> RepeatPrefixes(const std::vector<TraceRequest>& requests,
                                         size_t mean_distance) {
  uint64_t fresh = 0;  // block ids above every id of the trace
  for (const TraceRequest& request : requests) {
    for (uint64_t block : request.blocks) fresh = std::max(fresh, block + 1);
  }
  std::mt19937_64 rng(1);
  // Echoes waiting for their turn: (after which request, in which order made, echo), soonest
  // first.
  using Pending = std::tuple<size_t, size_t, TraceRequest>;
  auto later = [](const Pending& a, const Pending& b) {
    return std::tie(std::get<0>(a), std::get<1>(a)) > std::tie(std::get<0>(b), std::get<1>(b));
  };
  std::priority_queue<Pending, std::vector<Pending>, decltype(later)> pending(later);
  std::vector<TraceRequest> out;
  out.reserve(2 * requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    out.push_back(requests[i]);
    TraceRequest echo;
    const std::vector<uint64_t>& blocks = requests[i].blocks;
    echo.blocks.assign(blocks.begin(), blocks.end() - (blocks.empty() ? 0 : 1));
    echo.blocks.push_back(fresh++);
    size_t distance = 1 + static_cast<size_t>(rng() % (2 * mean_distance));
    pending.emplace(i + distance, i, std::move(echo));
    while (!pending.empty() && std::get<0>(pending.top()) <= i) {
      TraceRequest next = std::get<2>(pending.top());
      pending.pop();
      next.timestamp_ms = requests[i].timestamp_ms;
      out.push_back(std::move(next));
    }
  }
  while (!pending.empty()) {
    TraceRequest next = std::get<2>(pending.top());
    pending.pop();
    next.timestamp_ms = requests.back().timestamp_ms;
    out.push_back(std::move(next));
  }
  return out;
}

}  // namespace larder::bench
