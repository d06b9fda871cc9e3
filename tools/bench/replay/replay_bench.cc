// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Latencies and rates count the store calls only (timed in the clients); filling and verifying
// the blocks, and the parent's bookkeeping, happen outside them. The simulated caches run over
// the same requests in the same order before the replay starts, so the live progress line can
// show the store's hit rate so far beside LRU's at the same point.
#include "bench/replay/replay_bench.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "bench/common/report.h"
#include "bench/replay/lru_sim.h"
#include "bench/replay/replay_plot.h"
#include "bench/store/store_worker.h"
#include "common/child_process.h"
#include "common/env.h"
#include "master/master_server.h"

namespace larder::bench {
namespace {

using json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

// A request that takes longer than this means a client is stuck.
constexpr std::chrono::seconds kRequestTimeout{120};
// Capacities of the --plot sweep, as fractions of the unbounded footprint.
constexpr double kSweepFractions[] = {0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0};
// Points of the simulated LRU curve on the plot.
constexpr int kLruCurvePoints = 40;

double Rate(uint64_t hits, uint64_t refs) {
  return refs == 0 ? 0 : static_cast<double>(hits) / static_cast<double>(refs);
}

double Mib(uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

struct RequestOutcome {
  uint64_t hits = 0, missing = 0, retried = 0, computed = 0, errors = 0, wrong_bytes = 0;
  double ms = 0;
  std::string first_error;
  std::string retry_reason;
};

// Live counters the dispatch threads update and the progress line reads.
struct LiveCounters {
  std::atomic<uint64_t> done{0};
  std::atomic<uint64_t> refs{0};
  std::atomic<uint64_t> hits{0};
};

// "\rreplay 1G [#####.....] 42% 5012/12031 requests, hit 25.3% (LRU 26.1%)" every 200 ms, after
// the first second, while alive.
class ReplayProgress {
 public:
  ReplayProgress(std::string label, uint64_t total, const LiveCounters& live,
                 const SimulatedHits& lru, const std::vector<uint64_t>& cumulative_refs,
                 bool enabled)
      : label_(std::move(label)),
        total_(total),
        live_(live),
        lru_(lru),
        cumulative_refs_(cumulative_refs) {
    if (!enabled || total_ == 0) return;
    thread_ = std::thread([this] { Run(); });
  }
  ~ReplayProgress() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Run() {
    std::unique_lock lock(mu_);
    if (cv_.wait_for(lock, std::chrono::seconds(1), [this] { return stop_; })) return;
    while (!stop_) {
      uint64_t done = std::min(live_.done.load(), total_);
      double fraction = static_cast<double>(done) / static_cast<double>(total_);
      int filled = static_cast<int>(fraction * 30);
      std::string bar(static_cast<size_t>(filled), '#');
      bar.append(static_cast<size_t>(30 - filled), '.');
      double lru = done == 0 ? 0 : Rate(lru_.cumulative_hits[done - 1], cumulative_refs_[done - 1]);
      std::fprintf(stderr, "\r%s [%s] %3d%% %llu/%llu requests, hit %.1f%% (LRU %.1f%%)\033[K",
                   label_.c_str(), bar.c_str(), static_cast<int>(fraction * 100),
                   static_cast<unsigned long long>(done), static_cast<unsigned long long>(total_),
                   100 * Rate(live_.hits.load(), live_.refs.load()), 100 * lru);
      std::fflush(stderr);
      cv_.wait_for(lock, std::chrono::milliseconds(200), [this] { return stop_; });
    }
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }

  std::string label_;
  uint64_t total_;
  const LiveCounters& live_;
  const SimulatedHits& lru_;
  const std::vector<uint64_t>& cumulative_refs_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

struct Cluster {
  std::unique_ptr<master::MasterServer> master;  // when embedded
  std::string master_address;
  std::vector<ChildProcess> workers;
  std::vector<std::string> disk_dirs;  // removed when the run ends

  Cluster() = default;
  Cluster(Cluster&&) = default;
  Cluster& operator=(Cluster&&) = default;
  ~Cluster() {
    for (const std::string& dir : disk_dirs) {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  }
};

Result<Cluster> StartCluster(const ReplayOptions& options, uint64_t segment_size) {
  static std::atomic<int> run{0};
  int this_run = run.fetch_add(1);
  Cluster cluster;
  cluster.master_address = options.master;
  if (cluster.master_address.empty()) {
    LARDER_ASSIGN_OR_RETURN(cluster.master, StartEmbeddedMaster(-1));
    cluster.master_address = cluster.master->address();
  }
  std::string program =
      options.worker_executable.empty() ? SelfExecutable() : options.worker_executable;
  for (int i = 0; i < options.clients; ++i) {
    // Unique across runs, so that a sweep against an external master never reuses a name.
    std::string name = "replay-" + std::to_string(getpid()) + "-" + std::to_string(this_run) + "-" +
                       std::to_string(i);
    std::map<std::string, std::string> env;
    if (!options.disk_path.empty()) {
      cluster.disk_dirs.push_back(options.disk_path + "/" + name);
      env["LARDER_DISK_PATH"] = cluster.disk_dirs.back();
      env["LARDER_DISK_CAPACITY"] =
          std::to_string(options.disk_capacity / static_cast<uint64_t>(options.clients));
    }
    LARDER_ASSIGN_OR_RETURN(
        ChildProcess worker,
        ChildProcess::Spawn(
            {program, "replay-worker", "--master", cluster.master_address, "--segment-size",
             std::to_string(segment_size), "--protocol", options.protocol, "--segment-name", name,
             "--page-size", std::to_string(options.page_size), "--device",
             SelectsDevice(options.protocol) ? "0" : "-1"},
            env, std::chrono::seconds(60)));
    cluster.workers.push_back(std::move(worker));
  }
  return cluster;
}

std::string RequestLine(const TraceRequest& request) {
  std::string line = "{\"blocks\":[";
  for (size_t i = 0; i < request.blocks.size(); ++i) {
    if (i > 0) line += ',';
    line += std::to_string(request.blocks[i]);
  }
  return line + "]}";
}

Result<RequestOutcome> ParseOutcome(const std::string& line) {
  json reply = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (reply.is_discarded() || !reply.is_object() || reply.contains("error")) {
    return InternalError("replay-worker answered: " + line);
  }
  RequestOutcome outcome;
  outcome.hits = reply.value("hits", uint64_t{0});
  outcome.missing = reply.value("missing", uint64_t{0});
  outcome.retried = reply.value("retried", uint64_t{0});
  outcome.retry_reason = reply.value("retry_reason", "");
  outcome.computed = reply.value("computed", uint64_t{0});
  outcome.errors = reply.value("errors", uint64_t{0});
  outcome.wrong_bytes = reply.value("wrong_bytes", uint64_t{0});
  outcome.ms = reply.value("ms", 0.0);
  outcome.first_error = reply.value("first_error", "");
  return outcome;
}

// Sends the requests as ReplayOptions describes and collects one outcome per request.
class Dispatcher {
 public:
  Dispatcher(const ReplayOptions& options, const std::vector<TraceRequest>& requests,
             std::vector<ChildProcess>& workers, LiveCounters& live)
      : requests_(requests),
        workers_(workers),
        live_(live),
        speed_(options.speed),
        inflight_(std::clamp<int>(options.inflight == 0 ? options.clients : options.inflight, 1,
                                  static_cast<int>(workers.size()))),
        outcomes_(requests.size()) {}

  int inflight() const { return inflight_; }

  Result<std::vector<RequestOutcome>> Run() {
    start_ = SteadyClock::now();
    std::vector<std::thread> threads;
    for (size_t w = 0; w < workers_.size(); ++w) threads.emplace_back([this, w] { Serve(w); });
    for (std::thread& thread : threads) thread.join();
    if (!failure_.ok()) return failure_;
    return std::move(outcomes_);
  }

 private:
  void Serve(size_t w) {
    ChildProcess& worker = workers_[w];
    for (size_t i = w; i < requests_.size(); i += workers_.size()) {
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return !failure_.ok() || (next_ == i && in_flight_ < inflight_); });
        if (!failure_.ok()) return;
      }
      // Only this thread may send now (next_ == i), so waiting for the arrival time unlocked
      // keeps the order.
      if (speed_ > 0) {
        auto offset_ms = static_cast<double>(requests_[i].timestamp_ms - requests_[0].timestamp_ms);
        std::this_thread::sleep_until(
            start_ + std::chrono::duration_cast<SteadyClock::duration>(
                         std::chrono::duration<double, std::milli>(offset_ms / speed_)));
      }
      Status written = worker.WriteLine(RequestLine(requests_[i]));
      {
        std::lock_guard lock(mu_);
        ++next_;
        ++in_flight_;
      }
      cv_.notify_all();
      Result<RequestOutcome> outcome = RequestOutcome{};
      if (!written.ok()) {
        outcome = written;
      } else if (auto line = worker.ReadLine(kRequestTimeout); !line.ok()) {
        outcome = line.status();
      } else {
        outcome = ParseOutcome(*line);
      }
      {
        std::lock_guard lock(mu_);
        --in_flight_;
        if (!outcome.ok() && failure_.ok()) {
          failure_ = outcome.status().WithContext("replay-worker " + std::to_string(w) +
                                                  ", request " + std::to_string(i));
        }
      }
      cv_.notify_all();
      if (!outcome.ok()) return;
      live_.hits.fetch_add(outcome->hits);
      live_.refs.fetch_add(requests_[i].blocks.size());
      live_.done.fetch_add(1);
      outcomes_[i] = std::move(*outcome);
    }
  }

  const std::vector<TraceRequest>& requests_;
  std::vector<ChildProcess>& workers_;
  LiveCounters& live_;
  const double speed_;
  const int inflight_;
  SteadyClock::time_point start_;
  std::vector<RequestOutcome> outcomes_;  // slot i written only by the thread of request i

  std::mutex mu_;
  std::condition_variable cv_;
  size_t next_ = 0;    // the next request to send; guarded by mu_
  int in_flight_ = 0;  // guarded by mu_
  Status failure_;     // guarded by mu_ (read unlocked after the threads are joined)
};

Table ResultTable() {
  return Table({"capacity", "pages", "requests", "hit %", "LRU %", "unbounded %", "vs LRU", "req/s",
                "GB/s", "p50 ms", "p99 ms", "lease p50/p99 ms", "errors", "wrong B"});
}

void AddRow(Table& table, const ReplayResult& r) {
  table.AddRow({FormatByteSize(r.capacity), std::to_string(r.capacity_pages),
                std::to_string(r.requests), Fixed(100 * r.hit_rate, 2),
                Fixed(100 * r.lru_hit_rate, 2), Fixed(100 * r.unbounded_hit_rate, 2),
                r.lru_hit_rate > 0 ? Fixed(r.hit_rate / r.lru_hit_rate, 3) : "-",
                Fixed(r.requests_per_s, 0), Fixed(r.gbps, 2), Fixed(r.p50_ms, 2),
                Fixed(r.p99_ms, 2),
                r.lease_hold_p50_ms >= 0
                    ? Fixed(r.lease_hold_p50_ms, 2) + " / " + Fixed(r.lease_hold_p99_ms, 2)
                    : "-",
                std::to_string(r.errors), std::to_string(r.wrong_bytes)});
}

bool Failed(const ReplayResult& result) { return result.errors > 0 || result.wrong_bytes > 0; }

// Capacities of the sweep: fractions of the footprint, rounded to whole pages per client, at
// least one page per client, without repeats.
std::vector<uint64_t> SweepCapacities(const ReplayOptions& options, uint64_t distinct_blocks) {
  std::vector<uint64_t> capacities;
  uint64_t unit = options.page_size * static_cast<uint64_t>(options.clients);
  for (double fraction : kSweepFractions) {
    auto pages =
        static_cast<uint64_t>(std::llround(fraction * static_cast<double>(distinct_blocks)));
    uint64_t capacity = std::max<uint64_t>(1, (pages * options.page_size + unit - 1) / unit) * unit;
    if (capacities.empty() || capacities.back() != capacity) capacities.push_back(capacity);
  }
  return capacities;
}

}  // namespace

std::string ReplayResult::ToJson() const {
  json out = {{"bench", "replay"},
              {"trace", trace},
              {"requests", requests},
              {"block_refs", block_refs},
              {"hit_blocks", hit_blocks},
              {"hit_rate", hit_rate},
              {"lru_hit_blocks", lru_hit_blocks},
              {"lru_hit_rate", lru_hit_rate},
              {"unbounded_hit_blocks", unbounded_hit_blocks},
              {"unbounded_hit_rate", unbounded_hit_rate},
              {"vs_lru", lru_hit_rate > 0 ? hit_rate / lru_hit_rate : 0.0},
              {"distinct_blocks", distinct_blocks},
              {"page_size", page_size},
              {"capacity", capacity},
              {"capacity_pages", capacity_pages},
              {"clients", clients},
              {"inflight", inflight},
              {"protocol", protocol},
              {"speed", speed > 0 ? json(speed) : json("max")},
              {"seconds", seconds},
              {"requests_per_s", requests_per_s},
              {"gbps", gbps},
              {"p50_ms", p50_ms},
              {"p99_ms", p99_ms},
              {"missing", missing},
              {"retried", retried},
              {"computed", computed},
              {"errors", errors},
              {"wrong_bytes", wrong_bytes}};
  if (disk_capacity > 0) {
    out["disk_capacity"] = disk_capacity;
    out["lru_tiered_hit_blocks"] = lru_tiered_hit_blocks;
    out["lru_tiered_hit_rate"] = lru_tiered_hit_rate;
    out["vs_lru_tiered"] = lru_tiered_hit_rate > 0 ? hit_rate / lru_tiered_hit_rate : 0.0;
    if (disk_hits >= 0) out["disk_hits"] = disk_hits;
    if (demoted >= 0) out["demoted"] = demoted;
    if (evicted_without_copy >= 0) out["evicted_without_copy"] = evicted_without_copy;
  }
  if (evictions >= 0) out["evictions"] = evictions;
  if (lease_expiries >= 0) out["lease_expiries"] = lease_expiries;
  if (put_refusals >= 0) out["put_refusals"] = put_refusals;
  if (lease_hold_p50_ms >= 0) out["lease_hold_p50_ms"] = lease_hold_p50_ms;
  if (lease_hold_p99_ms >= 0) out["lease_hold_p99_ms"] = lease_hold_p99_ms;
  if (eviction_scanned_per_eviction >= 0) {
    out["eviction_scanned_per_eviction"] = eviction_scanned_per_eviction;
  }
  if (eviction_run_p50_us >= 0) out["eviction_run_p50_us"] = eviction_run_p50_us;
  if (eviction_run_p99_us >= 0) out["eviction_run_p99_us"] = eviction_run_p99_us;
  if (!first_error.empty()) out["first_error"] = first_error;
  if (!retry_reason.empty()) out["retry_reason"] = retry_reason;
  return out.dump();
}

Result<ReplayResult> RunReplay(const ReplayOptions& options,
                               const std::vector<TraceRequest>& requests,
                               const std::string& trace_name) {
  if (options.clients < 1) return InvalidArgumentError("--clients must be at least 1");
  if (options.page_size == 0) return InvalidArgumentError("--page-size must be positive");
  if (options.speed < 0) return InvalidArgumentError("--speed must be positive or max");
  uint64_t pages_per_client = options.capacity / options.page_size / options.clients;
  if (pages_per_client == 0) {
    return InvalidArgumentError("--capacity " + std::to_string(options.capacity) +
                                " is less than one page per client");
  }
  uint64_t segment_size = pages_per_client * options.page_size;

  ReplayResult result;
  result.trace = trace_name;
  result.requests = requests.size();
  result.page_size = options.page_size;
  result.capacity_pages = pages_per_client * options.clients;
  result.capacity = result.capacity_pages * options.page_size;
  result.clients = options.clients;
  result.protocol = options.protocol;
  result.speed = options.speed;

  if (!options.disk_path.empty()) {
    if (options.disk_capacity == 0) return InvalidArgumentError("--disk-capacity must be positive");
    result.disk_capacity = options.disk_capacity;
    SimulatedHits tiered = SimulatePrefixCache(
        requests, result.capacity_pages + options.disk_capacity / options.page_size);
    result.lru_tiered_hit_blocks = tiered.hit_blocks;
    result.lru_tiered_hit_rate = tiered.hit_rate();
  }
  SimulatedHits lru = SimulatePrefixCache(requests, result.capacity_pages);
  SimulatedHits unbounded = SimulatePrefixCache(requests, 0);
  result.block_refs = lru.block_refs;
  result.lru_hit_blocks = lru.hit_blocks;
  result.lru_hit_rate = lru.hit_rate();
  result.unbounded_hit_blocks = unbounded.hit_blocks;
  result.unbounded_hit_rate = unbounded.hit_rate();
  result.distinct_blocks = unbounded.distinct_blocks;
  std::vector<uint64_t> cumulative_refs;
  cumulative_refs.reserve(requests.size());
  for (const TraceRequest& request : requests) {
    cumulative_refs.push_back((cumulative_refs.empty() ? 0 : cumulative_refs.back()) +
                              request.blocks.size());
  }

  LARDER_ASSIGN_OR_RETURN(Cluster cluster, StartCluster(options, segment_size));
  LiveCounters live;
  Dispatcher dispatcher(options, requests, cluster.workers, live);
  result.inflight = dispatcher.inflight();
  Result<std::vector<RequestOutcome>> outcomes = std::vector<RequestOutcome>{};
  auto start = SteadyClock::now();
  {
    ReplayProgress progress("replay " + FormatByteSize(result.capacity), requests.size(), live, lru,
                            cumulative_refs,
                            options.progress && !options.json && isatty(STDERR_FILENO));
    outcomes = dispatcher.Run();
  }
  result.seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  for (ChildProcess& worker : cluster.workers) worker.Stop(std::chrono::seconds(10));
  if (cluster.master) {
    master::MasterStats stats = cluster.master->state().Stats();
    result.evictions = static_cast<int64_t>(stats.evictions);
    result.lease_expiries = static_cast<int64_t>(stats.lease_expiries);
    result.put_refusals = static_cast<int64_t>(stats.put_refusals_no_space);
    if (!options.disk_path.empty()) {
      const master::DiskTierCounters& disk = cluster.master->state().disk().counters();
      result.disk_hits = static_cast<int64_t>(disk.disk_hits.load());
      result.demoted = static_cast<int64_t>(disk.demoted.load());
      result.evicted_without_copy = static_cast<int64_t>(disk.evicted_dropped.load());
    }
    master::LatencyHistogram::Snapshot held = cluster.master->state().LeaseHoldTimes();
    result.lease_hold_p50_ms = held.Quantile(0.5) / 1e6;
    result.lease_hold_p99_ms = held.Quantile(0.99) / 1e6;
    if (stats.evictions > 0) {
      result.eviction_scanned_per_eviction =
          static_cast<double>(stats.eviction_scanned) / static_cast<double>(stats.evictions);
    }
    master::LatencyHistogram::Snapshot runs = cluster.master->state().EvictionTimes();
    if (runs.count > 0) {
      result.eviction_run_p50_us = runs.Quantile(0.5) / 1e3;
      result.eviction_run_p99_us = runs.Quantile(0.99) / 1e3;
    }
  }
  LARDER_RETURN_IF_ERROR(outcomes.status());

  std::vector<double> latencies;
  latencies.reserve(outcomes->size());
  for (const RequestOutcome& outcome : *outcomes) {
    result.hit_blocks += outcome.hits;
    result.missing += outcome.missing;
    result.retried += outcome.retried;
    if (result.retry_reason.empty()) result.retry_reason = outcome.retry_reason;
    result.computed += outcome.computed;
    result.errors += outcome.errors;
    result.wrong_bytes += outcome.wrong_bytes;
    if (result.first_error.empty()) result.first_error = outcome.first_error;
    latencies.push_back(outcome.ms);
  }
  result.hit_rate = Rate(result.hit_blocks, result.block_refs);
  if (result.seconds > 0) {
    result.requests_per_s = static_cast<double>(result.requests) / result.seconds;
    result.gbps = static_cast<double>((result.hit_blocks + result.computed) * options.page_size) /
                  result.seconds / 1e9;
  }
  result.p50_ms = Percentile(latencies, 50);
  result.p99_ms = Percentile(latencies, 99);
  return result;
}

int RunReplayBench(const ReplayOptions& options) {
  std::string trace = options.trace.empty() ? DefaultTracePath() : options.trace;
  if (trace.empty()) {
    std::cerr << "larder-bench replay: no trace: pass --trace FILE or set LARDER_TRACE (default "
              << kFetchedTracePath << " is not there; docs/replay.md says where to get it)\n";
    return 2;
  }
  auto requests = LoadTrace(trace, options.requests);
  if (!requests.ok()) {
    std::cerr << "larder-bench replay: " << requests.status() << "\n";
    return 2;
  }
  if (requests->empty()) {
    std::cerr << "larder-bench replay: trace '" << trace << "' has no requests\n";
    return 2;
  }
  if (options.repeat_prefixes > 0) {
    *requests = RepeatPrefixes(*requests, options.repeat_prefixes);
    trace += " (prefixes repeated after " + std::to_string(options.repeat_prefixes) + ")";
  }

  int exit_code = 0;
  Table table = ResultTable();
  auto report = [&](const ReplayResult& result) {
    if (Failed(result)) exit_code = 1;
    if (options.json) {
      std::cout << result.ToJson() << std::endl;
    } else {
      AddRow(table, result);
      if (!result.first_error.empty()) std::cerr << "first error: " << result.first_error << "\n";
    }
  };
  auto main_run = RunReplay(options, *requests, trace);
  if (!main_run.ok()) {
    std::cerr << "larder-bench replay: " << main_run.status() << "\n";
    return 1;
  }
  report(*main_run);

  if (!options.plot.empty()) {
    HitRateSeries larder{
        "Larder (" + std::to_string(options.clients) + " clients, " + options.protocol + ")",
        {},
        /*with_points=*/true,
        /*dashed=*/false};
    std::vector<std::pair<uint64_t, double>> measured = {{main_run->capacity, main_run->hit_rate}};
    for (uint64_t capacity : SweepCapacities(options, main_run->distinct_blocks)) {
      if (capacity == main_run->capacity) continue;
      ReplayOptions point = options;
      point.capacity = capacity;
      auto result = RunReplay(point, *requests, trace);
      if (!result.ok()) {
        std::cerr << "larder-bench replay: sweep at " << FormatByteSize(capacity) << ": "
                  << result.status() << "\n";
        return 1;
      }
      report(*result);
      measured.emplace_back(result->capacity, result->hit_rate);
    }
    std::sort(measured.begin(), measured.end());
    for (const auto& [capacity, rate] : measured) larder.points.emplace_back(Mib(capacity), rate);

    // The simulated curves are cheap: draw them finely, to the largest capacity measured.
    uint64_t largest_pages = measured.back().first / options.page_size;
    HitRateSeries lru{"exact LRU (simulated)", {}, false, false};
    for (int i = 1; i <= kLruCurvePoints; ++i) {
      uint64_t pages = std::max<uint64_t>(1, largest_pages * i / kLruCurvePoints);
      lru.points.emplace_back(Mib(pages * options.page_size),
                              SimulatePrefixCache(*requests, pages).hit_rate());
    }
    HitRateSeries unbounded{"unbounded cache (simulated)",
                            {{0, main_run->unbounded_hit_rate},
                             {Mib(measured.back().first), main_run->unbounded_hit_rate}},
                            false,
                            true};
    std::string name = trace.substr(trace.find_last_of('/') + 1);
    HitRatePlot plot{"Prefix-block hit rate vs pool capacity: " + name + ", " +
                         std::to_string(requests->size()) + " requests, " +
                         FormatByteSize(options.page_size) + " pages",
                     {larder, lru, unbounded}};
    Status drawn = WriteHitRatePlot(plot, options.plot);
    if (!drawn.ok()) {
      std::cerr << "larder-bench replay: --plot: " << drawn << "\n";
      exit_code = 1;
    } else if (!options.json) {
      std::cerr << "plot: " << options.plot << "\n";
    }
  }
  if (!options.json) std::cout << table.ToString();
  return exit_code;
}

}  // namespace larder::bench
