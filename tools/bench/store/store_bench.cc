// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Every object is placed in another client process's segment (the next client's, by preferred
// segment), so every put and get crosses a process boundary, as between two prefill workers on
// one host. Rates count time spent inside store calls; generating and verifying values happens
// outside it (every get is still verified).
#include "bench/store/store_bench.h"

#include <unistd.h>

#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/common/report.h"
#include "bench/store/store_worker.h"
#include "common/child_process.h"
#include "common/env.h"
#include "master/master_server.h"

namespace larder::bench {
namespace {

using json = nlohmann::json;

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  std::string part;
  while (std::getline(stream, part, ',')) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

struct Cluster {
  std::unique_ptr<master::MasterServer> master;  // when embedded
  std::string master_address;
  std::vector<ChildProcess> workers;
  std::vector<std::string> segments;
  std::string tenant;  // with a master of the user's: the bench's own key namespace
};

Result<Cluster> StartCluster(const StoreBenchOptions& options) {
  Cluster cluster;
  cluster.master_address = options.master;
  std::map<std::string, std::string> env;
  if (cluster.master_address.empty()) {
    LARDER_ASSIGN_OR_RETURN(cluster.master, StartEmbeddedMaster());
    cluster.master_address = cluster.master->address();
  } else {
    // A master of the user's may serve a live cache: the bench's keys go into a tenant of their
    // own (never colliding with anyone's, removed at the end), and the user is told.
    cluster.tenant = "larder-bench-" + std::to_string(getpid());
    env["LARDER_TENANT"] = cluster.tenant;
    std::cerr << "larder-bench store: writing into the larder-master at " << cluster.master_address
              << " as tenant '" << cluster.tenant
              << "' (other tenants never see its keys; they are removed at the end). Its "
                 "objects take pool space and can evict other clients' objects.\n";
  }
  // The device transport initializes on the worker thread's current device: device 0 for each.
  const bool device = SelectsDevice(options.protocol);
  for (int i = 0; i < options.clients; ++i) {
    std::string name = "bench-" + std::to_string(getpid()) + "-" + std::to_string(i);
    std::vector<std::string> argv = {SelfExecutable(), "store-worker",
                                     "--master",       cluster.master_address,
                                     "--segment-size", std::to_string(options.segment_size),
                                     "--protocol",     options.protocol,
                                     "--segment-name", name};
    if (device) argv.insert(argv.end(), {"--device", "0"});
    LARDER_ASSIGN_OR_RETURN(ChildProcess worker,
                            ChildProcess::Spawn(argv, env, std::chrono::seconds(30)));
    cluster.segments.push_back(worker.address());
    cluster.workers.push_back(std::move(worker));
  }
  return cluster;
}

// Sends one command per worker, then collects every reply.
Result<std::vector<json>> RunOnAll(Cluster& cluster, const std::vector<json>& commands,
                                   std::chrono::milliseconds timeout) {
  for (size_t i = 0; i < commands.size(); ++i) {
    LARDER_RETURN_IF_ERROR(cluster.workers[i].WriteLine(commands[i].dump()));
  }
  std::vector<json> replies;
  for (size_t i = 0; i < commands.size(); ++i) {
    LARDER_ASSIGN_OR_RETURN(std::string line, cluster.workers[i].ReadLine(timeout));
    json reply = json::parse(line, nullptr, false);
    if (reply.is_discarded() || reply.contains("error")) {
      return InternalError("worker " + std::to_string(i) + " answered: " + line);
    }
    replies.push_back(std::move(reply));
  }
  return replies;
}

struct Figures {
  std::string op;
  uint64_t value_size = 0;
  double kv_per_s = 0;
  double gbps = 0;
  double p50_us = 0;
  double p99_us = 0;
  uint64_t ops = 0;
  uint64_t errors = 0;
  uint64_t wrong = 0;
  uint64_t verified = 0;
  std::string first_error;
};

Figures Aggregate(const std::string& op, uint64_t value_size, const std::vector<json>& replies) {
  Figures figures;
  figures.op = op;
  figures.value_size = value_size;
  std::vector<double> latencies;
  for (const json& reply : replies) {
    uint64_t ok = reply.value("ok", uint64_t{0});
    double seconds = reply.value("seconds", 0.0);
    figures.ops += ok;
    if (seconds > 0) figures.kv_per_s += static_cast<double>(ok) / seconds;
    figures.errors += reply.value("errors", uint64_t{0}) + reply.value("missing", uint64_t{0}) +
                      reply.value("retryable", uint64_t{0});
    figures.wrong += reply.value("wrong", uint64_t{0});
    figures.verified += reply.value("verified", uint64_t{0});
    if (figures.first_error.empty()) figures.first_error = reply.value("first_error", "");
    for (double l : reply["lat_us"]) latencies.push_back(l);
  }
  figures.gbps = figures.kv_per_s * static_cast<double>(value_size) / 1e9;
  figures.p50_us = Percentile(latencies, 50);
  figures.p99_us = Percentile(latencies, 99);
  return figures;
}

}  // namespace

// Removes what the bench put into a master of the user's (its tenant's keys only) and says so.
void RemoveOwnKeys(Cluster& cluster, std::chrono::milliseconds timeout) {
  if (cluster.tenant.empty() || cluster.workers.empty()) return;
  auto removed = RunOnAll(cluster, {json{{"cmd", "remove_all"}}}, timeout);
  if (removed.ok() && (*removed)[0].value("code", "") == "OK") {
    std::cerr << "larder-bench store: removed the bench's " << (*removed)[0].value("removed", 0)
              << " object(s) (tenant '" << cluster.tenant << "')\n";
    return;
  }
  std::cerr << "larder-bench store: could not remove the bench's objects (tenant '"
            << cluster.tenant << "'): "
            << (removed.ok() ? (*removed)[0].value("message", std::string("?"))
                             : removed.status().ToString())
            << " (a master with a cluster token needs the admin token: LARDER_ADMIN_TOKEN); "
               "they stay until evicted\n";
}

int RunStoreBench(const StoreBenchOptions& options) {
  if (options.clients < 2) {
    std::cerr << "larder-bench store: --clients must be at least 2 (objects go to another "
                 "client's segment)\n";
    return 2;
  }
  std::vector<uint64_t> value_sizes;
  for (const std::string& text : SplitList(options.value_sizes)) {
    auto size = ParseByteSize(text);
    if (!size.ok()) {
      std::cerr << "larder-bench store: --value-size: " << size.status() << "\n";
      return 2;
    }
    value_sizes.push_back(*size);
  }
  std::vector<std::string> ops = SplitList(options.ops);
  for (const std::string& op : ops) {
    if (op != "put" && op != "get" && op != "mixed") {
      std::cerr << "larder-bench store: unknown --op '" << op << "' (put, get, mixed)\n";
      return 2;
    }
  }
  if (options.active < 0 || options.active > options.clients) {
    std::cerr << "larder-bench store: --active must be between 1 and --clients (0: all)\n";
    return 2;
  }
  auto cluster = StartCluster(options);
  if (!cluster.ok()) {
    std::cerr << "larder-bench store: " << cluster.status() << "\n";
    return 1;
  }
  // Whatever way the run ends, a master of the user's keeps none of the bench's objects.
  struct RemoveAtExit {
    Cluster* cluster;
    ~RemoveAtExit() { RemoveOwnKeys(*cluster, std::chrono::seconds(60)); }
  } remove_at_exit{&*cluster};
  const size_t n = cluster->workers.size();
  const size_t active = options.active == 0 ? n : static_cast<size_t>(options.active);
  auto timeout =
      std::chrono::milliseconds(static_cast<int64_t>(options.duration_s * 1000) + 120000);
  Table table({"op", "value", "batch", "active/clients", "protocol", "KV/s", "GB/s", "p50 us",
               "p99 us", "errors", "verified"});
  int exit_code = 0;
  for (uint64_t value_size : value_sizes) {
    uint64_t working_set = options.working_set != 0
                               ? options.working_set
                               : std::min<uint64_t>(options.segment_size / 2, 256ull << 20);
    uint64_t keys =
        std::max<uint64_t>(options.batch, std::min<uint64_t>(working_set / value_size, 65536));
    std::string size_tag = FormatByteSize(value_size);
    int round = 0;
    for (const std::string& op : ops) {
      ++round;
      auto base_command = [&](size_t i, const std::string& cmd) {
        return json{{"cmd", cmd},
                    {"value_size", value_size},
                    {"batch", options.batch},
                    {"zero_copy", options.zero_copy},
                    {"preferred", cluster->segments[(i + 1) % n]}};
      };
      std::string working_prefix = "ws/" + size_tag + "/";
      if (op != "put") {
        // The working set: each active client writes its keys into the next client's segment
        // (clients that only contribute their segment read nothing, so they write nothing).
        std::vector<json> fill;
        for (size_t i = 0; i < active; ++i) {
          json command = base_command(i, "put");
          command["prefix"] = working_prefix + std::to_string(i) + "/";
          command["count"] = keys;
          fill.push_back(command);
        }
        auto filled = RunOnAll(*cluster, fill, timeout);
        if (!filled.ok()) {
          std::cerr << "larder-bench store: filling the working set: " << filled.status() << "\n";
          return 1;
        }
      }
      std::vector<json> commands;
      for (size_t i = 0; i < active; ++i) {
        bool put = op == "put" || (op == "mixed" && i % 2 == 0);
        json command = base_command(i, put ? "put" : "get");
        command["duration"] = options.duration_s;
        if (put) {
          command["prefix"] =
              "run/" + size_tag + "/" + std::to_string(round) + "/" + std::to_string(i) + "/";
        } else {
          command["prefix"] = working_prefix + std::to_string(i) + "/";
          command["count"] = keys;
        }
        commands.push_back(command);
      }
      Result<std::vector<json>> replies = std::vector<json>{};
      {
        ProgressBar bar(op + " " + size_tag,
                        std::chrono::milliseconds(static_cast<int64_t>(options.duration_s * 1000)),
                        nullptr, !options.json && isatty(STDERR_FILENO));
        replies = RunOnAll(*cluster, commands, timeout);
      }
      if (!replies.ok()) {
        std::cerr << "larder-bench store: " << replies.status() << "\n";
        return 1;
      }
      Figures f = Aggregate(op, value_size, *replies);
      if (f.errors > 0 || f.wrong > 0) exit_code = 1;
      if (options.json) {
        json line = {{"bench", "store"},
                     {"op", op},
                     {"value_size", value_size},
                     {"batch", options.batch},
                     {"clients", n},
                     {"active", active},
                     {"protocol", options.protocol},
                     {"kv_per_s", f.kv_per_s},
                     {"gbps", f.gbps},
                     {"p50_us", f.p50_us},
                     {"p99_us", f.p99_us},
                     {"ops", f.ops},
                     {"errors", f.errors},
                     {"wrong", f.wrong},
                     {"verified", f.verified},
                     {"zero_copy", options.zero_copy}};
        if (!f.first_error.empty()) line["first_error"] = f.first_error;
        std::cout << line.dump() << std::endl;
      } else {
        table.AddRow({op, size_tag, std::to_string(options.batch),
                      std::to_string(active) + "/" + std::to_string(n), options.protocol,
                      Fixed(f.kv_per_s, 0), Fixed(f.gbps, 2), Fixed(f.p50_us, 0),
                      Fixed(f.p99_us, 0), std::to_string(f.errors + f.wrong),
                      std::to_string(f.verified)});
        if (!f.first_error.empty()) std::cerr << "first error: " << f.first_error << "\n";
      }
    }
  }
  if (!options.json) std::cout << table.ToString();
  RemoveOwnKeys(*cluster, std::chrono::seconds(60));
  cluster->tenant.clear();  // removed
  for (ChildProcess& worker : cluster->workers) worker.Stop(std::chrono::seconds(10));
  return exit_code;
}

}  // namespace larder::bench
