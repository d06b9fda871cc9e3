// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "bench/replay/replay_worker.h"

#include "bench/common/json_commands.h"

#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "bench/replay/replay_trace.h"
#include "bench/store/store_worker.h"
#include "common/child_process.h"
#include "larder/store_client.h"
#include "testing/values.h"

namespace larder::bench {
namespace {

// Rounds of retries of Unavailable gets: the first at once, then after 2, 4, ... 64 ms.
constexpr int kRetryRounds = 7;

using json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

class ReplayWorker {
 public:
  ReplayWorker(std::unique_ptr<StoreClient> client, uint64_t page_size)
      : client_(std::move(client)), page_size_(page_size) {}
  ~ReplayWorker() {
    if (!buffer_.empty()) client_->UnregisterBuffer(buffer_.data()).IgnoreError();
  }

  json Serve(const std::vector<uint64_t>& blocks) {
    Reply reply;
    std::vector<std::string> keys;
    keys.reserve(blocks.size());
    for (uint64_t block : blocks) keys.push_back(BlockKey(block));
    Status buffer_status = EnsureBuffer(blocks.size());
    if (!buffer_status.ok()) {
      reply.Error(buffer_status, blocks.size());
      return reply.ToJson();
    }
    std::vector<void*> slots(blocks.size());
    std::vector<size_t> sizes(blocks.size(), page_size_);
    for (size_t i = 0; i < blocks.size(); ++i) slots[i] = buffer_.data() + i * page_size_;

    auto start = SteadyClock::now();
    size_t exist = 0;
    for (const Result<bool>& result : client_->BatchExist(keys)) {
      if (!result.ok()) {
        reply.Error(result.status(), 1);
        break;
      }
      if (!*result) break;
      ++exist;
    }
    reply.exist = exist;

    if (exist > 0) {
      auto results =
          client_->BatchGetInto(std::span(keys).first(exist), std::span(slots).first(exist),
                                std::span(sizes).first(exist));
      RetryUnavailable(keys, slots, sizes, results, reply);
      // Hits are the leading blocks fetched intact; any failure ends the usable prefix.
      bool prefix_intact = true;
      for (size_t i = 0; i < results.size(); ++i) {
        bool intact = false;
        if (results[i].ok()) {
          auto bytes = std::span(static_cast<const std::byte*>(slots[i]), *results[i]);
          uint64_t wrong = CountWrongBytes(keys[i], bytes);
          intact = wrong == 0;
          if (!intact) {
            reply.wrong_bytes += wrong;
            reply.Note("wrong bytes in block '" + keys[i] + "'");
          }
        } else if (results[i].status().code() == StatusCode::kNotFound) {
          ++reply.missing;  // evicted between exist and get
        } else {
          reply.Error(results[i].status(), 1);
        }
        prefix_intact = prefix_intact && intact;
        if (prefix_intact) ++reply.hits;
      }
    }

    size_t first_computed = reply.hits;
    if (first_computed < blocks.size()) {
      auto stop = SteadyClock::now();  // filling is the "prefill", not a store call
      for (size_t i = first_computed; i < blocks.size(); ++i) {
        test::FillValue(keys[i], std::span(static_cast<std::byte*>(slots[i]), page_size_));
      }
      auto resume = SteadyClock::now();
      start += resume - stop;
      std::vector<Status> statuses = client_->BatchPutFrom(
          std::span(keys).subspan(first_computed), std::span(slots).subspan(first_computed),
          std::span(sizes).subspan(first_computed));
      for (const Status& status : statuses) {
        if (status.ok()) {
          ++reply.computed;
        } else {
          reply.Error(status, 1);
        }
      }
    }
    reply.ms = std::chrono::duration<double, std::milli>(SteadyClock::now() - start).count();
    return reply.ToJson();
  }

 private:
  struct Reply {
    uint64_t hits = 0, exist = 0, computed = 0, missing = 0, retried = 0, errors = 0,
             wrong_bytes = 0;
    double ms = 0;
    std::string first_error;
    std::string retry_reason;  // the first Unavailable retried

    void Error(const Status& status, uint64_t count) {
      errors += count;
      Note(status.ToString());
    }
    void Note(const std::string& what) {
      if (first_error.empty()) first_error = what;
    }
    json ToJson() const {
      json out = {{"hits", hits},
                  {"exist", exist},
                  {"computed", computed},
                  {"missing", missing},
                  {"retried", retried},
                  {"errors", errors},
                  {"wrong_bytes", wrong_bytes},
                  {"ms", ms}};
      if (!first_error.empty()) out["first_error"] = first_error;
      if (!retry_reason.empty()) out["retry_reason"] = retry_reason;
      return out;
    }
  };

  // Unavailable means "retry the call" (StoreClient's contract): a lease that ran out during the
  // copy, an object another client is still writing. Retries what failed that way, in one batch a
  // round, backing off to about 130 ms in all: longer than any one put takes.
  void RetryUnavailable(const std::vector<std::string>& keys, const std::vector<void*>& slots,
                        const std::vector<size_t>& sizes, std::vector<Result<size_t>>& results,
                        Reply& reply) {
    auto backoff = std::chrono::milliseconds(1);  // doubled before its first use
    for (int round = 0; round < kRetryRounds; ++round, backoff *= 2) {
      std::vector<size_t> again;
      for (size_t i = 0; i < results.size(); ++i) {
        if (results[i].status().code() == StatusCode::kUnavailable) again.push_back(i);
      }
      if (again.empty()) return;
      std::vector<std::string> retry_keys;
      std::vector<void*> retry_slots;
      std::vector<size_t> retry_sizes;
      for (size_t i : again) {
        retry_keys.push_back(keys[i]);
        retry_slots.push_back(slots[i]);
        retry_sizes.push_back(sizes[i]);
      }
      if (round == 0) reply.retried += again.size();
      if (reply.retry_reason.empty()) reply.retry_reason = results[again[0]].status().ToString();
      if (round > 0) std::this_thread::sleep_for(backoff);
      auto retried = client_->BatchGetInto(retry_keys, retry_slots, retry_sizes);
      for (size_t j = 0; j < again.size(); ++j) results[again[j]] = std::move(retried[j]);
    }
  }

  Status EnsureBuffer(size_t blocks) {
    size_t bytes = std::max<size_t>(blocks, 1) * page_size_;
    if (buffer_.size() >= bytes) return Status::Ok();
    if (!buffer_.empty()) client_->UnregisterBuffer(buffer_.data()).IgnoreError();
    buffer_.assign(bytes, std::byte{0});
    Status status = client_->RegisterBuffer(buffer_.data(), buffer_.size());
    if (!status.ok()) buffer_.clear();
    return status;
  }

  // 0 when `value` is the intact page of `key`; else the bytes that differ from it (a size
  // mismatch counts every byte past the shorter of the two).
  uint64_t CountWrongBytes(const std::string& key, std::span<const std::byte> value) {
    if (value.size() == page_size_ && test::VerifyValue(key, value)) return 0;
    expected_.resize(page_size_);
    test::FillValue(key, expected_);
    size_t common = std::min<size_t>(value.size(), expected_.size());
    uint64_t wrong = std::max(value.size(), expected_.size()) - common;
    for (size_t i = 0; i < common; ++i) wrong += value[i] != expected_[i] ? 1 : 0;
    return std::max<uint64_t>(wrong, 1);  // it failed verification, so something is wrong
  }

  std::unique_ptr<StoreClient> client_;
  const uint64_t page_size_;
  std::vector<std::byte> buffer_;  // registered with the client
  std::vector<std::byte> expected_;
};

}  // namespace

int RunReplayWorker(const ReplayWorkerOptions& options) {
  if (options.page_size == 0) {
    std::cerr << "replay-worker: --page-size must be positive\n";
    return 2;
  }
  StoreWorkerOptions client_options;
  client_options.master = options.master;
  client_options.protocol = options.protocol;
  client_options.segment_size = options.segment_size;
  client_options.segment_name = options.segment_name;
  client_options.device = options.device;
  auto client = CreateWorkerClient(client_options);
  if (!client.ok()) {
    std::cerr << "replay-worker: " << client.status() << "\n";
    return 1;
  }
  std::string segment_name = (*client)->segment_name();
  ReplayWorker worker(std::move(*client), options.page_size);
  AnnounceReady(segment_name);
  ServeJsonCommands([&worker](const json& command) -> json {
    auto blocks = command.find("blocks");
    if (blocks == command.end() || !blocks->is_array()) {
      return {{"error", "expected {\"blocks\":[...]}"}};
    }
    return worker.Serve(blocks->get<std::vector<uint64_t>>());
  });
  return 0;
}

}  // namespace larder::bench
