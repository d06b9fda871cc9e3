// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "bench/soak/soak_load.h"

#include <algorithm>

#include "bench/failover/failover_probe.h"
#include "testing/values.h"

namespace larder::bench {

using json = nlohmann::json;

Result<SoakLoadOptions> SoakLoadOptions::FromJson(const json& command) {
  SoakLoadOptions options;
  options.prefix = command.value("prefix", options.prefix);
  options.min_value = command.value("min_value", options.min_value);
  options.max_value = command.value("max_value", options.max_value);
  options.batch = command.value("batch", options.batch);
  options.get_share = command.value("get_share", options.get_share);
  options.remove_share = command.value("remove_share", options.remove_share);
  options.interval =
      std::chrono::microseconds(command.value("interval_us", int64_t{options.interval.count()}));
  options.seed = command.value("seed", options.seed);
  options.recent = command.value("recent", options.recent);
  if (options.prefix.empty() || options.batch == 0 || options.batch > 1024 ||
      options.min_value == 0 || options.min_value > options.max_value ||
      options.max_value > (64ull << 20)) {
    return InvalidArgumentError(
        "soak: needs a prefix, a batch of 1..1024 keys and value sizes 0 < min <= max <= 64 MiB");
  }
  if (options.get_share < 0 || options.remove_share < 0 ||
      options.get_share + options.remove_share > 1) {
    return InvalidArgumentError("soak: get_share and remove_share must be shares that sum to <= 1");
  }
  return options;
}

uint64_t SoakLoadOptions::ValueSize(const std::string& key) const {
  return min_value + test::KeyHash(key) % (max_value - min_value + 1);
}

Result<std::unique_ptr<SoakLoad>> SoakLoad::Start(StoreClient* client, SoakLoadOptions options) {
  std::unique_ptr<SoakLoad> load(new SoakLoad(client, std::move(options)));
  LARDER_RETURN_IF_ERROR(client->RegisterBuffer(load->buffer_.data(), load->buffer_.size()));
  load->thread_ = std::thread([raw = load.get()] { raw->Loop(); });
  return load;
}

SoakLoad::SoakLoad(StoreClient* client, SoakLoadOptions options)
    : client_(client),
      options_(std::move(options)),
      buffer_(options_.batch * options_.max_value, std::byte{0}),
      rng_(options_.seed ^ test::KeyHash(options_.prefix)),
      counts_({{"ops", 0},
               {"puts", 0},
               {"gets", 0},
               {"removes", 0},
               {"missing", 0},
               {"busy", 0},
               {"wrong_keys", 0},
               {"wrong_bytes", 0},
               {"errors", json::object()}}),
      failures_(json::array()) {}

SoakLoad::~SoakLoad() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  client_->UnregisterBuffer(buffer_.data()).IgnoreError();
}

void SoakLoad::SetPeers(std::map<std::string, uint64_t> peers) {
  std::lock_guard lock(mu_);
  peers_ = std::move(peers);
}

json SoakLoad::Status() {
  std::lock_guard lock(mu_);
  json out = counts_;
  out["next"] = next_.load();
  out["failures"] = std::exchange(failures_, json::array());
  out["failures_dropped"] = std::exchange(failures_dropped_, 0);
  out["now_ns"] = FailoverProbe::NowNs();
  return out;
}

void SoakLoad::Loop() {
  std::uniform_real_distribution<double> share(0, 1);
  while (!stop_) {
    double pick = share(rng_);
    if (pick < options_.get_share) {
      Get();
    } else if (pick < options_.get_share + options_.remove_share) {
      Remove();
    } else {
      Put();
    }
    if (options_.interval.count() > 0) std::this_thread::sleep_for(options_.interval);
  }
}

void SoakLoad::Fail(const char* op, std::string code, uint32_t keys, const std::string& message,
                    int64_t started_ns) {
  // REQUIRES: mu_ held.
  std::string kind = std::string(op) + ":" + code;
  counts_["errors"][kind] = counts_["errors"].value(kind, uint64_t{0}) + keys;
  const int64_t now = FailoverProbe::NowNs();
  // Failures of one kind in a row within kFailureSpanNs are one entry, from its first to its last.
  if (!failures_.empty()) {
    json& last = failures_.back();
    if (last["op"] == op && last["code"] == code &&
        now - last["t0_ns"].get<int64_t>() < kFailureSpanNs) {
      last["keys"] = last["keys"].get<uint64_t>() + keys;
      last["t_ns"] = now;
      return;
    }
  }
  if (failures_.size() >= kMaxFailures) {
    ++failures_dropped_;
    return;
  }
  failures_.push_back({{"t0_ns", started_ns},
                       {"t_ns", now},
                       {"op", op},
                       {"code", std::move(code)},
                       {"keys", keys},
                       {"message", message}});
}

namespace {
// Failures of one batch by code: keys and the first message.
struct BatchFailures {
  std::map<std::string, std::pair<uint32_t, std::string>> by_code;
  void Add(const larder::Status& status) {
    auto& entry = by_code[std::string(StatusCodeName(status.code()))];
    if (entry.first++ == 0) entry.second = status.ToString();
  }
};
}  // namespace

void SoakLoad::Put() {
  std::vector<std::string> names;
  std::vector<void*> ptrs;
  std::vector<size_t> sizes;
  for (size_t j = 0; j < options_.batch; ++j) {
    names.push_back(options_.prefix + std::to_string(next_.load() + j));
    std::byte* slot = buffer_.data() + j * options_.max_value;
    sizes.push_back(options_.ValueSize(names.back()));
    test::FillValue(names.back(), std::span(slot, sizes.back()));
    ptrs.push_back(slot);
  }
  const int64_t started_ns = FailoverProbe::NowNs();
  std::vector<larder::Status> results = client_->BatchPutFrom(names, ptrs, sizes);
  // Failed keys are skipped too: every key is put at most once, so a reader never sees two values.
  next_ += names.size();
  uint64_t ok = 0;
  BatchFailures failed;
  for (const larder::Status& status : results) {
    if (status.ok()) {
      ++ok;
    } else {
      failed.Add(status);
    }
  }
  std::lock_guard lock(mu_);
  counts_["ops"] = counts_["ops"].get<uint64_t>() + names.size();
  counts_["puts"] = counts_["puts"].get<uint64_t>() + ok;
  for (const auto& [code, entry] : failed.by_code)
    Fail("put", code, entry.first, entry.second, started_ns);
}

void SoakLoad::Get() {
  // A random source among this worker and its peers, then random keys it has put.
  std::vector<std::pair<std::string, uint64_t>> sources;
  {
    std::lock_guard lock(mu_);
    for (const auto& [prefix, next] : peers_) {
      if (next > 0) sources.emplace_back(prefix, next);
    }
  }
  if (next_.load() > 0) sources.emplace_back(options_.prefix, next_.load());
  if (sources.empty()) return;
  const auto& [prefix, count] = sources[rng_() % sources.size()];
  std::vector<std::string> names;
  std::vector<void*> ptrs;
  std::vector<size_t> capacities;
  for (size_t j = 0; j < options_.batch; ++j) {
    const uint64_t window = options_.recent == 0 ? count : std::min(count, options_.recent);
    names.push_back(prefix + std::to_string(count - 1 - rng_() % window));
    ptrs.push_back(buffer_.data() + j * options_.max_value);
    capacities.push_back(options_.max_value);
  }
  const int64_t started_ns = FailoverProbe::NowNs();
  std::vector<Result<size_t>> results = client_->BatchGetInto(names, ptrs, capacities);
  uint64_t ok = 0, missing = 0, wrong_keys = 0, wrong_bytes = 0;
  std::string first_wrong;
  BatchFailures failed;
  for (size_t j = 0; j < results.size(); ++j) {
    if (!results[j].ok()) {
      if (results[j].status().code() == StatusCode::kNotFound) {
        ++missing;
      } else {
        failed.Add(results[j].status());
      }
      continue;
    }
    const size_t size = *results[j];
    if (size == options_.ValueSize(names[j]) &&
        test::VerifyValue(names[j], std::span(static_cast<const std::byte*>(ptrs[j]), size))) {
      ++ok;
      continue;
    }
    ++wrong_keys;
    wrong_bytes += size;
    if (first_wrong.empty()) {
      first_wrong = "wrong bytes for key '" + names[j] + "' (" + std::to_string(size) +
                    " bytes read, " + std::to_string(options_.ValueSize(names[j])) + " stored)";
    }
  }
  std::lock_guard lock(mu_);
  counts_["ops"] = counts_["ops"].get<uint64_t>() + names.size();
  counts_["gets"] = counts_["gets"].get<uint64_t>() + ok;
  counts_["missing"] = counts_["missing"].get<uint64_t>() + missing;
  counts_["wrong_keys"] = counts_["wrong_keys"].get<uint64_t>() + wrong_keys;
  counts_["wrong_bytes"] = counts_["wrong_bytes"].get<uint64_t>() + wrong_bytes;
  if (wrong_keys > 0)
    Fail("get", "wrong", static_cast<uint32_t>(wrong_keys), first_wrong, started_ns);
  for (const auto& [code, entry] : failed.by_code)
    Fail("get", code, entry.first, entry.second, started_ns);
}

void SoakLoad::Remove() {
  const uint64_t count = next_.load();
  if (count == 0) return;
  std::vector<std::string> names;
  for (size_t j = 0; j < options_.batch; ++j) {
    names.push_back(options_.prefix + std::to_string(rng_() % count));
  }
  const int64_t started_ns = FailoverProbe::NowNs();
  std::vector<larder::Status> results = client_->BatchRemove(names);
  uint64_t ok = 0, missing = 0, busy = 0;
  BatchFailures failed;
  for (const larder::Status& status : results) {
    if (status.ok()) {
      ++ok;
    } else if (status.code() == StatusCode::kNotFound) {
      ++missing;  // evicted, removed before, or never stored
    } else if (status.detail() == larder::ErrorDetail::kBeingWritten ||
               status.detail() == larder::ErrorDetail::kLeased) {
      ++busy;  // a reader holds it, or a put of it is in flight: documented, retry later
    } else {
      failed.Add(status);
    }
  }
  std::lock_guard lock(mu_);
  counts_["ops"] = counts_["ops"].get<uint64_t>() + names.size();
  counts_["removes"] = counts_["removes"].get<uint64_t>() + ok;
  counts_["missing"] = counts_["missing"].get<uint64_t>() + missing;
  counts_["busy"] = counts_["busy"].get<uint64_t>() + busy;
  for (const auto& [code, entry] : failed.by_code)
    Fail("remove", code, entry.first, entry.second, started_ns);
}

}  // namespace larder::bench
