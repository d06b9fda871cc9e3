// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "bench/failover/failover_probe.h"

#include <unistd.h>

#include <algorithm>
#include <random>

#include "testing/values.h"

namespace larder::bench {

using json = nlohmann::json;

FailoverProbeOptions FailoverProbeOptions::FromJson(const json& command) {
  FailoverProbeOptions options;
  options.put_prefix = command.value("put_prefix", options.put_prefix);
  options.max_puts = command.value("max_puts", options.max_puts);
  options.get_prefix = command.value("get_prefix", options.get_prefix);
  options.get_count = command.value("get_count", options.get_count);
  options.value_size = command.value("value_size", options.value_size);
  options.batch = command.value("batch", options.batch);
  options.interval =
      std::chrono::microseconds(command.value("interval_us", int64_t{options.interval.count()}));
  options.preferred_segment = command.value("preferred", options.preferred_segment);
  return options;
}

int64_t FailoverProbe::NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Result<std::unique_ptr<FailoverProbe>> FailoverProbe::Start(StoreClient* client,
                                                            FailoverProbeOptions options) {
  if (options.batch == 0 || options.value_size == 0) {
    return InvalidArgumentError("probe: batch and value_size must be positive");
  }
  std::unique_ptr<FailoverProbe> probe(new FailoverProbe(client, std::move(options)));
  LARDER_RETURN_IF_ERROR(client->RegisterBuffer(probe->buffer_.data(), probe->buffer_.size()));
  probe->thread_ = std::thread([raw = probe.get()] { raw->Loop(); });
  return probe;
}

FailoverProbe::FailoverProbe(StoreClient* client, FailoverProbeOptions options)
    : client_(client),
      options_(std::move(options)),
      buffer_(2 * options_.batch * options_.value_size, std::byte{0}),
      rng_(test::KeyHash(options_.get_prefix) ^ static_cast<uint64_t>(getpid())) {}

FailoverProbe::~FailoverProbe() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  client_->UnregisterBuffer(buffer_.data()).IgnoreError();
}

void FailoverProbe::Loop() {
  while (!stop_) {
    if (next_put_ < options_.max_puts) Record(PutBatch());
    if (stop_) break;
    if (options_.get_count > 0) Record(GetBatch());
    // The pause bounds the probe's rate (and so the space its puts take). With nothing left to
    // do (the put budget spent, no gets) the loop only waits for the stop flag.
    bool idle = next_put_ >= options_.max_puts && options_.get_count == 0;
    auto pause =
        idle ? std::max(options_.interval, std::chrono::microseconds(1000)) : options_.interval;
    if (pause.count() > 0) std::this_thread::sleep_for(pause);
  }
}

FailoverProbe::Batch FailoverProbe::PutBatch() {
  std::vector<std::string> names;
  std::vector<void*> ptrs;
  std::vector<size_t> sizes;
  for (size_t j = 0; j < options_.batch && next_put_ < options_.max_puts; ++j, ++next_put_) {
    names.push_back(options_.put_prefix + std::to_string(next_put_));
    std::byte* slot = buffer_.data() + j * options_.value_size;
    test::FillValue(names.back(), std::span(slot, options_.value_size));
    ptrs.push_back(slot);
    sizes.push_back(options_.value_size);
  }
  PutConfig config;
  if (!options_.preferred_segment.empty()) {
    config.preferred_segments.push_back(options_.preferred_segment);
  }
  Batch batch;
  batch.put = true;
  batch.start_ns = NowNs();
  std::vector<Status> results = client_->BatchPutFrom(names, ptrs, sizes, config);
  batch.end_ns = NowNs();
  for (const Status& status : results) {
    if (status.ok()) {
      ++batch.ok;
    } else {
      AddFailure(batch, std::string(StatusCodeName(status.code())), status.ToString());
    }
  }
  return batch;
}

FailoverProbe::Batch FailoverProbe::GetBatch() {
  std::byte* slots = buffer_.data() + options_.batch * options_.value_size;
  std::vector<std::string> names;
  std::vector<void*> ptrs;
  std::vector<size_t> capacities;
  for (size_t j = 0; j < options_.batch; ++j) {
    names.push_back(options_.get_prefix + std::to_string(rng_() % options_.get_count));
    ptrs.push_back(slots + j * options_.value_size);
    capacities.push_back(options_.value_size);
  }
  Batch batch;
  batch.start_ns = NowNs();
  std::vector<Result<size_t>> results = client_->BatchGetInto(names, ptrs, capacities);
  batch.end_ns = NowNs();
  for (size_t j = 0; j < results.size(); ++j) {
    if (!results[j].ok()) {
      const Status& status = results[j].status();
      AddFailure(batch, std::string(StatusCodeName(status.code())), status.ToString());
    } else if (test::VerifyValue(names[j],
                                 std::span(static_cast<const std::byte*>(ptrs[j]), *results[j]))) {
      ++batch.ok;
    } else {
      std::string message = "wrong bytes for key '";
      message += names[j];
      message += '\'';
      AddFailure(batch, "wrong", message);
    }
  }
  return batch;
}

void FailoverProbe::AddFailure(Batch& batch, std::string kind, const std::string& message) {
  for (Failure& failure : batch.failures) {
    if (failure.kind == kind) {
      ++failure.keys;
      return;
    }
  }
  batch.failures.push_back({std::move(kind), 1, message});
}

void FailoverProbe::Record(Batch batch) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Failure& failure : batch.failures) {
    if (failure.kind == "wrong") wrong_ += failure.keys;
  }
  batches_.push_back(std::move(batch));
}

json FailoverProbe::Summary(int64_t since_ns) const {
  json first_put = nullptr, first_get = nullptr, last_failure = nullptr;
  uint64_t puts_ok = 0, gets_ok = 0, before_puts = 0, before_gets = 0, before_failures = 0;
  json errors = json::object();
  json first_errors = json::object();
  uint64_t wrong = 0, put_keys = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    wrong = wrong_;
    for (const Batch& batch : batches_) {
      if (batch.put) {
        put_keys += batch.ok;
        for (const Failure& failure : batch.failures) put_keys += failure.keys;
      }
      if (batch.end_ns < since_ns) {
        (batch.put ? before_puts : before_gets) += batch.ok;
        for (const Failure& failure : batch.failures) before_failures += failure.keys;
        continue;
      }
      for (const Failure& failure : batch.failures) {
        std::string kind = batch.put ? "put:" : "get:";
        kind += failure.kind;
        errors[kind] = errors.value(kind, uint64_t{0}) + failure.keys;
        if (!first_errors.contains(kind)) first_errors[kind] = failure.message;
        last_failure = batch.end_ns;
      }
      if (batch.start_ns < since_ns) continue;  // began before the kill: says nothing of after
      (batch.put ? puts_ok : gets_ok) += batch.ok;
      if (batch.ok == 0) continue;
      json& first = batch.put ? first_put : first_get;
      if (first.is_null()) first = batch.end_ns;
    }
  }
  // next_put_ belongs to the loop thread; the budget left is counted from what was recorded.
  uint64_t puts_left = put_keys < options_.max_puts ? options_.max_puts - put_keys : 0;
  return {{"first_put_ok_ns", first_put},
          {"first_get_ok_ns", first_get},
          {"puts_ok", puts_ok},
          {"gets_ok", gets_ok},
          {"errors", errors},
          {"first_errors", first_errors},
          {"last_failure_ns", last_failure},
          {"before",
           {{"puts_ok", before_puts}, {"gets_ok", before_gets}, {"failures", before_failures}}},
          {"wrong", wrong},
          {"puts_left", puts_left},
          {"now_ns", NowNs()}};
}

}  // namespace larder::bench
