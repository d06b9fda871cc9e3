// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "bench/deployment/deployment_bench.h"

#include <signal.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include "bench/common/report.h"
#include "bench/store/store_worker.h"
#include "common/child_process.h"
#include "larder/transfer_engine.h"
#include "testing/netns.h"

namespace larder::bench {
namespace {

using json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr char kPrefillNames[2][10] = {"prefill-1", "prefill-2"};

double Since(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

bool TerminationRequested() {
  sigset_t pending;
  sigpending(&pending);
  return sigismember(&pending, SIGTERM) || sigismember(&pending, SIGINT);
}

void AddCounts(json& into, const json& from, const std::string& prefix) {
  if (!from.is_object()) return;
  for (const auto& [kind, n] : from.items()) {
    if (!n.is_number()) continue;
    into[prefix + kind] = into.value(prefix + kind, uint64_t{0}) + n.get<uint64_t>();
  }
}

double Gbps(uint64_t bytes, double seconds) { return seconds > 0 ? bytes / seconds / 1e9 : 0; }

// `protocol` with the device transport added, unless it names device already.
std::string WithDevice(const std::string& protocol) {
  return SelectsDevice(protocol) ? protocol : "device," + protocol;
}

// Where the processes run: host B is a network namespace, or this namespace under another
// LARDER_HOST_ID.
struct Topology {
  std::unique_ptr<test::NetworkNamespace> netns;
  std::string netns_reason;  // why there is none
  std::string host_a_ip = "127.0.0.1";
  std::string host_b_ip = "127.0.0.1";
  std::string host_a_id;  // LARDER_HOST_ID of host A processes ("": derive it)
  std::string host_b_id;
};

// A child process of a run and the lines it printed. The reader thread owns the child's stdout;
// the run thread writes its stdin and may kill it.
class Child {
 public:
  Child(std::string name, ChildProcess process, json ready)
      : name_(std::move(name)), process_(std::move(process)), ready_(std::move(ready)) {
    reader_ = std::thread([this] { Read(); });
  }
  ~Child() { Finish(milliseconds(0)); }

  const std::string& name() const { return name_; }
  const json& ready() const { return ready_; }

  void Send(const json& command) {
    // A dead child is noticed by its reader; nothing to do here.
    process_.WriteLine(command.dump()).IgnoreError();
  }
  void Kill() {
    killed_ = true;
    process_.Kill(SIGKILL);
  }
  bool killed() const { return killed_; }

  // Waits up to `timeout` for the child to exit after "quit", then stops it. Returns true when
  // it exited by itself with a final line.
  bool Finish(milliseconds timeout) {
    if (finished_) return clean_exit_;
    Send({{"cmd", "quit"}});
    auto deadline = SteadyClock::now() + timeout;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_until(lock, deadline, [this] { return exited_; });
      stop_reading_ = true;
    }
    if (reader_.joinable()) reader_.join();
    process_.Stop(milliseconds(0));
    finished_ = true;
    std::lock_guard<std::mutex> lock(mu_);
    clean_exit_ = latest_.value("final", false);
    return clean_exit_;
  }

  json latest() {
    std::lock_guard<std::mutex> lock(mu_);
    return latest_;
  }
  // Waits up to `timeout` for a line for which `done` is true. False when the child exits first
  // or the time passes.
  bool WaitForLine(const std::function<bool(const json&)>& done, milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return exited_ || done(latest_); }) && !exited_;
  }
  // Decode only: PD latencies of `phase` since the last call (window) and since the start.
  std::vector<double> TakeWindow(const std::string& phase) {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(window_[phase], {});
  }
  std::vector<double> AllLatencies(const std::string& phase) {
    std::lock_guard<std::mutex> lock(mu_);
    return all_[phase];
  }

 private:
  void Read() {
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_reading_) return;
      }
      auto line = process_.ReadLine(milliseconds(200));
      if (!line.ok()) {
        if (line.status().code() == StatusCode::kDeadlineExceeded) continue;
        std::lock_guard<std::mutex> lock(mu_);
        exited_ = true;
        cv_.notify_all();
        return;
      }
      json parsed = json::parse(*line, nullptr, /*allow_exceptions=*/false);
      if (!parsed.is_object()) {
        std::cerr << name_ << ": " << *line << "\n";
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (auto phases = parsed.find("phases"); phases != parsed.end() && phases->is_object()) {
        for (auto& [phase, counters] : phases->items()) {
          auto lat = counters.find("lat_ms");
          if (lat == counters.end() || !lat->is_array()) continue;
          for (const json& ms : *lat) {
            window_[phase].push_back(ms.get<double>());
            all_[phase].push_back(ms.get<double>());
          }
          counters.erase("lat_ms");
        }
      }
      latest_ = std::move(parsed);
      cv_.notify_all();
    }
  }

  const std::string name_;
  ChildProcess process_;
  const json ready_;
  std::thread reader_;
  bool killed_ = false;
  bool finished_ = false;
  bool clean_exit_ = false;

  std::mutex mu_;
  std::condition_variable cv_;
  json latest_ = json::object();                       // guarded by mu_
  bool exited_ = false;                                // guarded by mu_
  bool stop_reading_ = false;                          // guarded by mu_
  std::map<std::string, std::vector<double>> window_;  // guarded by mu_
  std::map<std::string, std::vector<double>> all_;     // guarded by mu_
};

// One run: a master, two prefills and a decode with one store protocol.
class DeploymentRun {
 public:
  DeploymentRun(const DeploymentBenchOptions& options, const Topology& topology,
                std::string protocol, std::ostream& progress)
      : options_(options),
        topology_(topology),
        protocol_(std::move(protocol)),
        device_(options.memory == "device"),
        store_engine_protocol_(device_ ? WithDevice(protocol_) : protocol_),
        // Host memory: empty, so that the PD engines resolve LARDER_PROTOCOL themselves.
        pd_protocol_(device_ ? WithDevice(ResolveProtocol(EngineRole::kPd, "")) : ""),
        progress_(progress) {}

  Result<json> Run() {
    LARDER_ASSIGN_OR_RETURN(master_, StartEmbeddedMaster(-1));
    for (const char* name : kPrefillNames) {
      LARDER_ASSIGN_OR_RETURN(auto prefill, SpawnPrefill(name));
      prefills_.push_back(std::move(prefill));
    }
    for (size_t i = 0; i < prefills_.size(); ++i) {
      const Child& other = *prefills_[1 - i];
      prefills_[i]->Send({{"cmd", "peer"},
                          {"name", other.name()},
                          {"client_id", other.ready().value("client_id", "")}});
    }
    LARDER_ASSIGN_OR_RETURN(decode_, SpawnDecode());
    LARDER_RETURN_IF_ERROR(CheckMemoryKinds());
    last_print_ = SteadyClock::now();

    if (options_.idle_baseline_s > 0) RunPhase("idle", options_.idle_baseline_s, false);
    decode_->Send({{"cmd", "phase"}, {"phase", "loaded"}});
    for (auto& prefill : prefills_) prefill->Send({{"cmd", "load"}, {"on", true}});
    loaded_start_ = SteadyClock::now();
    RunPhase("loaded", options_.duration_s, true);
    loaded_seconds_ = Since(loaded_start_);
    decode_->Send({{"cmd", "phase"}, {"phase", "stopping"}});
    for (auto& prefill : prefills_) prefill->Send({{"cmd", "load"}, {"on", false}});
    // No prefill leaves while the other may still write or read its segment: such a call fails
    // (device memory: a copy into an exporter that has gone).
    for (auto& prefill : prefills_) {
      if (prefill->killed()) continue;
      if (!prefill->WaitForLine([](const json& line) { return line.value("load_stopped", false); },
                                seconds(60))) {
        unexpected_.push_back(prefill->name() + " did not say its store load had stopped");
      }
    }

    // The decode first, so that no PD request is cut short by a prefill leaving.
    Stopped(*decode_, decode_->Finish(seconds(15)));
    for (auto& prefill : prefills_) Stopped(*prefill, prefill->Finish(seconds(60)));
    return Summary();
  }

  bool interrupted() const { return interrupted_; }

 private:
  Result<std::unique_ptr<Child>> SpawnPrefill(const std::string& name) {
    std::vector<std::string> argv = {SelfExecutable(),
                                     "deployment-prefill",
                                     "--name",
                                     name,
                                     "--master",
                                     master_->address(),
                                     "--segment-size",
                                     std::to_string(options_.segment_size),
                                     "--page-size",
                                     std::to_string(options_.page_size),
                                     "--batch",
                                     std::to_string(options_.batch),
                                     "--pd-listen",
                                     topology_.host_a_ip + ":0",
                                     "--pd-segment-size",
                                     std::to_string(options_.pd_segment_size),
                                     "--pd-page-size",
                                     std::to_string(options_.pd_page_size)};
    if (device_) {
      argv.push_back("--pd-protocol");
      argv.push_back(pd_protocol_);
      argv.push_back("--device-memory");
    }
    std::map<std::string, std::string> env = {{"LARDER_STORE_PROTOCOL", store_engine_protocol_},
                                              {"LARDER_HOST_ID", topology_.host_a_id}};
    auto process = ChildProcess::Spawn(argv, env, seconds(120));
    if (!process.ok()) return process.status().WithContext("starting " + name);
    json ready = json::parse(process->address(), nullptr, false);
    if (!ready.is_object()) return InternalError(name + " announced '" + process->address() + "'");
    return std::make_unique<Child>(name, std::move(*process), std::move(ready));
  }

  Result<std::unique_ptr<Child>> SpawnDecode() {
    std::vector<std::string> argv;
    if (topology_.netns != nullptr) argv = topology_.netns->ExecPrefix();
    for (std::string arg : {SelfExecutable(), std::string("deployment-decode"),
                            std::string("--listen"), topology_.host_b_ip + ":0"}) {
      argv.push_back(arg);
    }
    for (const auto& prefill : prefills_) {
      argv.push_back("--prefill");
      argv.push_back(prefill->name() + "=" + prefill->ready().value("pd", ""));
    }
    for (std::string arg : {std::string("--pd-pages"), std::to_string(options_.pd_pages),
                            std::string("--pd-page-size"), std::to_string(options_.pd_page_size),
                            std::string("--timeout-ms"), std::to_string(options_.pd_timeout_ms),
                            std::string("--rate"), std::to_string(options_.pd_rate)}) {
      argv.push_back(arg);
    }
    if (device_) {
      argv.push_back("--protocol");
      argv.push_back(pd_protocol_);
      argv.push_back("--device-memory");
    }
    auto process =
        ChildProcess::Spawn(argv, {{"LARDER_HOST_ID", topology_.host_b_id}}, seconds(60));
    if (!process.ok()) return process.status().WithContext("starting the decode");
    json ready = json::parse(process->address(), nullptr, false);
    if (!ready.is_object()) return InternalError("decode announced '" + process->address() + "'");
    return std::make_unique<Child>("decode", std::move(*process), std::move(ready));
  }

  // The memory each process says its KV is in: {"prefill-1": {"pd", "store"}, ..., "decode"}.
  json MemoryKinds() const {
    json kinds = json::object();
    for (const auto& prefill : prefills_) {
      kinds[prefill->name()] = {{"pd", prefill->ready().value("pd_memory", "")},
                                {"store", prefill->ready().value("store_memory", "")}};
    }
    if (decode_ != nullptr) kinds["decode"] = decode_->ready().value("memory", "");
    return kinds;
  }

  // Device memory: every segment and buffer of the KV must be device memory, or the run would
  // measure host memory under the device's name.
  Status CheckMemoryKinds() const {
    if (!device_) return Status::Ok();
    const json kinds = MemoryKinds();
    bool all_device = kinds.value("decode", "") == "device";
    for (const auto& prefill : prefills_) {
      const json own = kinds.value(prefill->name(), json::object());
      all_device =
          all_device && own.value("pd", "") == "device" && own.value("store", "") == "device";
    }
    if (all_device) return Status::Ok();
    return FailedPreconditionError(
        "--memory device: not every KV segment and buffer is device memory " + kinds.dump() +
        " (store engines: LARDER_STORE_PROTOCOL=" + store_engine_protocol_ +
        ", PD engines: " + pd_protocol_ + ")");
  }

  void Stopped(Child& child, bool clean) {
    if (clean) return;
    if (child.killed()) {
      faults_.push_back(child.name() + " was killed (SIGKILL) as asked");
    } else {
      unexpected_.push_back(child.name() + " exited without a final report");
    }
    if (child.name() == "decode") {
      ++died_["decode_died"];
    } else {
      ++died_["prefill_died." + child.name()];
    }
  }

  // Relays progress between the prefills, injects faults and prints a line per second.
  void RunPhase(const std::string& phase, double seconds_long, bool loaded) {
    auto start = SteadyClock::now();
    auto next_print = start + seconds(1);
    std::vector<uint64_t> relayed(prefills_.size(), 0);
    while (Since(start) < seconds_long) {
      if (TerminationRequested()) {
        interrupted_ = true;
        return;
      }
      for (size_t i = 0; i < prefills_.size(); ++i) {
        if (prefills_[i]->killed()) continue;
        uint64_t written = JsonU64(prefills_[i]->latest(), "written");
        if (written > relayed[i]) {
          prefills_[1 - i]->Send({{"cmd", "hw"}, {"written", written}});
          relayed[i] = written;
        }
      }
      if (loaded) InjectFaults(Since(start));
      if (SteadyClock::now() >= next_print) {
        PrintProgress(phase, Since(start));
        next_print += seconds(1);
      }
      std::this_thread::sleep_for(milliseconds(50));
    }
  }

  void InjectFaults(double t) {
    // Store ops counted in lines printed surely after the fault (lines come once a second), so
    // that the summary can show the store went on after it.
    if (fault_at_.has_value() && !store_ops_after_fault_base_.has_value() &&
        SteadyClock::now() - *fault_at_ >= milliseconds(1200)) {
      store_ops_after_fault_base_ = Store().ops;
    }
    if (options_.kill_decode_after_s >= 0 && t >= options_.kill_decode_after_s &&
        !decode_->killed()) {
      fault_at_ = SteadyClock::now();
      decode_->Kill();
      progress_ << "[" << protocol_ << "] killed the decode at " << Fixed(t, 1)
                << " s of load; the prefills carry on\n";
    }
    if (options_.kill_prefill_after_s >= 0 && t >= options_.kill_prefill_after_s &&
        !prefills_[0]->killed()) {
      fault_at_ = SteadyClock::now();
      prefills_[0]->Kill();
      prefills_[1]->Send({{"cmd", "peer_gone"}});
      progress_ << "[" << protocol_ << "] killed " << prefills_[0]->name() << " at " << Fixed(t, 1)
                << " s of load\n";
    }
  }

  struct StoreTotals {
    uint64_t ops = 0;
    uint64_t bytes = 0;
    std::map<std::string, uint64_t> by_route;
  };

  StoreTotals Store() {
    StoreTotals totals;
    for (auto& prefill : prefills_) {
      json line = prefill->latest();
      totals.ops += JsonU64(line, "puts") + JsonU64(line, "gets");
      totals.bytes += JsonU64(line, "put_bytes") + JsonU64(line, "get_bytes");
      if (auto routes = line.find("bytes_by_route"); routes != line.end()) {
        for (const auto& [route, bytes] : routes->items()) {
          totals.by_route[route] += bytes.get<uint64_t>();
        }
      }
    }
    return totals;
  }

  void PrintProgress(const std::string& phase, double t) {
    StoreTotals store = Store();
    auto now = SteadyClock::now();
    double dt = std::max(std::chrono::duration<double>(now - last_print_).count(), 1e-3);
    std::ostringstream line;
    line << "[" << protocol_ << " " << phase << " " << Fixed(t, 0) << "s] store "
         << Fixed((store.ops - last_store_.ops) / dt, 0) << " ops/s "
         << Fixed(Gbps(store.bytes - last_store_.bytes, dt), 2) << " GB/s (";
    bool first = true;
    for (const auto& [route, bytes] : store.by_route) {
      line << (first ? "" : " ") << route << " "
           << Fixed(Gbps(bytes - last_store_.by_route[route], dt), 2);
      first = false;
    }
    json decode = decode_->latest();
    json counters = decode.value("phases", json::object()).value(phase, json::object());
    uint64_t transfers = JsonU64(counters, "transfers");
    uint64_t bytes = JsonU64(counters, "bytes");
    if (phase != last_phase_) last_pd_transfers_ = last_pd_bytes_ = 0;
    std::vector<double> window = decode_->TakeWindow(phase);
    line << " GB/s; total";
    for (const auto& [route, bytes] : store.by_route) {
      line << " " << route << " " << Fixed(bytes / 1e9, 2);
    }
    line << " GB) | PD " << Fixed((transfers - last_pd_transfers_) / dt, 0) << "/s "
         << Fixed(Gbps(bytes - last_pd_bytes_, dt), 2) << " GB/s p50 "
         << Fixed(Percentile(window, 50), 2) << " p99 " << Fixed(Percentile(window, 99), 2)
         << " p999 " << Fixed(Percentile(window, 99.9), 2) << " max "
         << Fixed(Percentile(window, 100), 2) << " ms | failures ";
    json failures = Failures();
    uint64_t total = 0;
    for (const auto& [kind, n] : failures.items()) total += n.get<uint64_t>();
    line << total;
    if (total > 0) line << " " << failures.dump();
    progress_ << line.str() << "\n" << std::flush;
    last_store_ = std::move(store);
    last_pd_transfers_ = transfers;
    last_pd_bytes_ = bytes;
    last_print_ = now;
    last_phase_ = phase;
  }

  // Every failure so far, by kind: "pd.<prefill>.<code>", "store.<prefill>.<put|get>.<code>",
  // "decode_died", "prefill_died.<name>".
  json Failures() {
    json failures = json::object();
    const json phases = decode_->latest().value("phases", json::object());
    for (const auto& [phase, counters] : phases.items()) {
      AddCounts(failures, counters.value("failures_by_kind", json::object()), "pd.");
    }
    for (auto& prefill : prefills_) {
      AddCounts(failures, prefill->latest().value("failures", json::object()),
                "store." + prefill->name() + ".");
    }
    for (const auto& [kind, n] : died_) failures[kind] = failures.value(kind, 0) + n;
    for (const auto& prefill : prefills_) {
      if (prefill->killed() && died_.count("prefill_died." + prefill->name()) == 0) {
        failures["prefill_died." + prefill->name()] = 1;
      }
    }
    if (decode_->killed() && died_.count("decode_died") == 0) failures["decode_died"] = 1;
    return failures;
  }

  // The PD figures of one phase.
  json Pd(const std::string& phase, double seconds_long) {
    json counters = decode_->latest().value("phases", json::object()).value(phase, json::object());
    std::vector<double> lat = decode_->AllLatencies(phase);
    uint64_t bytes = JsonU64(counters, "bytes");
    return {
        {"transfers", JsonU64(counters, "transfers")},
        {"bytes", bytes},
        {"failures", JsonU64(counters, "failures")},
        {"gbps", Gbps(bytes, seconds_long)},
        {"transfers_per_s", seconds_long > 0 ? JsonU64(counters, "transfers") / seconds_long : 0},
        {"p50_ms", Percentile(lat, 50)},
        {"p99_ms", Percentile(lat, 99)},
        {"p999_ms", Percentile(lat, 99.9)},
        {"max_ms", Percentile(lat, 100)},
        {"routes", counters.value("routes", json::object())},
        {"bytes_by_route", counters.value("bytes_by_route", json::object())},
        {"by_prefill", counters.value("by_prefill", json::object())}};
  }

  json Summary() {
    json summary;
    summary["store_protocol"] = protocol_;
    summary["store_engine_protocol"] = store_engine_protocol_;
    summary["pd_protocol"] = device_ ? pd_protocol_ : ResolveProtocol(EngineRole::kPd, "");
    summary["memory"] = options_.memory;
    summary["memory_kinds"] = MemoryKinds();
    summary["netns"] = topology_.netns != nullptr;
    if (topology_.netns != nullptr) {
      summary["netns_name"] = topology_.netns->name();
      summary["host_a_address"] = topology_.host_a_ip;
      summary["host_b_address"] = topology_.host_b_ip;
    } else {
      summary["netns_reason"] = topology_.netns_reason;
    }
    summary["duration_s"] = loaded_seconds_;
    summary["idle_baseline_s"] = options_.idle_baseline_s;
    summary["segment_size"] = options_.segment_size;
    summary["page_size"] = options_.page_size;
    summary["pd_pages"] = options_.pd_pages;
    summary["pd_page_size"] = options_.pd_page_size;
    summary["pd_rate"] = options_.pd_rate;

    json loaded = Pd("loaded", loaded_seconds_);
    json idle = Pd("idle", options_.idle_baseline_s);
    summary["pd_transfers"] = loaded["transfers"];
    summary["pd_bytes"] = loaded["bytes"];
    summary["pd_transfers_per_s"] = loaded["transfers_per_s"];
    summary["pd_gbps"] = loaded["gbps"];
    summary["pd_p50_ms"] = loaded["p50_ms"];
    summary["pd_p99_ms"] = loaded["p99_ms"];
    summary["pd_p999_ms"] = loaded["p999_ms"];
    summary["pd_max_ms"] = loaded["max_ms"];
    summary["pd_failures"] = loaded["failures"];
    summary["pd_routes"] = loaded["routes"];
    summary["pd_bytes_by_route"] = loaded["bytes_by_route"];
    summary["pd_by_prefill"] = loaded["by_prefill"];
    summary["pd_idle_transfers"] = idle["transfers"];
    summary["pd_idle_gbps"] = idle["gbps"];
    summary["pd_idle_p50_ms"] = idle["p50_ms"];
    summary["pd_idle_p99_ms"] = idle["p99_ms"];
    summary["pd_idle_p999_ms"] = idle["p999_ms"];
    summary["pd_idle_max_ms"] = idle["max_ms"];
    // What the store's load does to the decode's tail (0 without an idle baseline).
    double idle_p99 = idle["p99_ms"].get<double>();
    summary["pd_p99_loaded_vs_idle"] = idle_p99 > 0 ? loaded["p99_ms"].get<double>() / idle_p99 : 0;
    summary["pd_idle_by_prefill"] = idle["by_prefill"];

    uint64_t pd_read = 0, pd_verified = 0;
    const json phases = decode_->latest().value("phases", json::object());
    for (const auto& [phase, counters] : phases.items()) {
      pd_read += JsonU64(counters, "bytes");
      pd_verified += JsonU64(counters, "verified_bytes");
    }

    StoreTotals store = Store();
    uint64_t puts = 0, gets = 0, missing = 0, store_read = 0, store_verified = 0, same_host_tcp = 0,
             mapped_segments = 0;
    json prefills = json::object();
    for (auto& prefill : prefills_) {
      json line = prefill->latest();
      puts += JsonU64(line, "puts");
      gets += JsonU64(line, "gets");
      missing += JsonU64(line, "missing");
      store_read += JsonU64(line, "get_bytes");
      store_verified += JsonU64(line, "verified_bytes");
      same_host_tcp += JsonU64(line, "same_host_tcp_bytes");
      mapped_segments += JsonU64(line, "mapped_segments");
      line.erase("role");
      line.erase("name");
      line["killed"] = prefill->killed();
      prefills[prefill->name()] = line;
    }
    summary["store_ops"] = store.ops;
    summary["store_puts"] = puts;
    summary["store_gets"] = gets;
    summary["store_missing"] = missing;
    summary["store_ops_per_s"] = loaded_seconds_ > 0 ? store.ops / loaded_seconds_ : 0;
    summary["store_gbps"] = Gbps(store.bytes, loaded_seconds_);
    if (store_ops_after_fault_base_.has_value()) {
      // Successful store ops at least 1.2 s after the (first) injected fault.
      summary["store_ops_after_fault"] = store.ops - *store_ops_after_fault_base_;
    }
    json by_route = json::object();
    json gbps_by_route = json::object();
    for (const auto& [route, bytes] : store.by_route) {
      by_route[route] = bytes;
      gbps_by_route[route] = Gbps(bytes, loaded_seconds_);
    }
    summary["bytes_by_route"] = by_route;
    summary["store_gbps_by_route"] = gbps_by_route;
    summary["same_host_tcp_bytes"] = same_host_tcp;
    summary["mapped_segments"] = mapped_segments;
    summary["prefills"] = prefills;

    summary["read_bytes"] = pd_read + store_read;
    summary["verified_bytes"] = pd_verified + store_verified;
    summary["pd_verified_bytes"] = pd_verified;
    summary["store_verified_bytes"] = store_verified;

    json failures = Failures();
    uint64_t total = 0, pd_failures = 0, store_failures = 0;
    for (const auto& [kind, n] : failures.items()) {
      total += n.get<uint64_t>();
      if (kind.starts_with("pd.")) pd_failures += n.get<uint64_t>();
      if (kind.starts_with("store.")) store_failures += n.get<uint64_t>();
    }
    summary["failures"] = total;
    summary["failures_by_kind"] = failures;
    // PD failures of every phase (pd_failures: the loaded phase's) and the prefills' store ones.
    summary["pd_failures_total"] = pd_failures;
    summary["store_failures"] = store_failures;
    json first_errors = json::array();
    for (auto& prefill : prefills_) {
      std::string error = prefill->latest().value("first_error", "");
      if (!error.empty()) first_errors.push_back(error);
    }
    for (const json* by_prefill : {&loaded["by_prefill"], &idle["by_prefill"]}) {
      for (const auto& [name, counters] : by_prefill->items()) {
        std::string error = counters.value("first_error", "");
        if (!error.empty()) first_errors.push_back("decode: " + error);
      }
    }
    summary["first_errors"] = first_errors;
    summary["faults_injected"] = faults_;
    summary["unexpected_exits"] = unexpected_;
    summary["interrupted"] = interrupted_;
    return summary;
  }

  const DeploymentBenchOptions& options_;
  const Topology& topology_;
  const std::string protocol_;
  const bool device_;                        // --memory device
  const std::string store_engine_protocol_;  // LARDER_STORE_PROTOCOL of the prefills
  const std::string pd_protocol_;            // of the PD engines; empty: their LARDER_PROTOCOL
  std::ostream& progress_;
  std::unique_ptr<master::MasterServer> master_;
  std::vector<std::unique_ptr<Child>> prefills_;
  std::unique_ptr<Child> decode_;
  SteadyClock::time_point loaded_start_;
  double loaded_seconds_ = 0;
  bool interrupted_ = false;
  std::map<std::string, uint64_t> died_;
  std::vector<std::string> faults_;
  std::vector<std::string> unexpected_;
  std::optional<SteadyClock::time_point> fault_at_;
  std::optional<uint64_t> store_ops_after_fault_base_;
  // Progress line state.
  StoreTotals last_store_;
  uint64_t last_pd_transfers_ = 0;
  uint64_t last_pd_bytes_ = 0;
  SteadyClock::time_point last_print_ = SteadyClock::now();
  std::string last_phase_;
};

std::string Bytes(uint64_t bytes) {
  if (bytes >= (1ull << 30)) return Fixed(bytes / double(1ull << 30), 2) + " GiB";
  if (bytes >= (1ull << 20)) return Fixed(bytes / double(1ull << 20), 1) + " MiB";
  if (bytes >= (1ull << 10) && bytes % 1024 == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

void PrintSummary(const json& s, std::ostream& out) {
  const bool device = s["memory"] == "device";
  out << "\n== store protocol " << s["store_protocol"].get<std::string>();
  if (device) out << " as " << s["store_engine_protocol"].get<std::string>();
  out << " (PD protocol " << s["pd_protocol"].get<std::string>() << ", "
      << s["memory"].get<std::string>() << " memory, decode "
      << (s["netns"].get<bool>() ? "in netns " + s["netns_name"].get<std::string>()
                                 : "in this namespace: " + s["netns_reason"].get<std::string>())
      << ")\n";
  double rate = s["pd_rate"].get<double>();
  out << "  PD requests: " << s["pd_pages"] << " x " << Bytes(s["pd_page_size"].get<uint64_t>())
      << ", " << (rate > 0 ? Fixed(rate, 0) + "/s on a fixed schedule" : "back to back") << "\n";
  out << "  PD, store hammered: " << s["pd_transfers"] << " transfers in "
      << Fixed(s["duration_s"].get<double>(), 1) << " s, " << Fixed(s["pd_gbps"].get<double>(), 2)
      << " GB/s, p50 " << Fixed(s["pd_p50_ms"].get<double>(), 2) << " ms, p99 "
      << Fixed(s["pd_p99_ms"].get<double>(), 2) << " ms, p999 "
      << Fixed(s["pd_p999_ms"].get<double>(), 2) << " ms, max "
      << Fixed(s["pd_max_ms"].get<double>(), 2) << " ms\n";
  out << "  PD, store idle:     " << s["pd_idle_transfers"] << " transfers, "
      << Fixed(s["pd_idle_gbps"].get<double>(), 2) << " GB/s, p50 "
      << Fixed(s["pd_idle_p50_ms"].get<double>(), 2) << " ms, p99 "
      << Fixed(s["pd_idle_p99_ms"].get<double>(), 2) << " ms, p999 "
      << Fixed(s["pd_idle_p999_ms"].get<double>(), 2) << " ms, max "
      << Fixed(s["pd_idle_max_ms"].get<double>(), 2) << " ms\n";
  out << "  PD p99 store hammered / idle: " << Fixed(s["pd_p99_loaded_vs_idle"].get<double>(), 2)
      << "x\n";
  out << "  PD bytes by route (store hammered):";
  for (const auto& [route, bytes] : s["pd_bytes_by_route"].items()) {
    out << " " << route << " " << Bytes(bytes.get<uint64_t>());
  }
  out << "\n";
  if (device) {
    out << "  memory kinds:";
    for (const auto& [process, kinds] : s["memory_kinds"].items()) {
      out << " " << process << " "
          << (kinds.is_object()
                  ? "pd " + kinds.value("pd", "") + " store " + kinds.value("store", "")
                  : kinds.get<std::string>());
      out << ";";
    }
    out << "\n";
  }
  out << "  store: " << s["store_ops"] << " ops (" << s["store_puts"] << " puts, "
      << s["store_gets"] << " verified gets, " << s["store_missing"] << " evicted), "
      << Fixed(s["store_gbps"].get<double>(), 2) << " GB/s; bytes by route:";
  for (const auto& [route, bytes] : s["bytes_by_route"].items()) {
    out << " " << route << " " << Bytes(bytes.get<uint64_t>());
  }
  out << "\n  same-host tcp bytes between the prefills: "
      << Bytes(s["same_host_tcp_bytes"].get<uint64_t>()) << "\n";
  out << "  verified " << Bytes(s["verified_bytes"].get<uint64_t>()) << " of "
      << Bytes(s["read_bytes"].get<uint64_t>()) << " read\n";
  out << "  failures: " << s["failures"] << " (PD " << s["pd_failures_total"] << ", store "
      << s["store_failures"] << ")";
  if (s["failures"].get<uint64_t>() > 0) out << " " << s["failures_by_kind"].dump();
  out << "\n";
  for (const auto& error : s["first_errors"]) out << "    " << error.get<std::string>() << "\n";
  for (const auto& fault : s["faults_injected"])
    out << "  fault: " << fault.get<std::string>() << "\n";
  for (const auto& exit : s["unexpected_exits"]) {
    out << "  UNEXPECTED: " << exit.get<std::string>() << "\n";
  }
}

json Comparison(const json& a, const json& b) {
  auto ratio = [](double x, double y) { return y > 0 ? x / y : 0.0; };
  json side = json::object();
  for (const json* s : {&a, &b}) {
    side[(*s)["store_protocol"].get<std::string>()] = {
        {"pd_gbps", (*s)["pd_gbps"]},
        {"pd_p99_ms", (*s)["pd_p99_ms"]},
        {"pd_p999_ms", (*s)["pd_p999_ms"]},
        {"pd_idle_p99_ms", (*s)["pd_idle_p99_ms"]},
        {"pd_p99_loaded_vs_idle", (*s)["pd_p99_loaded_vs_idle"]},
        {"store_gbps", (*s)["store_gbps"]},
        {"same_host_tcp_bytes", (*s)["same_host_tcp_bytes"]},
        {"failures", (*s)["failures"]}};
  }
  return {{"comparison", side},
          {"pd_p99_ratio", ratio(b["pd_p99_ms"].get<double>(), a["pd_p99_ms"].get<double>())},
          {"pd_gbps_ratio", ratio(b["pd_gbps"].get<double>(), a["pd_gbps"].get<double>())}};
}

void PrintComparison(const json& a, const json& b, std::ostream& out) {
  std::string na = a["store_protocol"], nb = b["store_protocol"];
  Table table({"", "store " + na, "store " + nb});
  auto row = [&](const std::string& label, const char* field, int precision) {
    table.AddRow({label, Fixed(a[field].get<double>(), precision),
                  Fixed(b[field].get<double>(), precision)});
  };
  row("PD GB/s (store hammered)", "pd_gbps", 2);
  row("PD p99 ms (store hammered)", "pd_p99_ms", 2);
  row("PD p999 ms (store hammered)", "pd_p999_ms", 2);
  row("PD p99 ms (store idle)", "pd_idle_p99_ms", 2);
  row("PD p99 hammered / idle", "pd_p99_loaded_vs_idle", 2);
  row("store GB/s", "store_gbps", 2);
  table.AddRow({"same-host tcp bytes", std::to_string(a["same_host_tcp_bytes"].get<uint64_t>()),
                std::to_string(b["same_host_tcp_bytes"].get<uint64_t>())});
  table.AddRow({"failures", std::to_string(a["failures"].get<uint64_t>()),
                std::to_string(b["failures"].get<uint64_t>())});
  out << "\n" << table.ToString();
}

}  // namespace

int RunDeploymentBench(const DeploymentBenchOptions& options) {
  if (options.store_protocols.empty() || options.duration_s <= 0 || options.batch == 0 ||
      options.pd_pages == 0 || options.pd_segment_size < options.pd_page_size ||
      (options.memory != "host" && options.memory != "device")) {
    std::cerr << "larder-bench deployment: need a store protocol, --duration > 0, --batch > 0, "
                 "--pd-pages > 0, --pd-segment-size >= --pd-page-size and --memory host or "
                 "device\n";
    return 2;
  }
  std::ostream& progress = options.json ? std::cerr : std::cout;
  // The engines' per-segment info lines would bury the progress lines; LARDER_LOG_LEVEL still
  // wins (children inherit it).
  setenv("LARDER_LOG_LEVEL", "warn", /*overwrite=*/0);

  Topology topology;
  Status netns =
      options.no_netns ? FailedPreconditionError("--no-netns was given") : test::NetnsUsable();
  if (netns.ok()) {
    auto created = test::NetworkNamespace::Create();
    if (created.ok()) {
      topology.netns = std::move(*created);
      topology.host_a_ip = topology.netns->host_a_address();
      topology.host_b_ip = topology.netns->host_b_address();
      // Empty LARDER_HOST_ID: each process derives boot id + network namespace, so the decode
      // is another host by construction.
    } else {
      netns = created.status();
    }
  }
  if (!netns.ok()) {
    topology.netns_reason = netns.ToString();
    topology.host_a_id = "larder-deployment-host-a";
    topology.host_b_id = "larder-deployment-host-b";
    std::cerr << "larder-bench deployment: no network namespace (" << netns
              << "); the decode runs in this namespace with LARDER_HOST_ID=" << topology.host_b_id
              << " and the prefills with LARDER_HOST_ID=" << topology.host_a_id << "\n";
  } else {
    progress << "host A: this namespace (" << topology.host_a_ip << "), host B: netns "
             << topology.netns->name() << " (" << topology.host_b_ip << ")\n";
  }

  std::vector<json> summaries;
  for (const std::string& protocol : options.store_protocols) {
    DeploymentRun run(options, topology, protocol, progress);
    auto summary = run.Run();
    if (!summary.ok()) {
      std::cerr << "larder-bench deployment: store protocol " << protocol << ": "
                << summary.status() << "\n";
      return 1;
    }
    if (options.json) {
      std::cout << summary->dump(-1, ' ', false, json::error_handler_t::replace) << std::endl;
    } else {
      PrintSummary(*summary, std::cout);
    }
    summaries.push_back(std::move(*summary));
    if (run.interrupted()) break;
  }
  if (summaries.size() >= 2) {
    if (options.json) {
      std::cout << Comparison(summaries[0], summaries[1]).dump() << std::endl;
    } else {
      PrintComparison(summaries[0], summaries[1], std::cout);
    }
  }
  return 0;
}

}  // namespace larder::bench
