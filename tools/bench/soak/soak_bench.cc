// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The master and the clients are real processes: only a SIGKILLed process is a crash, and only a
// SIGSTOPped one is a stall that no thread of it can notice.
#include "bench/soak/soak_bench.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/common/report.h"
#include "bench/failover/failover_probe.h"
#include "common/child_process.h"
#include "common/env.h"
#include "testing/master_process.h"

namespace larder::bench {
namespace {

using json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int64_t kSecondNs = 1'000'000'000;
// How often the RSS and fds of a process go into its series.
constexpr int64_t kSeriesEveryNs = 10 * kSecondNs;

int64_t NowNs() { return FailoverProbe::NowNs(); }

int64_t ToNs(double seconds) { return static_cast<int64_t>(seconds * 1e9); }

// What /proc says of a process.
struct ProcSample {
  bool alive = false;  // exists and is not a zombie
  uint64_t rss = 0;
  uint64_t rss_anon = 0;  // without shared memory (the segments) and files: the heap
  uint64_t fds = 0;
};

ProcSample SampleProcess(pid_t pid) {
  ProcSample sample;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.starts_with("State:")) sample.alive = line.find('Z') == std::string::npos;
    if (line.starts_with("VmRSS:")) sample.rss = std::stoull(line.substr(6)) * 1024;
    if (line.starts_with("RssAnon:")) sample.rss_anon = std::stoull(line.substr(8)) * 1024;
  }
  std::error_code error;
  for (std::filesystem::directory_iterator it("/proc/" + std::to_string(pid) + "/fd", error), end;
       !error && it != end; it.increment(error)) {
    ++sample.fds;
  }
  return sample;
}

// One process slot (the master, or a client) through its incarnations: its RSS and fds, and
// their growth since the current incarnation's warm-up.
struct Tracked {
  std::string name;
  pid_t pid = -1;
  int incarnation = 0;
  int64_t started_ns = 0;
  std::optional<ProcSample> baseline;
  ProcSample last;
  json series = json::array();
  int64_t series_at_ns = 0;

  void Started(pid_t new_pid, int64_t now) {
    pid = new_pid;
    ++incarnation;
    started_ns = now;
    baseline.reset();
    last = ProcSample{};
  }
  void Sample(int64_t now, int64_t warmup_ns, double t_s) {
    last = SampleProcess(pid);
    if (!last.alive) return;
    if (!baseline && now - started_ns >= warmup_ns) baseline = last;
    if (now - series_at_ns >= kSeriesEveryNs) {
      series.push_back({t_s, last.rss, last.rss_anon, last.fds});
      series_at_ns = now;
    }
  }
  // The growth of one field of the sample (e.g. &ProcSample::fds) since the warm-up; null before
  // this incarnation has a baseline.
  json Growth(uint64_t ProcSample::*field) const {
    return baseline
               ? json(static_cast<int64_t>(last.*field) - static_cast<int64_t>((*baseline).*field))
               : json(nullptr);
  }
};

struct Client {
  ChildProcess process;
  std::string segment;           // kept across incarnations: a restart takes its segment over
  std::string prefix;            // keys of this incarnation
  json status = json::object();  // this incarnation's latest soak_status
  bool stalled = false;
  Tracked tracked;
};

// A fault, from just before it was injected to its end (INT64_MAX while it lasts).
struct Window {
  std::string kind;
  std::string target;
  int64_t start_ns = 0;
  int64_t end_ns = INT64_MAX;
};

// The counts of soak_status that add up over clients and incarnations.
constexpr const char* kCounts[] = {"ops",     "puts", "gets",       "removes",
                                   "missing", "busy", "wrong_keys", "wrong_bytes"};

class SoakRun {
 public:
  explicit SoakRun(const SoakBenchOptions& options)
      : options_(options), rng_(options.seed), clients_(static_cast<size_t>(options.clients)) {
    for (const char* count : kCounts) totals_[count] = uint64_t{0};
    master_.name = "master";
    for (size_t i = 0; i < clients_.size(); ++i) {
      clients_[i].segment = "soak-" + std::to_string(getpid()) + "-" + std::to_string(i);
      clients_[i].tracked.name = "client-" + std::to_string(i);
    }
  }
  ~SoakRun() {
    for (Client& client : clients_) {
      if (client.stalled) client.process.Kill(SIGCONT);
      client.process.Stop(seconds(5));
    }
    master_process_.process.Kill(SIGCONT);
    master_process_.process.Stop(seconds(5));
  }

  Result<json> Run() {
    start_ns_ = NowNs();
    last_print_ns_ = start_ns_;
    LARDER_RETURN_IF_ERROR(StartMaster("0"));
    port_ = master_process_.port();
    for (size_t i = 0; i < clients_.size(); ++i) LARDER_RETURN_IF_ERROR(StartClient(i));
    Progress("master on " + master_process_.address + ", " + std::to_string(clients_.size()) +
             " clients with " + FormatByteSize(options_.segment_size) + " segments, faults every " +
             Fixed(options_.fault_every_s, 0) + " s after " + Fixed(options_.warmup_s, 0) +
             " s of warm-up");
    next_fault_ns_ = start_ns_ + ToNs(options_.warmup_s);
    next_kind_ = options_.faults.empty() ? 0 : options_.seed % options_.faults.size();
    const int64_t end_ns = start_ns_ + ToNs(options_.duration_s);
    int64_t next_print_ns = start_ns_ + 10 * kSecondNs;
    while (NowNs() < end_ns) {
      const auto tick = SteadyClock::now() + seconds(1);
      LARDER_RETURN_IF_ERROR(Step());
      if (NowNs() >= next_print_ns) {
        PrintProgress();
        next_print_ns += 10 * kSecondNs;
      }
      std::this_thread::sleep_until(tick);
    }
    if (active_) LARDER_RETURN_IF_ERROR(EndFault());
    // A last report of every client, after which the load stops with the processes.
    PollClients();
    duration_s_ = static_cast<double>(NowNs() - start_ns_) / 1e9;
    return Summary();
  }

 private:
  void Progress(const std::string& text) const { std::cerr << "soak: " << text << std::endl; }
  double T(int64_t ns) const { return static_cast<double>(ns - start_ns_) / 1e9; }

  std::map<std::string, std::string> ChildEnv() const {
    std::map<std::string, std::string> env;
    if (GetEnv("LARDER_LOG_LEVEL").empty()) env["LARDER_LOG_LEVEL"] = "error";
    env["LARDER_MASTER_CONNECT_TIMEOUT"] = "60s";
    return env;
  }

  Status StartMaster(const std::string& port) {
    const auto deadline = SteadyClock::now() + seconds(30);
    std::vector<std::string> flags = {"--client-ttl",
                                      std::to_string(ToNs(options_.client_ttl_s) / 1000000) + "ms"};
    for (;;) {
      // On a fixed port the killed master's socket may linger a moment.
      auto master = test::SpawnMaster(options_.master_binary, port, flags, ChildEnv());
      if (master.ok()) {
        master_process_ = std::move(*master);
        master_.Started(master_process_.process.pid(), NowNs());
        return Status::Ok();
      }
      if (SteadyClock::now() >= deadline) return master.status().WithContext("starting the master");
      std::this_thread::sleep_for(milliseconds(100));
    }
  }

  Status StartClient(size_t slot) {
    Client& client = clients_[slot];
    std::map<std::string, std::string> env = ChildEnv();
    if (!options_.disk_path.empty()) {
      env["LARDER_DISK_PATH"] = options_.disk_path + "/slot-" + std::to_string(slot);
      env["LARDER_DISK_CAPACITY"] = std::to_string(options_.disk_capacity);
    }
    LARDER_ASSIGN_OR_RETURN(
        client.process,
        ChildProcess::Spawn({SelfExecutable(), "store-worker", "--master", master_process_.address,
                             "--segment-size", std::to_string(options_.segment_size), "--protocol",
                             options_.protocol, "--segment-name", client.segment},
                            env, seconds(90)));
    client.tracked.Started(client.process.pid(), NowNs());
    client.prefix =
        "soak/" + std::to_string(slot) + "." + std::to_string(client.tracked.incarnation) + "/";
    client.status = json::object();
    client.stalled = false;
    json start = {
        {"cmd", "soak_start"},
        {"prefix", client.prefix},
        {"min_value", options_.min_value},
        {"max_value", options_.max_value},
        {"batch", options_.batch},
        {"interval_us", static_cast<int64_t>(options_.interval_ms * 1000)},
        // About what a segment holds: most gets should find their key.
        {"recent", std::max<uint64_t>(
                       options_.segment_size / ((options_.min_value + options_.max_value) / 2), 1)},
        {"seed", options_.seed * 1000 + slot * 10 + client.tracked.incarnation}};
    LARDER_RETURN_IF_ERROR(client.process.WriteLine(start.dump()));
    LARDER_ASSIGN_OR_RETURN(std::string line, client.process.ReadLine(seconds(30)));
    json reply = json::parse(line, nullptr, false);
    if (!reply.is_object() || !reply.value("started", false)) {
      return InternalError(client.tracked.name + " answered soak_start with " + line);
    }
    return Status::Ok();
  }

  // One second of the run: the clients' reports, the processes' figures, the faults.
  Status Step() {
    PollClients();
    const int64_t now = NowNs();
    master_.Sample(now, ToNs(options_.warmup_s), T(now));
    const bool master_expected_down = active_ && active_->kind == "master_restart";
    if (!master_.last.alive && !master_expected_down) {
      unexpected_exits_.push_back("master (pid " + std::to_string(master_.pid) + ") at " +
                                  Fixed(T(now), 1) + " s");
      master_process_.process.Stop(seconds(1));
      LARDER_RETURN_IF_ERROR(StartMaster(port_));
    }
    for (size_t i = 0; i < clients_.size(); ++i) {
      clients_[i].tracked.Sample(now, ToNs(options_.warmup_s), T(now));
    }
    if (active_ && SteadyClock::now() >= active_until_) LARDER_RETURN_IF_ERROR(EndFault());
    if (!active_ && !options_.faults.empty() && now >= next_fault_ns_) {
      LARDER_RETURN_IF_ERROR(BeginFault());
      next_fault_ns_ = now + ToNs(options_.fault_every_s);
    }
    return Status::Ok();
  }

  void PollClients() {
    // The peers' key ranges, relayed with each poll.
    std::map<std::string, uint64_t> ranges;
    for (const Client& client : clients_) ranges[client.prefix] = JsonU64(client.status, "next");
    for (size_t i = 0; i < clients_.size(); ++i) {
      Client& client = clients_[i];
      if (client.stalled) continue;
      json peers = json::object();
      for (const auto& [prefix, next] : ranges) {
        if (prefix != client.prefix) peers[prefix] = next;
      }
      Status sent = client.process.WriteLine(json{{"cmd", "soak_status"}, {"peers", peers}}.dump());
      auto line = sent.ok() ? client.process.ReadLine(seconds(10)) : Result<std::string>(sent);
      if (!line.ok()) {
        if (line.status().code() == StatusCode::kDeadlineExceeded) continue;  // asked again later
        unexpected_exits_.push_back(client.tracked.name + " (pid " +
                                    std::to_string(client.tracked.pid) + ") at " +
                                    Fixed(T(NowNs()), 1) + " s: " + line.status().ToString());
        client.process.Stop(seconds(1));
        Status restarted = StartClient(i);
        if (!restarted.ok())
          Progress("restarting " + client.tracked.name + ": " + restarted.ToString());
        continue;
      }
      json status = json::parse(*line, nullptr, false);
      if (!status.is_object() || status.contains("error")) {
        CountUnexpected("protocol", client.tracked.name + " answered soak_status with " + *line, 1);
        continue;
      }
      Absorb(client, status);
    }
  }

  // Adds what a client did since its previous report.
  void Absorb(Client& client, const json& status) {
    for (const char* count : kCounts) {
      uint64_t now = JsonU64(status, count), before = JsonU64(client.status, count);
      if (now > before) totals_[count] = totals_[count].get<uint64_t>() + (now - before);
    }
    for (const json& failure : status.value("failures", json::array())) {
      std::string kind = failure.value("op", "") + ":" + failure.value("code", "");
      uint64_t keys = failure.value("keys", uint64_t{1});
      const int64_t from = failure.value("t0_ns", int64_t{0});
      const int64_t to = failure.value("t_ns", int64_t{0});
      if (failure.value("code", "") != "wrong" && Explained(from, to)) {
        expected_[kind] = expected_.value(kind, uint64_t{0}) + keys;
        expected_total_ += keys;
      } else {
        CountUnexpected(
            kind,
            client.tracked.name + " at " + Fixed(T(to), 1) + " s: " + failure.value("message", ""),
            keys);
      }
    }
    if (uint64_t dropped = JsonU64(status, "failures_dropped"); dropped > 0) {
      // Batches past the worker's bound carry no time: explained only while a fault is on.
      if (Explained(NowNs() - kSecondNs, NowNs())) {
        expected_["dropped_batches"] = expected_.value("dropped_batches", uint64_t{0}) + dropped;
        expected_total_ += dropped;
      } else {
        CountUnexpected("dropped_batches", client.tracked.name + ": failures past the bound",
                        dropped);
      }
    }
    json kept = status;
    kept.erase("failures");
    client.status = std::move(kept);
  }

  // A failure is explained by a fault when its span [from, to] (a client's run of failures of one
  // kind, SoakLoad::Fail) meets the fault or the grace after it: a run that began just before the
  // fault's start was recorded belongs to it as much as one wholly inside.
  bool Explained(int64_t from_ns, int64_t to_ns) const {
    const int64_t grace = ToNs(options_.grace_s);
    for (const Window& window : windows_) {
      const int64_t end = window.end_ns == INT64_MAX ? INT64_MAX : window.end_ns + grace;
      if (to_ns >= window.start_ns && from_ns <= end) return true;
    }
    return false;
  }

  void CountUnexpected(const std::string& kind, const std::string& message, uint64_t n) {
    unexpected_[kind] = unexpected_.value(kind, uint64_t{0}) + n;
    unexpected_total_ += n;
    if (first_unexpected_.size() < 10) first_unexpected_.push_back(message);
    if (message.find("larder-master") != std::string::npos &&
        message.find("unreachable") != std::string::npos) {
      DumpMasterStacks();
    }
  }

  // The first time a client finds the master unreachable with no fault to explain it, what the
  // master's threads are doing goes to a file (with gdb, where there is one): a master that is
  // still stuck shows where.
  void DumpMasterStacks() {
    if (!master_stacks_.is_null() || !std::filesystem::exists("/usr/bin/gdb")) return;
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("larder-soak-" + std::to_string(getpid()) + "-master-stacks.txt"))
                                 .string();
    const std::string command = "/usr/bin/gdb -batch -p " + std::to_string(master_.pid) +
                                " -ex 'thread apply all bt' > " + path + " 2>&1";
    const int rc = std::system(command.c_str());
    master_stacks_ = path;
    Progress("the master was unreachable: its stacks at " + Fixed(T(NowNs()), 1) + " s are in " +
             path + (rc == 0 ? "" : " (gdb failed)"));
  }

  Status BeginFault() {
    const std::string kind = options_.faults[next_kind_];
    next_kind_ = (next_kind_ + 1) % options_.faults.size();
    const size_t slot = rng_() % clients_.size();
    Window window;
    window.kind = kind;
    window.start_ns = NowNs();
    active_until_ = SteadyClock::now();
    if (kind == "client_kill") {
      Client& client = clients_[slot];
      window.target = client.tracked.name;
      client.process.Kill(SIGKILL);
      client.process.Stop(seconds(5));
      // Its last counts stay in the totals; the next incarnation counts from zero.
      LARDER_RETURN_IF_ERROR(StartClient(slot).WithContext("restarting " + window.target));
    } else if (kind == "master_restart") {
      window.target = "master";
      master_process_.process.Kill(SIGKILL);
      master_process_.process.Stop(seconds(5));
      LARDER_RETURN_IF_ERROR(StartMaster(port_));
    } else if (kind == "master_pause") {
      window.target = "master";
      master_process_.process.Kill(SIGSTOP);
      active_until_ += milliseconds(ToNs(options_.client_ttl_s + 2) / 1000000);
    } else if (kind == "peer_stall") {
      Client& client = clients_[slot];
      window.target = client.tracked.name;
      client.process.Kill(SIGSTOP);
      client.stalled = true;
      stalled_slot_ = slot;
      active_until_ += milliseconds(ToNs(options_.stall_s) / 1000000);
    }
    Progress(kind + " of " + window.target + " at " + Fixed(T(window.start_ns), 1) + " s");
    windows_.push_back(std::move(window));
    active_ = windows_.back();
    return Status::Ok();
  }

  Status EndFault() {
    if (active_->kind == "master_pause") master_process_.process.Kill(SIGCONT);
    if (active_->kind == "peer_stall") {
      clients_[stalled_slot_].process.Kill(SIGCONT);
      clients_[stalled_slot_].stalled = false;
    }
    const int64_t end = NowNs();
    windows_.back().end_ns = end;
    faults_.push_back({{"kind", active_->kind},
                       {"target", active_->target},
                       {"at_s", T(active_->start_ns)},
                       {"took_s", static_cast<double>(end - active_->start_ns) / 1e9}});
    active_.reset();
    return Status::Ok();
  }

  void PrintProgress() {
    const int64_t now = NowNs();
    const double dt = std::max(static_cast<double>(now - last_print_ns_) / 1e9, 1e-3);
    const uint64_t ops = totals_["ops"].get<uint64_t>();
    uint64_t rss_min = UINT64_MAX, rss_max = 0;
    for (const Client& client : clients_) {
      rss_min = std::min(rss_min, client.tracked.last.rss);
      rss_max = std::max(rss_max, client.tracked.last.rss);
    }
    Progress("[" + Fixed(T(now), 0) + " s] " + Fixed((ops - last_print_ops_) / dt, 0) +
             " ops/s | misses " + std::to_string(totals_["missing"].get<uint64_t>()) +
             " | errors expected " + std::to_string(expected_total_) + " unexpected " +
             std::to_string(unexpected_total_) + " | wrong " +
             std::to_string(totals_["wrong_keys"].get<uint64_t>()) + " | faults " +
             std::to_string(faults_.size()) + " | RSS master " + FormatByteSize(master_.last.rss) +
             ", clients " + FormatByteSize(rss_min) + ".." + FormatByteSize(rss_max) +
             " | fds master " + std::to_string(master_.last.fds));
    last_print_ns_ = now;
    last_print_ops_ = ops;
  }

  json Summary() const {
    json out = json::object();
    out["bench"] = "soak";
    out["duration_s"] = duration_s_;
    out["clients"] = options_.clients;
    out["protocol"] = options_.protocol;
    if (!options_.disk_path.empty()) out["disk_capacity"] = options_.disk_capacity;
    for (const char* count : kCounts) out[count] = totals_.at(count);
    out["ops_per_s"] = duration_s_ > 0 ? totals_.at("ops").get<double>() / duration_s_ : 0;
    out["faults_injected"] = faults_.size();
    out["faults"] = faults_;
    json by_kind = json::object();
    for (const json& fault : faults_) {
      std::string kind = fault["kind"];
      by_kind[kind] = by_kind.value(kind, 0) + 1;
    }
    out["faults_by_kind"] = by_kind;
    out["expected_errors"] = expected_total_;
    out["unexpected_errors"] = unexpected_total_;
    out["errors_by_class"] = {{"expected", expected_}, {"unexpected", unexpected_}};
    out["first_unexpected"] = first_unexpected_;
    out["unexpected_exits"] = unexpected_exits_;
    out["master_stacks"] = master_stacks_;
    json rss = json::object(), anon = json::object(), fds = json::object();
    json processes = json::object();
    std::vector<const Tracked*> tracked = {&master_};
    for (const Client& client : clients_) tracked.push_back(&client.tracked);
    for (const Tracked* process : tracked) {
      rss[process->name] = process->Growth(&ProcSample::rss);
      anon[process->name] = process->Growth(&ProcSample::rss_anon);
      fds[process->name] = process->Growth(&ProcSample::fds);
      processes[process->name] = {{"pid", process->pid},
                                  {"incarnation", process->incarnation},
                                  {"rss_bytes", process->last.rss},
                                  {"rss_anon_bytes", process->last.rss_anon},
                                  {"fds", process->last.fds},
                                  {"series", process->series}};
    }
    out["rss_growth_bytes"] = rss;
    out["rss_anon_growth_bytes"] = anon;
    out["fd_growth"] = fds;
    out["processes"] = processes;
    return out;
  }

  const SoakBenchOptions& options_;
  std::mt19937_64 rng_;
  std::vector<Client> clients_;
  test::MasterProcess master_process_;
  Tracked master_;
  std::string port_;
  int64_t start_ns_ = 0;
  double duration_s_ = 0;

  std::vector<Window> windows_;
  std::optional<Window> active_;
  SteadyClock::time_point active_until_;
  size_t stalled_slot_ = 0;
  int64_t next_fault_ns_ = 0;
  size_t next_kind_ = 0;
  json faults_ = json::array();

  json totals_ = json::object();
  json expected_ = json::object();
  json unexpected_ = json::object();
  uint64_t expected_total_ = 0;
  uint64_t unexpected_total_ = 0;
  json first_unexpected_ = json::array();
  json unexpected_exits_ = json::array();
  json master_stacks_;  // the file DumpMasterStacks wrote, or null
  int64_t last_print_ns_ = 0;
  uint64_t last_print_ops_ = 0;
};

void PrintSummary(const json& s) {
  std::cout << "soak: " << Fixed(s["duration_s"].get<double>(), 0) << " s, "
            << s["clients"].get<int>() << " clients, " << s["ops"].get<uint64_t>() << " ops ("
            << Fixed(s["ops_per_s"].get<double>(), 0) << "/s), misses "
            << s["missing"].get<uint64_t>() << "\n";
  std::cout << "faults: " << s["faults_injected"].get<size_t>() << " " << s["faults_by_kind"].dump()
            << "\n";
  std::cout << "wrong bytes: " << s["wrong_bytes"].get<uint64_t>() << "  errors: expected "
            << s["expected_errors"].get<uint64_t>() << " "
            << s["errors_by_class"]["expected"].dump() << ", unexpected "
            << s["unexpected_errors"].get<uint64_t>() << " "
            << s["errors_by_class"]["unexpected"].dump() << "\n";
  for (const json& message : s["first_unexpected"]) {
    std::cout << "  unexpected: " << message.get<std::string>() << "\n";
  }
  for (const json& exit : s["unexpected_exits"]) {
    std::cout << "  exited: " << exit.get<std::string>() << "\n";
  }
  std::cout << "after warm-up (current incarnation):\n";
  for (const auto& [name, process] : s["processes"].items()) {
    const json& rss = s["rss_growth_bytes"][name];
    const json& fds = s["fd_growth"][name];
    const json& anon = s["rss_anon_growth_bytes"][name];
    std::cout << "  " << name << " (incarnation " << process["incarnation"].get<int>() << "): RSS "
              << FormatByteSize(process["rss_bytes"].get<uint64_t>()) << ", growth "
              << (rss.is_null() ? std::string("n/a") : std::to_string(rss.get<int64_t>()) + " B")
              << " (heap "
              << (anon.is_null() ? std::string("n/a") : std::to_string(anon.get<int64_t>()) + " B")
              << ")"
              << "; fds " << process["fds"].get<uint64_t>() << ", growth "
              << (fds.is_null() ? std::string("n/a") : std::to_string(fds.get<int64_t>())) << "\n";
  }
}

}  // namespace

const std::vector<std::string>& SoakFaultKinds() {
  static const std::vector<std::string> kinds = {"client_kill", "master_restart", "master_pause",
                                                 "peer_stall"};
  return kinds;
}

int RunSoakBench(const SoakBenchOptions& options) {
  if (options.clients < 2) {
    std::cerr << "soak: needs at least 2 clients (gets read the other clients' keys)\n";
    return 2;
  }
  for (const std::string& fault : options.faults) {
    const auto& kinds = SoakFaultKinds();
    if (std::find(kinds.begin(), kinds.end(), fault) == kinds.end()) {
      std::cerr << "soak: unknown fault '" << fault
                << "' (client_kill, master_restart, master_pause, peer_stall)\n";
      return 2;
    }
  }
  if (options.stall_s >= options.client_ttl_s) {
    std::cerr << "soak: --stall must be shorter than --client-ttl (a longer stall is a death)\n";
    return 2;
  }
  SoakRun run(options);
  auto summary = run.Run();
  if (!summary.ok()) {
    std::cerr << "soak: " << summary.status() << "\n";
    return 1;
  }
  if (options.json) {
    std::cout << summary->dump() << std::endl;
  } else {
    PrintSummary(*summary);
  }
  const bool clean = (*summary)["wrong_bytes"].get<uint64_t>() == 0 &&
                     (*summary)["unexpected_errors"].get<uint64_t>() == 0 &&
                     (*summary)["unexpected_exits"].empty();
  return clean ? 0 : 3;
}

}  // namespace larder::bench
