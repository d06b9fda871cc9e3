// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "bench/store/store_worker.h"

#include "bench/common/json_commands.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "bench/failover/failover_probe.h"
#include "bench/soak/soak_load.h"
#include "common/child_process.h"
#include "common/env.h"
#include "larder/store_client.h"
#include "testing/values.h"
#include "transfer/device/device_transport.h"
#include "transfer/transport_registry.h"

namespace larder::bench {
namespace {

using json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

// A field of /proc/self/status in bytes ("VmRSS", "RssShmem"); 0 when absent.
uint64_t ProcStatusBytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with(field + ":")) return std::stoull(line.substr(field.size() + 1)) * 1024;
  }
  return 0;
}

class Worker {
 public:
  explicit Worker(std::unique_ptr<StoreClient> client) : client_(std::move(client)) {}
  ~Worker() {
    if (client_ && !buffer_.empty()) client_->UnregisterBuffer(buffer_.data()).IgnoreError();
  }

  json Handle(const json& cmd) {
    std::string name = cmd.value("cmd", "");
    if (!client_) return {{"error", "the client has unmounted"}};
    if (name == "stats") {
      json stats = json::parse(client_->engine().Stats().ToJson());
      stats["client_id"] = client_->client_id();
      stats["rss_shmem_bytes"] = ProcStatusBytes("RssShmem");
      stats["rss_bytes"] = ProcStatusBytes("VmRSS");
      return stats;
    }
    if (name == "unmount") {
      // Leaves the cluster (segment unmounted, engine gone) while the process lives on.
      probe_.reset();
      soak_.reset();
      if (!buffer_.empty()) client_->UnregisterBuffer(buffer_.data()).IgnoreError();
      buffer_.clear();
      client_.reset();
      return {{"unmounted", true}};
    }
    if (name == "put") return Put(cmd);
    if (name == "get") return Get(cmd);
    if (name == "exist") return Exist(cmd);
    if (name == "remove") return Remove(cmd);
    if (name == "remove_all") {
      auto removed = client_->RemoveAll();
      return {{"code", std::string(StatusCodeName(removed.status().code()))},
              {"removed", removed.ok() ? *removed : 0},
              {"message", removed.status().message()}};
    }
    if (name == "catalog") return {{"objects", client_->CatalogSize()}};
    if (name == "probe_start") return StartProbe(cmd);
    if (name == "probe_status" || name == "probe_stop") {
      if (!probe_) return {{"error", "no probe is running"}};
      json summary = probe_->Summary(cmd.value("since_ns", int64_t{0}));
      if (name == "probe_stop") probe_.reset();
      return summary;
    }
    if (name == "soak_start") return StartSoak(cmd);
    if (name == "soak_status") {
      if (!soak_) return {{"error", "no soak load is running"}};
      if (auto peers = cmd.find("peers"); peers != cmd.end() && peers->is_object()) {
        soak_->SetPeers(peers->get<std::map<std::string, uint64_t>>());
      }
      json status = soak_->Status();
      status["rss_bytes"] = ProcStatusBytes("VmRSS");
      return status;
    }
    if (name == "route") {
      auto route = client_->RouteTo(cmd.value("segment", ""));
      if (!route.ok()) return {{"error", route.status().ToString()}};
      return {{"route", std::string(RouteKindName(*route))}};
    }
    return {{"error", "unknown command '" + name + "'"}};
  }

 private:
  // Key selection shared by put and get: an explicit list, or prefix + index.
  struct Keys {
    std::vector<std::string> list;
    std::string prefix;
    uint64_t first = 0;
    uint64_t count = 0;
    std::string At(uint64_t i) const {
      return list.empty() ? prefix + std::to_string(first + i) : list[i];
    }
    uint64_t size() const { return list.empty() ? count : list.size(); }
  };

  static Keys SelectKeys(const json& cmd) {
    Keys keys;
    if (cmd.contains("keys")) keys.list = cmd["keys"].get<std::vector<std::string>>();
    keys.prefix = cmd.value("prefix", "");
    keys.first = cmd.value("first", uint64_t{0});
    keys.count = cmd.value("count", uint64_t{0});
    return keys;
  }

  std::byte* Buffer(size_t bytes) {
    if (buffer_.size() < bytes) {
      if (!buffer_.empty()) client_->UnregisterBuffer(buffer_.data()).IgnoreError();
      buffer_.assign(bytes, std::byte{0});
      Status status = client_->RegisterBuffer(buffer_.data(), buffer_.size());
      if (!status.ok()) std::cerr << "store-worker: RegisterBuffer: " << status << "\n";
    }
    return buffer_.data();
  }

  json Put(const json& cmd) {
    Keys keys = SelectKeys(cmd);
    uint64_t value_size = cmd.value("value_size", uint64_t{4096});
    size_t batch = std::max<size_t>(cmd.value("batch", size_t{1}), 1);
    double duration = cmd.value("duration", 0.0);
    bool zero_copy = cmd.value("zero_copy", true);
    PutConfig config;
    config.replica_num = cmd.value("replicas", 0u);
    if (std::string preferred = cmd.value("preferred", ""); !preferred.empty()) {
      config.preferred_segments.push_back(preferred);
    }
    std::byte* buffer = Buffer(batch * value_size);
    uint64_t ok = 0, errors = 0, next = 0;
    std::string first_error;
    json error_codes = json::object();  // failed puts by status code name
    double seconds = 0;
    std::vector<double> latencies;
    auto end = SteadyClock::now() + std::chrono::duration<double>(duration);
    std::vector<std::string> names;
    std::vector<void*> ptrs;
    std::vector<size_t> sizes;
    while (duration > 0 ? SteadyClock::now() < end : next < keys.size()) {
      names.clear();
      ptrs.clear();
      sizes.clear();
      for (size_t j = 0; j < batch && (duration > 0 || next < keys.size()); ++j, ++next) {
        names.push_back(keys.At(next));
        std::byte* slot = buffer + j * value_size;
        test::FillValue(names.back(), std::span(slot, value_size));
        ptrs.push_back(slot);
        sizes.push_back(value_size);
      }
      auto start = SteadyClock::now();
      std::vector<Status> results;
      if (zero_copy) {
        results = client_->BatchPutFrom(names, ptrs, sizes, config);
      } else {
        std::vector<std::span<const std::byte>> values;
        for (void* p : ptrs) values.emplace_back(static_cast<const std::byte*>(p), value_size);
        results = client_->BatchPut(names, values, config);
      }
      double took = std::chrono::duration<double>(SteadyClock::now() - start).count();
      seconds += took;
      latencies.push_back(took * 1e6);
      for (const Status& status : results) {
        if (status.ok()) {
          ++ok;
        } else {
          ++errors;
          std::string code(StatusCodeName(status.code()));
          error_codes[code] = error_codes.value(code, 0) + 1;
          if (first_error.empty()) first_error = status.ToString();
        }
      }
    }
    return {{"ok", ok},
            {"errors", errors},
            {"error_codes", error_codes},
            {"first_error", first_error},
            {"seconds", seconds},
            {"lat_us", latencies},
            {"next", next}};
  }

  json Get(const json& cmd) {
    Keys keys = SelectKeys(cmd);
    uint64_t value_size = cmd.value("value_size", uint64_t{4096});
    size_t batch = std::max<size_t>(cmd.value("batch", size_t{1}), 1);
    double duration = cmd.value("duration", 0.0);
    bool zero_copy = cmd.value("zero_copy", true);
    std::byte* buffer = Buffer(batch * value_size);
    uint64_t ok = 0, errors = 0, retryable = 0, missing = 0, wrong = 0, next = 0;
    std::string first_error;
    double seconds = 0;
    std::vector<double> latencies;
    std::mt19937_64 rng(test::KeyHash(keys.prefix) ^ static_cast<uint64_t>(getpid()));
    auto end = SteadyClock::now() + std::chrono::duration<double>(duration);
    std::vector<std::string> names;
    std::vector<void*> ptrs;
    std::vector<size_t> capacities;
    while (keys.size() > 0 && (duration > 0 ? SteadyClock::now() < end : next < keys.size())) {
      names.clear();
      ptrs.clear();
      capacities.clear();
      for (size_t j = 0; j < batch && (duration > 0 || next < keys.size()); ++j, ++next) {
        names.push_back(keys.At(duration > 0 ? rng() % keys.size() : next));
        ptrs.push_back(buffer + j * value_size);
        capacities.push_back(value_size);
      }
      auto start = SteadyClock::now();
      std::vector<Status> statuses;
      std::vector<std::string> copies;
      std::vector<size_t> got_sizes(names.size(), 0);
      if (zero_copy) {
        auto results = client_->BatchGetInto(names, ptrs, capacities);
        for (size_t j = 0; j < results.size(); ++j) {
          statuses.push_back(results[j].status());
          if (results[j].ok()) got_sizes[j] = *results[j];
        }
      } else {
        auto results = client_->BatchGet(names);
        copies.resize(results.size());
        for (size_t j = 0; j < results.size(); ++j) {
          statuses.push_back(results[j].status());
          if (results[j].ok()) {
            copies[j] = std::move(*results[j]);
            got_sizes[j] = copies[j].size();
          }
        }
      }
      double took = std::chrono::duration<double>(SteadyClock::now() - start).count();
      seconds += took;
      latencies.push_back(took * 1e6);
      for (size_t j = 0; j < names.size(); ++j) {
        if (!statuses[j].ok()) {
          if (statuses[j].code() == StatusCode::kNotFound) {
            ++missing;
            continue;
          }
          if (statuses[j].code() == StatusCode::kUnavailable) {
            ++retryable;  // being written, lease expired mid-copy, or unreachable: retry
          } else {
            ++errors;
          }
          if (first_error.empty()) first_error = statuses[j].ToString();
          continue;
        }
        const std::byte* data = zero_copy ? static_cast<const std::byte*>(ptrs[j])
                                          : reinterpret_cast<const std::byte*>(copies[j].data());
        if (test::VerifyValue(names[j], std::span(data, got_sizes[j]))) {
          ++ok;
        } else {
          ++wrong;
          if (first_error.empty()) first_error = "wrong bytes for key '" + names[j] + "'";
        }
      }
    }
    return {{"ok", ok},
            {"errors", errors},
            {"missing", missing},
            {"retryable", retryable},
            {"wrong", wrong},
            {"verified", ok},
            {"first_error", first_error},
            {"seconds", seconds},
            {"lat_us", latencies}};
  }

  json StartProbe(const json& cmd) {
    if (probe_) return {{"error", "a probe is already running"}};
    auto probe = FailoverProbe::Start(client_.get(), FailoverProbeOptions::FromJson(cmd));
    if (!probe.ok()) return {{"error", probe.status().ToString()}};
    probe_ = std::move(*probe);
    return {{"started", true}, {"now_ns", FailoverProbe::NowNs()}};
  }

  json StartSoak(const json& cmd) {
    if (soak_) return {{"error", "a soak load is already running"}};
    auto options = SoakLoadOptions::FromJson(cmd);
    if (!options.ok()) return {{"error", options.status().ToString()}};
    auto soak = SoakLoad::Start(client_.get(), std::move(*options));
    if (!soak.ok()) return {{"error", soak.status().ToString()}};
    soak_ = std::move(*soak);
    return {{"started", true}, {"now_ns", FailoverProbe::NowNs()}};
  }

  json Exist(const json& cmd) {
    auto keys = cmd.value("keys", std::vector<std::string>{});
    json out = json::array();
    for (const Result<bool>& result : client_->BatchExist(keys)) {
      out.push_back(result.ok() ? json(*result) : json(nullptr));
    }
    return {{"exist", out}};
  }

  json Remove(const json& cmd) {
    auto keys = cmd.value("keys", std::vector<std::string>{});
    json out = json::array();
    for (const Status& status : client_->BatchRemove(keys)) out.push_back(int(status.code()));
    return {{"codes", out}};
  }

  std::unique_ptr<StoreClient> client_;
  std::vector<std::byte> buffer_;
  std::unique_ptr<FailoverProbe> probe_;  // uses client_, so declared (and destroyed) after it
  std::unique_ptr<SoakLoad> soak_;        // as probe_
};

}  // namespace

bool SelectsDevice(const std::string& protocol) {
  auto selected = transfer::TransportRegistry::Global().Select(protocol);
  return selected.ok() && std::any_of(selected->begin(), selected->end(),
                                      [](const auto& t) { return t.factory->name == "device"; });
}

Result<std::unique_ptr<StoreClient>> CreateWorkerClient(const StoreWorkerOptions& options) {
  LARDER_ASSIGN_OR_RETURN(StoreClientOptions client_options, StoreClientOptions::FromEnvironment());
  if (!options.master.empty()) client_options.master_address = options.master;
  client_options.protocol = options.protocol;
  client_options.global_segment_size = options.segment_size;
  if (!options.segment_name.empty()) client_options.segment_name = options.segment_name;
  if (options.device >= 0) {
    LARDER_RETURN_IF_ERROR(transfer::DefaultDeviceBackend()->SetCurrentDevice(options.device));
  }
  return StoreClient::Create(client_options);
}

Result<std::unique_ptr<master::MasterServer>> StartEmbeddedMaster(int http_port) {
  master::MasterServerOptions options;
  options.listen_host = "127.0.0.1";
  options.port = 0;
  options.http_port = http_port;
  // The clients these tools start read LARDER_AUTH_TOKEN and LARDER_ADMIN_TOKEN; so does their
  // master, or token-holding clients would refuse it.
  options.auth.cluster_token = GetEnv("LARDER_AUTH_TOKEN");
  if (!options.auth.cluster_token.empty()) options.auth.admin_token = GetEnv("LARDER_ADMIN_TOKEN");
  return master::MasterServer::Start(options);
}

int RunStoreWorker(const StoreWorkerOptions& options) {
  auto client = CreateWorkerClient(options);
  if (!client.ok()) {
    std::cerr << "store-worker: " << client.status() << "\n";
    return 1;
  }
  std::string segment_name = (*client)->segment_name();
  Worker worker(std::move(*client));
  AnnounceReady(segment_name);
  ServeJsonCommands([&worker](const json& cmd) { return worker.Handle(cmd); });
  return 0;
}

}  // namespace larder::bench
