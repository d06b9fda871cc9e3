// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "bench/mount/mount_worker.h"

#include <chrono>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench/common/json_commands.h"
#include "bench/store/store_worker.h"
#include "common/child_process.h"
#include "larder/store_client.h"
#include "testing/values.h"

namespace larder::bench {
namespace {

using json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

double MillisecondsSince(SteadyClock::time_point start) {
  return std::chrono::duration<double, std::milli>(SteadyClock::now() - start).count();
}

json Error(const Status& status) { return {{"error", status.ToString()}}; }

class MountWorker {
 public:
  MountWorker(std::unique_ptr<StoreClient> client, double create_ms)
      : client_(std::move(client)), create_ms_(create_ms) {}
  ~MountWorker() {
    if (!buffer_.empty()) client_->UnregisterBuffer(buffer_.data()).IgnoreError();
  }

  json Handle(const json& cmd) {
    std::string name = cmd.value("cmd", "");
    if (name == "info") return Info();
    if (name == "put") return Put(cmd);
    if (name == "prepare") return Prepare(cmd);
    if (name == "open") return Open(cmd);
    if (name == "get") return Get(cmd);
    if (name == "descriptor") return Descriptor(cmd);
    return {{"error", "unknown command '" + name + "'"}};
  }

 private:
  json Info() {
    uint64_t page_size = 0;
    for (const SegmentDescriptor& segment : client_->engine().ListSegments()) {
      if (segment.name == client_->segment_name()) page_size = segment.page_size;
    }
    return {{"create_ms", create_ms_},
            {"segment", client_->segment_name()},
            {"address", client_->engine().address()},
            {"page_size", page_size}};
  }

  json Put(const json& cmd) {
    std::string key = cmd.value("key", "");
    std::vector<std::byte> value(cmd.value("size", uint64_t{4096}));
    test::FillValue(key, value);
    PutConfig config;
    if (std::string preferred = cmd.value("preferred", ""); !preferred.empty()) {
      config.preferred_segments.push_back(preferred);
    }
    auto start = SteadyClock::now();
    Status status = client_->Put(key, value, config);
    double ms = MillisecondsSince(start);
    if (!status.ok()) return Error(status);
    return {{"ms", ms}};
  }

  // The destination of gets is registered and touched before anything is timed, so that the get
  // times and the reader's memory growth are those of the segment mapping alone.
  json Prepare(const json& cmd) {
    size_t bytes = cmd.value("bytes", size_t{4096});
    if (!buffer_.empty()) client_->UnregisterBuffer(buffer_.data()).IgnoreError();
    buffer_.assign(bytes, std::byte{0});
    Status status = client_->RegisterBuffer(buffer_.data(), buffer_.size());
    if (!status.ok()) {
      buffer_.clear();
      return Error(status);
    }
    return json::object();
  }

  json Open(const json& cmd) {
    auto start = SteadyClock::now();
    auto route = client_->RouteTo(cmd.value("segment", ""));
    double ms = MillisecondsSince(start);
    if (!route.ok()) return Error(route.status());
    return {{"route", std::string(RouteKindName(*route))}, {"ms", ms}};
  }

  json Get(const json& cmd) {
    std::string key = cmd.value("key", "");
    size_t size = cmd.value("size", size_t{4096});
    if (buffer_.size() < size) {
      return {{"error", "get of " + std::to_string(size) + " bytes: prepare a buffer first"}};
    }
    auto start = SteadyClock::now();
    auto got = client_->GetInto(key, buffer_.data(), size);
    double ms = MillisecondsSince(start);
    if (!got.ok()) return Error(got.status());
    bool verified = test::VerifyValue(key, std::span(buffer_.data(), *got));
    return {{"ms", ms}, {"verified", verified}};
  }

  json Descriptor(const json& cmd) {
    std::string segment = cmd.value("segment", "");
    auto segments =
        client_->engine().ListPeerSegments(cmd.value("address", ""), std::chrono::seconds(10));
    if (!segments.ok()) return Error(segments.status());
    for (const SegmentDescriptor& descriptor : *segments) {
      if (descriptor.name == segment) {
        return {{"page_size", descriptor.page_size}, {"size", descriptor.size}};
      }
    }
    return {{"error", "the engine does not export segment '" + segment + "'"}};
  }

  std::unique_ptr<StoreClient> client_;
  double create_ms_;
  std::vector<std::byte> buffer_;
};

}  // namespace

int RunMountWorker(const MountWorkerOptions& options) {
  auto client_options = StoreClientOptions::FromEnvironment();
  if (!client_options.ok()) {
    std::cerr << "mount-worker: " << client_options.status() << "\n";
    return 1;
  }
  if (!options.master.empty()) client_options->master_address = options.master;
  // The benchmark is about mapping a peer's segment: same-host peers must meet over shm.
  client_options->protocol = "auto";
  client_options->global_segment_size = options.segment_size;
  // What a large segment costs, on machines smaller than the segments measured.
  client_options->sparse_segment = true;
  if (!options.segment_name.empty()) client_options->segment_name = options.segment_name;
  client_options->huge_pages = options.huge_pages;
  auto start = SteadyClock::now();
  auto client = StoreClient::Create(*client_options);
  double create_ms = MillisecondsSince(start);
  if (!client.ok()) {
    std::cerr << "mount-worker: " << client.status() << "\n";
    return 1;
  }
  std::string address = (*client)->engine().address();
  MountWorker worker(std::move(*client), create_ms);
  AnnounceReady(address);
  ServeJsonCommands([&worker](const json& cmd) { return worker.Handle(cmd); });
  return 0;
}

}  // namespace larder::bench
