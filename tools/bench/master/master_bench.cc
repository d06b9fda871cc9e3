// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The master runs in its own process so that its resident memory can be read from /proc and
// nothing of the load generator is counted. Objects are placed in one large segment that no
// memory backs: the master only does arithmetic on it. The rebuild mode (--rebuild) is the
// exception: it times MasterState::MountSegments in this process.
#include "bench/master/master_bench.h"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "bench/common/report.h"
#include "client/master_client.h"
#include "common/child_process.h"
#include "common/net.h"
#include "master/master_state.h"
#include "master/own_descriptor.h"

namespace larder::bench {
namespace {

using Stub = proto::Master::Stub;
using SteadyClock = std::chrono::steady_clock;

uint64_t ResidentBytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

std::string KeyOf(uint64_t i, size_t size) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(i));
  std::string key = "obj/";
  while (key.size() + 16 < size) key += '0';
  key += hex;
  return key.substr(0, std::max<size_t>(size, 1));
}

struct Master {
  ChildProcess process;
  std::unique_ptr<client::MasterClient> client;
  std::string client_id;
};

Result<Master> StartMaster(const MasterBenchOptions& options) {
  std::string self = SelfExecutable();
  std::string path = self.substr(0, self.rfind('/') + 1) + "larder-master";
  std::vector<std::string> argv = {path,
                                   "--host",
                                   "127.0.0.1",
                                   "--port",
                                   "0",
                                   "--http-port",
                                   "-1",
                                   "--parent-watch",
                                   "--eviction-high-watermark",
                                   "1"};
  client::MasterClientOptions client_options;
  client_options.timeout = std::chrono::seconds(60);
  Master master;
  master.client_id = "master-bench/" + std::to_string(getpid());
  client_options.client_id = master.client_id;
  if (options.auth) {
    uint8_t secret[16];
    RandomBytes(secret, sizeof(secret));
    for (uint8_t b : secret) client_options.auth_token += fmt::format("{:02x}", b);
    std::string file = "/tmp/larder-master-bench-" + std::to_string(getpid()) + ".token";
    std::ofstream(file) << client_options.auth_token;
    argv.insert(argv.end(), {"--auth-token-file", file});
  }
  if (options.grpc_only) argv.push_back("--no-local-socket");
  LARDER_ASSIGN_OR_RETURN(master.process, ChildProcess::Spawn(argv, {{"LARDER_LOG_LEVEL", "warn"}},
                                                              std::chrono::seconds(30)));
  client_options.address = master.process.address().substr(0, master.process.address().find(' '));
  master.client = std::make_unique<client::MasterClient>(client_options);
  proto::MountSegmentsRequest mount;
  proto::MountSegmentsReply reply;
  mount.set_client_id(master.client_id);
  mount.set_host_id("bench");
  proto::SegmentInfo* segment = mount.add_segments();
  segment->set_name("unbacked");
  segment->set_base(1ull << 40);
  segment->set_size(1ull << 46);  // 64 TiB of address arithmetic
  master::SetOwnDescriptor(segment, master.client_id, "bench", "unbacked", segment->size());
  LARDER_RETURN_IF_ERROR(master.client->Call("MountSegments", &Stub::MountSegments, mount, &reply));
  LARDER_RETURN_IF_ERROR(client::FromItemStatus(reply.status(0)));
  return master;
}

// Puts keys [first, first + count) in batches: BatchPutStart then BatchPutEnd per batch.
Status PutRange(const Master& master, uint64_t first, uint64_t count, size_t batch, size_t key_size,
                std::vector<double>* latencies) {
  proto::BatchPutStartRequest start;
  proto::BatchKeysRequest end;
  for (uint64_t done = 0; done < count;) {
    start.Clear();
    end.Clear();
    start.set_client_id(master.client_id);
    end.set_client_id(master.client_id);
    for (size_t j = 0; j < batch && done < count; ++j, ++done) {
      proto::PutItem* item = start.add_items();
      item->set_key(KeyOf(first + done, key_size));
      item->set_size(4096);
      end.add_keys(item->key());
    }
    auto t0 = SteadyClock::now();
    proto::BatchPutStartReply started;
    LARDER_RETURN_IF_ERROR(
        master.client->Call("BatchPutStart", &Stub::BatchPutStart, start, &started));
    proto::BatchStatusReply ended;
    LARDER_RETURN_IF_ERROR(master.client->Call("BatchPutEnd", &Stub::BatchPutEnd, end, &ended));
    if (latencies != nullptr) {
      latencies->push_back(
          std::chrono::duration<double, std::micro>(SteadyClock::now() - t0).count());
    }
    for (const auto& result : started.results()) {
      LARDER_RETURN_IF_ERROR(client::FromItemStatus(result.status()));
    }
    for (const Status& status : client::ItemStatuses(end.keys_size(), ended.errors())) {
      LARDER_RETURN_IF_ERROR(status);
    }
  }
  return Status::Ok();
}

// A rebuild from catalogs, timed in process: what a restarted master spends on the objects that
// its clients bring back when they mount again.
int RunRebuildBench(const MasterBenchOptions& options) {
  const uint64_t n = options.rebuild;
  constexpr uint64_t kObjectBytes = 4096;
  if (n > master::kMaxSegmentBytes / kObjectBytes) {
    std::cerr << "larder-bench master: --rebuild of more than "
              << master::kMaxSegmentBytes / kObjectBytes << " objects does not fit a segment\n";
    return 1;
  }
  auto catalog_of = [&](uint64_t offset_shift) {
    std::vector<master::CatalogEntry> catalog;
    catalog.reserve(n);
    for (uint64_t i = 0; i < n; ++i) {
      master::CatalogEntry entry;
      entry.key = KeyOf(i, options.key_size);
      entry.offset = ((i + offset_shift) % n) * kObjectBytes;
      entry.size = kObjectBytes;
      // Uses in an order unrelated to the offsets, as after a while of traffic.
      entry.last_access = (i * 2654435761ull) % (n * 4) + 1;
      entry.pinned = i % 1024 == 0;
      if (i % 64 == 1) entry.soft_pin_remaining_ms = 600000;
      catalog.push_back(std::move(entry));
    }
    return catalog;
  };
  master::MasterOptions master_options;
  master_options.max_key_size = std::max<size_t>(options.key_size, 4096);
  master::MasterState state(master_options);
  nlohmann::json out = {
      {"bench", "master-rebuild"}, {"objects", n}, {"key_size", options.key_size}};
  const char* names[] = {"first", "second"};
  for (int round = 0; round < 2; ++round) {
    master::SegmentMount mount{
        std::string("rebuilt-") + names[round], 1ull << 40, n * kObjectBytes, {}};
    mount.catalog = catalog_of(round == 0 ? 0 : n / 2);
    mount.catalog_incarnation = 1;  // another master's
    const std::string client = "rebuild-bench/" + std::to_string(round);
    const uint64_t rss_before = ResidentBytes(getpid());
    auto t0 = SteadyClock::now();
    std::vector<master::MountOutcome> outcomes =
        state.MountSegments(master::MountCaller{client, "bench"}, std::span(&mount, 1));
    const double seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    const uint64_t rss_after = ResidentBytes(getpid());
    if (!outcomes.at(0).status.ok()) {
      std::cerr << "larder-bench master: " << outcomes[0].status << "\n";
      return 1;
    }
    nlohmann::json& figures = out[names[round]];
    figures["mount_s"] = seconds;
    figures["restored"] = outcomes[0].recovery.restored;
    figures["dropped"] = outcomes[0].recovery.dropped;
    figures["objects_per_s"] = static_cast<double>(n) / seconds;
    figures["rss_growth_bytes"] = rss_after > rss_before ? rss_after - rss_before : 0;
  }
  master::MasterStats stats = state.Stats();
  out["objects_after"] = stats.objects;
  out["bytes_used"] = stats.bytes_used;
  if (options.json) {
    std::cout << out.dump() << std::endl;
    return 0;
  }
  Table table({"catalog", "objects", "restored", "dropped", "MountSegments s", "objects/s"});
  for (const char* name : names) {
    const nlohmann::json& figures = out[name];
    table.AddRow({name, std::to_string(n), std::to_string(figures["restored"].get<uint64_t>()),
                  std::to_string(figures["dropped"].get<uint64_t>()),
                  Fixed(figures["mount_s"].get<double>(), 3),
                  Fixed(figures["objects_per_s"].get<double>(), 0)});
  }
  std::cout << table.ToString();
  return 0;
}

}  // namespace

int RunMasterBench(const MasterBenchOptions& options) {
  if (options.rebuild > 0) return RunRebuildBench(options);
  auto fail = [](const Status& status) {
    std::cerr << "larder-bench master: " << status << "\n";
    return 1;
  };
  nlohmann::json out = {
      {"bench", "master"},          {"batch", options.batch},
      {"threads", options.threads}, {"key_size", options.key_size},
      {"auth", options.auth},       {"path", options.grpc_only ? "grpc" : "local"}};
  // 1. Throughput: each thread puts fresh keys for the duration, then gets random ones.
  {
    auto master = StartMaster(options);
    if (!master.ok()) return fail(master.status());
    std::atomic<uint64_t> puts{0}, gets{0};
    std::vector<std::vector<double>> put_lat(options.threads), get_lat(options.threads);
    std::vector<uint64_t> put_count(options.threads, 0);
    std::vector<Status> errors(options.threads);
    auto run = [&](auto body) {
      std::vector<std::thread> threads;
      for (int t = 0; t < options.threads; ++t) threads.emplace_back(body, t);
      for (auto& thread : threads) thread.join();
    };
    auto t0 = SteadyClock::now();
    run([&](int t) {
      uint64_t base = static_cast<uint64_t>(t) << 40;
      auto end = SteadyClock::now() + std::chrono::duration<double>(options.duration_s);
      while (SteadyClock::now() < end && errors[t].ok()) {
        errors[t] = PutRange(*master, base + put_count[t], options.batch, options.batch,
                             options.key_size, &put_lat[t]);
        put_count[t] += options.batch;
        puts += options.batch;
      }
    });
    double put_seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    t0 = SteadyClock::now();
    run([&](int t) {
      std::mt19937_64 rng(static_cast<uint64_t>(t) + 1);
      proto::BatchKeysRequest request;
      uint64_t lease_to_release = 0;
      auto end = SteadyClock::now() + std::chrono::duration<double>(options.duration_s);
      while (SteadyClock::now() < end && errors[t].ok() && put_count[t] > 0) {
        request.Clear();
        request.set_client_id(master->client_id);
        // As StoreClient does: the previous get's lease is released on the back of this one.
        if (lease_to_release != 0) request.add_release_leases(lease_to_release);
        for (size_t j = 0; j < options.batch; ++j) {
          request.add_keys(
              KeyOf((static_cast<uint64_t>(t) << 40) + rng() % put_count[t], options.key_size));
        }
        proto::BatchGetReplicasReply reply;
        auto start = SteadyClock::now();
        errors[t] =
            master->client->Call("BatchGetReplicas", &Stub::BatchGetReplicas, request, &reply);
        get_lat[t].push_back(
            std::chrono::duration<double, std::micro>(SteadyClock::now() - start).count());
        lease_to_release = reply.lease_id();
        if (errors[t].ok()) errors[t] = client::CheckReplicaColumns(reply, options.batch);
        if (errors[t].ok()) {
          for (const Status& status : client::ItemStatuses(options.batch, reply.errors())) {
            if (errors[t].ok()) errors[t] = status;
          }
        }
        gets += options.batch;
      }
    });
    double get_seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    for (const Status& error : errors) {
      if (!error.ok()) return fail(error);
    }
    std::vector<double> all_put, all_get;
    for (auto& l : put_lat) all_put.insert(all_put.end(), l.begin(), l.end());
    for (auto& l : get_lat) all_get.insert(all_get.end(), l.begin(), l.end());
    out["put_ops_per_s"] = static_cast<double>(puts.load()) / put_seconds;
    out["get_ops_per_s"] = static_cast<double>(gets.load()) / get_seconds;
    out["put_batch_p50_us"] = Percentile(all_put, 50);
    out["get_batch_p50_us"] = Percentile(all_get, 50);
    master->process.Stop(std::chrono::seconds(10));
  }
  // 2. Memory: resident bytes of a fresh master before and after `objects` puts.
  {
    auto master = StartMaster(options);
    if (!master.ok()) return fail(master.status());
    uint64_t before = ResidentBytes(master->process.pid());
    std::vector<std::thread> threads;
    std::vector<Status> errors(options.threads);
    uint64_t per_thread = options.objects / static_cast<uint64_t>(options.threads);
    {
      ProgressBar bar("master: inserting objects", std::chrono::seconds(20), nullptr,
                      !options.json && isatty(STDERR_FILENO));
      for (int t = 0; t < options.threads; ++t) {
        threads.emplace_back([&, t] {
          uint64_t count = t + 1 == options.threads
                               ? options.objects - per_thread * static_cast<uint64_t>(t)
                               : per_thread;
          errors[t] = PutRange(*master, per_thread * static_cast<uint64_t>(t), count,
                               std::max<size_t>(options.batch, 512), options.key_size, nullptr);
        });
      }
      for (auto& thread : threads) thread.join();
    }
    for (const Status& error : errors) {
      if (!error.ok()) return fail(error);
    }
    uint64_t after = ResidentBytes(master->process.pid());
    out["objects"] = options.objects;
    out["rss_before"] = before;
    out["rss_after"] = after;
    out["bytes_per_object"] =
        static_cast<double>(after - before) / static_cast<double>(options.objects);
    master->process.Stop(std::chrono::seconds(10));
  }
  if (options.json) {
    std::cout << out.dump() << std::endl;
  } else {
    Table table({"batch", "threads", "PutStart+PutEnd obj/s", "GetReplicas obj/s", "objects",
                 "bytes/object"});
    table.AddRow({std::to_string(options.batch), std::to_string(options.threads),
                  Fixed(out["put_ops_per_s"].get<double>(), 0),
                  Fixed(out["get_ops_per_s"].get<double>(), 0), std::to_string(options.objects),
                  Fixed(out["bytes_per_object"].get<double>(), 1)});
    std::cout << table.ToString();
  }
  return 0;
}

}  // namespace larder::bench
