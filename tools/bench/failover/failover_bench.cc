// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Every object lives in its writer's own segment, so a client's share of the objects is exactly
// what its catalog must hold before the kill, and "objects whose owner is alive" is a matter of
// which writer is alive. Gets of the probe and of the read-back go to other clients' objects, so
// they cross process boundaries. Masters run as real larder-master processes, since only a
// SIGKILLed process is a crash.
#include "bench/failover/failover_bench.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/common/report.h"
#include "bench/failover/failover_probe.h"
#include "client/master_client.h"
#include "common/child_process.h"
#include "common/env.h"
#include "etcd/etcd_client.h"
#include "etcd/etcd_test_server.h"
#include "testing/master_process.h"

namespace larder::bench {
namespace {

using json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr uint64_t kMaxObjects = 1000000;
// How often the recovery loop looks at the new master (and, every fourth time, at the probes).
constexpr milliseconds kPollInterval{50};
// Counts that have not grown for this long, with every client resumed, have stopped short of
// the catalogs' total: the rebuild is over.
constexpr int64_t kRebuildPlateauNs = 3'000'000'000;

// Concatenates anything streamable (messages built without `"x" + std::string` temporaries).
template <typename... Parts>
std::string Cat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

double Seconds(int64_t from_ns, int64_t to_ns) {
  return static_cast<double>(to_ns - from_ns) / 1e9;
}

// What the recovery loop reads from the new master's GetStats.
struct MasterCounts {
  double recovered = 0;  // objects (and replicas) rebuilt from the clients' catalogs
  double dropped = 0;    // catalog entries the rebuild refused
  double objects = 0;    // objects the master knows
};

Result<MasterCounts> AskStats(const client::MasterClient& master) {
  proto::StatsRequest request;
  proto::StatsReply reply;
  LARDER_RETURN_IF_ERROR(master.Call("GetStats", &proto::Master::Stub::GetStats, request, &reply));
  MasterCounts counts;
  counts.recovered = static_cast<double>(reply.recovered_objects());
  counts.dropped = static_cast<double>(reply.catalog_entries_dropped());
  counts.objects = static_cast<double>(reply.objects());
  return counts;
}

void AddCounts(json& into, const json& from) {
  if (!from.is_object()) return;
  for (const auto& [kind, n] : from.items()) {
    if (n.is_number()) into[kind] = into.value(kind, uint64_t{0}) + n.get<uint64_t>();
  }
}

// Median and max of the clients' resume times; null for both when a client never resumed.
std::pair<json, json> MedianAndMax(std::vector<std::optional<double>> values) {
  std::vector<double> known;
  for (const auto& value : values) {
    if (!value) return {nullptr, nullptr};
    known.push_back(*value);
  }
  if (known.empty()) return {nullptr, nullptr};
  std::sort(known.begin(), known.end());
  size_t n = known.size();
  double median = n % 2 == 1 ? known[n / 2] : (known[n / 2 - 1] + known[n / 2]) / 2;
  return {median, known.back()};
}

// What one read-back of every stored object by every client found.
struct ReadBack {
  uint64_t verified = 0;
  uint64_t wrong = 0;
  uint64_t missing = 0;
  uint64_t unreadable = 0;  // retryable and other errors
  std::string first_error;
  int64_t end_ns = 0;
};

// One cluster: its masters (and etcd), its clients and their objects, driven through the phases.
class FailoverRun {
 public:
  // `ha` false: a plain master and the steady-state phase only.
  FailoverRun(const FailoverBenchOptions& options, bool ha)
      : options_(options), ha_(ha), standby_(ha && options.mode == "standby") {}
  ~FailoverRun() {
    for (ChildProcess& worker : workers_) worker.Stop(seconds(5));
    for (test::MasterProcess& master : masters_) master.process.Stop(seconds(5));
  }

  Result<json> Run() {
    json out = json::object();
    out["bench"] = "failover";
    out["mode"] = ha_ ? options_.mode : std::string("plain");
    out["ha"] = ha_ ? "on" : "off";
    out["clients"] = options_.clients;
    out["objects"] = options_.objects;
    out["value_size"] = options_.value_size;
    LARDER_RETURN_IF_ERROR(StartMasters());
    LARDER_RETURN_IF_ERROR(StartWorkers());
    LARDER_RETURN_IF_ERROR(Fill(out));
    LARDER_RETURN_IF_ERROR(Steady(out));
    if (!ha_) return out;
    LARDER_RETURN_IF_ERROR(WaitForCatalogs(out));
    LARDER_RETURN_IF_ERROR(KillAndRecover(out));
    return out;
  }

 private:
  void Progress(const std::string& text) const {
    std::cerr << "failover" << (ha_ ? "" : " (HA off)") << ": " << text << std::endl;
  }

  std::map<std::string, std::string> ChildEnv() const {
    std::map<std::string, std::string> env;
    if (GetEnv("LARDER_LOG_LEVEL").empty()) env["LARDER_LOG_LEVEL"] = "warn";
    return env;
  }

  Result<test::MasterProcess> SpawnMaster(const std::string& port) {
    std::vector<std::string> flags;
    if (standby_) {
      flags = {"--etcd",    etcd_endpoints_, "--cluster-id",
               cluster_id_, "--leader-ttl",  options_.leader_ttl};
    }
    return test::SpawnMaster(options_.master_binary, port, flags, ChildEnv());
  }

  // The index of the master etcd names as the leader, once it names one of `candidates`.
  Result<size_t> WaitForLeader(const std::vector<size_t>& candidates,
                               SteadyClock::time_point deadline) {
    Status last = UnavailableError("no leader yet");
    do {
      auto record = etcd::FindLeader(*etcd_, cluster_id_);
      if (record.ok()) {
        for (size_t i : candidates) {
          if (record->address == masters_[i].address ||
              (record->http_port > 0 && record->http_port == masters_[i].http_port)) {
            return i;
          }
        }
        last = UnavailableError(Cat("etcd names ", record->address, " as the leader"));
      } else {
        last = record.status();
      }
      std::this_thread::sleep_for(kPollInterval);
    } while (SteadyClock::now() < deadline);
    return last.WithContext(Cat("waiting for a leader of cluster ", cluster_id_));
  }

  Status StartMasters() {
    if (!standby_) {
      LARDER_ASSIGN_OR_RETURN(test::MasterProcess master, SpawnMaster("0"));
      Progress(Cat("master on ", master.address));
      masters_.push_back(std::move(master));
      leader_ = 0;
      return Status::Ok();
    }
    etcd_endpoints_ = options_.etcd;
    if (etcd_endpoints_.empty()) {
      std::string why;
      if (!etcd::EtcdTestServer::Available(&why)) {
        return FailedPreconditionError(Cat("standby mode needs etcd (or --etcd): ", why));
      }
      LARDER_ASSIGN_OR_RETURN(etcd_server_, etcd::EtcdTestServer::Start());
      etcd_endpoints_ = etcd_server_->endpoint();
      Progress(Cat("etcd on ", etcd_endpoints_));
    }
    LARDER_ASSIGN_OR_RETURN(std::vector<std::string> endpoints,
                            etcd::ParseEtcdEndpoints(etcd_endpoints_));
    LARDER_ASSIGN_OR_RETURN(etcd_, etcd::EtcdClient::Create({endpoints, milliseconds(2000)}));
    cluster_id_ = Cat("failover-", getpid(), "-", FailoverProbe::NowNs() % 1000000);
    // The first master becomes the leader before the second starts, so that the second is the
    // standby.
    LARDER_ASSIGN_OR_RETURN(test::MasterProcess first, SpawnMaster("0"));
    masters_.push_back(std::move(first));
    LARDER_ASSIGN_OR_RETURN(leader_, WaitForLeader({0}, SteadyClock::now() + seconds(60)));
    LARDER_ASSIGN_OR_RETURN(test::MasterProcess second, SpawnMaster("0"));
    masters_.push_back(std::move(second));
    Progress(Cat("leader ", masters_[0].address, ", standby ", masters_[1].address, ", cluster ",
                 cluster_id_, ", leader TTL ", options_.leader_ttl));
    return Status::Ok();
  }

  std::string ClientMasterAddress() const {
    if (standby_) return Cat("etcd://", etcd_endpoints_, "/", cluster_id_);
    return masters_[leader_].address;
  }

  Status StartWorkers() {
    const uint64_t n = static_cast<uint64_t>(options_.clients);
    for (uint64_t i = 0; i < n; ++i) {
      shares_.push_back(options_.objects / n + (i < options_.objects % n ? 1 : 0));
    }
    // Room for the share, the steady-state puts and the probe's, with slack for the allocator.
    uint64_t objects = shares_[0] + options_.steady_puts + options_.probe_max_puts;
    uint64_t segment = objects * options_.value_size / 4 * 5 + (64ull << 20);
    segment = (segment + (1ull << 20) - 1) & ~((1ull << 20) - 1);
    std::map<std::string, std::string> env = ChildEnv();
    env["LARDER_MASTER_CONNECT_TIMEOUT"] = "60s";
    for (uint64_t i = 0; i < n; ++i) {
      std::string name = Cat("failover-", getpid(), "-", ha_ ? "ha" : "plain", "-", i);
      LARDER_ASSIGN_OR_RETURN(
          ChildProcess worker,
          ChildProcess::Spawn({SelfExecutable(), "store-worker", "--master", ClientMasterAddress(),
                               "--segment-size", std::to_string(segment), "--protocol",
                               options_.protocol, "--segment-name", name},
                              env, seconds(90)));
      segments_.push_back(worker.address());
      workers_.push_back(std::move(worker));
    }
    Progress(Cat(n, " clients through ", ClientMasterAddress(), ", ", FormatByteSize(segment),
                 " segments"));
    return Status::Ok();
  }

  // Sends one command per worker (in parallel), then collects every reply.
  Result<std::vector<json>> AskAll(const std::vector<json>& commands, milliseconds timeout) {
    for (size_t i = 0; i < commands.size(); ++i) {
      LARDER_RETURN_IF_ERROR(workers_[i].WriteLine(commands[i].dump()));
    }
    std::vector<json> replies;
    for (size_t i = 0; i < commands.size(); ++i) {
      LARDER_ASSIGN_OR_RETURN(std::string line, workers_[i].ReadLine(timeout));
      json reply = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!reply.is_object() || reply.contains("error")) {
        return InternalError(
            Cat("client ", i, " answered ", commands[i].value("cmd", ""), ": ", line));
      }
      reply.erase("lat_us");
      replies.push_back(std::move(reply));
    }
    return replies;
  }

  std::string ObjectPrefix(size_t owner) const { return Cat("obj/", owner, "/"); }

  milliseconds BulkTimeout() const {
    return milliseconds(120000 + static_cast<int64_t>(shares_[0] / 100));
  }

  Status Fill(json& out) {
    auto start = SteadyClock::now();
    std::vector<json> commands;
    for (size_t i = 0; i < workers_.size(); ++i) {
      commands.push_back({{"cmd", "put"},
                          {"prefix", ObjectPrefix(i)},
                          {"count", shares_[i]},
                          {"value_size", options_.value_size},
                          {"batch", options_.batch},
                          {"preferred", segments_[i]}});
    }
    LARDER_ASSIGN_OR_RETURN(std::vector<json> replies, AskAll(commands, BulkTimeout()));
    for (size_t i = 0; i < replies.size(); ++i) {
      if (JsonU64(replies[i], "ok") != shares_[i]) {
        return InternalError(Cat("client ", i, " stored ", JsonU64(replies[i], "ok"), " of its ",
                                 shares_[i], " objects: ", replies[i].value("first_error", "")));
      }
    }
    double took = std::chrono::duration<double>(SteadyClock::now() - start).count();
    out["fill_s"] = took;
    Progress(Cat("stored ", options_.objects, " objects of ", FormatByteSize(options_.value_size),
                 " in ", Fixed(took, 1), " s"));
    return Status::Ok();
  }

  // Keys per second over all clients, counting time inside store calls (as `store` does).
  static double Rate(const std::vector<json>& replies) {
    double rate = 0;
    for (const json& reply : replies) {
      double seconds = reply.value("seconds", 0.0);
      if (seconds > 0) rate += static_cast<double>(JsonU64(reply, "ok")) / seconds;
    }
    return rate;
  }

  Status Steady(json& out) {
    std::vector<json> puts, gets;
    for (size_t i = 0; i < workers_.size(); ++i) {
      puts.push_back({{"cmd", "put"},
                      {"prefix", Cat("steady/", i, "/")},
                      {"count", options_.steady_puts},
                      {"value_size", options_.value_size},
                      {"batch", options_.batch},
                      {"preferred", segments_[i]}});
      size_t owner = (i + 1) % workers_.size();
      gets.push_back({{"cmd", "get"},
                      {"prefix", ObjectPrefix(owner)},
                      {"count", shares_[owner]},
                      {"value_size", options_.value_size},
                      {"batch", options_.batch},
                      {"duration", options_.steady_duration_s}});
    }
    uint64_t errors = 0;
    if (options_.steady_puts > 0) {
      LARDER_ASSIGN_OR_RETURN(std::vector<json> replies, AskAll(puts, BulkTimeout()));
      out["steady_put_ops"] = Rate(replies);
      for (const json& reply : replies) {
        steady_ok_.push_back(JsonU64(reply, "ok"));
        errors += JsonU64(reply, "errors");
      }
    } else {
      out["steady_put_ops"] = nullptr;
      steady_ok_.assign(workers_.size(), 0);
    }
    milliseconds get_timeout(static_cast<int64_t>(options_.steady_duration_s * 1000) + 120000);
    LARDER_ASSIGN_OR_RETURN(std::vector<json> replies, AskAll(gets, get_timeout));
    out["steady_get_ops"] = Rate(replies);
    for (const json& reply : replies) {
      errors += JsonU64(reply, "errors") + JsonU64(reply, "missing") + JsonU64(reply, "retryable") +
                JsonU64(reply, "wrong");
    }
    out["steady_errors"] = errors;
    Progress(
        Cat("steady state: ",
            Fixed(out["steady_put_ops"].is_number() ? out["steady_put_ops"].get<double>() : 0.0, 0),
            " puts/s, ", Fixed(out["steady_get_ops"].get<double>(), 0), " gets/s, ", errors,
            " errors"));
    return Status::Ok();
  }

  // Polls every client's catalog until it holds the objects the client owns.
  Status WaitForCatalogs(json& out) {
    auto start = SteadyClock::now();
    auto deadline = start + milliseconds(static_cast<int64_t>(options_.sync_timeout_s * 1000));
    std::vector<json> commands(workers_.size(), json{{"cmd", "catalog"}});
    for (;;) {
      LARDER_ASSIGN_OR_RETURN(std::vector<json> replies, AskAll(commands, seconds(30)));
      std::string behind;
      catalog_total_ = 0;
      for (size_t i = 0; i < replies.size(); ++i) {
        uint64_t held = JsonU64(replies[i], "objects");
        uint64_t owned = shares_[i] + steady_ok_[i];
        catalog_total_ += held;
        if (held < owned && behind.empty()) {
          behind = Cat("client ", i, "'s catalog holds ", held, " of its ", owned, " objects");
        }
      }
      if (behind.empty()) break;
      if (SteadyClock::now() >= deadline) {
        return DeadlineExceededError(
            Cat("catalogs did not catch up within ", options_.sync_timeout_s, " s: ", behind));
      }
      std::this_thread::sleep_for(milliseconds(100));
    }
    double took = std::chrono::duration<double>(SteadyClock::now() - start).count();
    out["catalog_sync_s"] = took;
    Progress(Cat("catalogs hold ", catalog_total_, " objects (", Fixed(took, 2), " s)"));
    return Status::Ok();
  }

  Status StartProbes() {
    std::vector<json> commands;
    for (size_t i = 0; i < workers_.size(); ++i) {
      size_t owner = (i + 1) % workers_.size();
      commands.push_back({{"cmd", "probe_start"},
                          {"put_prefix", Cat("probe/", i, "/")},
                          {"max_puts", options_.probe_max_puts},
                          {"get_prefix", ObjectPrefix(owner)},
                          {"get_count", shares_[owner]},
                          {"value_size", options_.value_size},
                          {"batch", options_.probe_batch},
                          {"interval_us", static_cast<int64_t>(options_.probe_interval_ms * 1000)},
                          {"preferred", segments_[i]}});
    }
    LARDER_RETURN_IF_ERROR(AskAll(commands, seconds(30)).status());
    // Before the kill every probe has put and read: the loop is in full swing.
    auto deadline = SteadyClock::now() + seconds(30);
    std::vector<json> status(workers_.size(), json{{"cmd", "probe_status"}, {"since_ns", 0}});
    for (;;) {
      LARDER_ASSIGN_OR_RETURN(std::vector<json> replies, AskAll(status, seconds(30)));
      bool running = std::all_of(replies.begin(), replies.end(), [](const json& r) {
        return r["first_put_ok_ns"].is_number() && r["first_get_ok_ns"].is_number();
      });
      if (running) return Status::Ok();
      if (SteadyClock::now() >= deadline) {
        return DeadlineExceededError(Cat("the probes did not get going: ", replies[0].dump()));
      }
      std::this_thread::sleep_for(kPollInterval);
    }
  }

  // The restarted master, on the port of the one that was killed (retried while the port is
  // still held).
  Status Restart(const std::string& port, SteadyClock::time_point deadline) {
    for (;;) {
      auto master = SpawnMaster(port);
      if (master.ok()) {
        masters_[leader_] = std::move(*master);
        return Status::Ok();
      }
      if (SteadyClock::now() >= deadline) return master.status().WithContext("restarting");
      std::this_thread::sleep_for(milliseconds(100));
    }
  }

  Status KillAndRecover(json& out) {
    LARDER_RETURN_IF_ERROR(StartProbes());
    const int64_t kill_ns = FailoverProbe::NowNs();
    const auto deadline =
        SteadyClock::now() + milliseconds(static_cast<int64_t>(options_.recovery_timeout_s * 1000));
    const std::string port = masters_[leader_].port();
    masters_[leader_].process.Kill(SIGKILL);
    masters_[leader_].process.Stop(seconds(5));
    Progress(Cat("killed the ", standby_ ? "leader " : "master ", masters_[leader_].address,
                 " (SIGKILL)"));
    size_t successor = leader_;
    json takeover = nullptr;
    if (standby_) {
      successor = 1 - leader_;
    } else {
      LARDER_RETURN_IF_ERROR(Restart(port, deadline));
      takeover = Seconds(kill_ns, FailoverProbe::NowNs());
    }

    // The new master's counts, asked directly (not through etcd) so that a standby's answer,
    // Unavailable until it leads, says nothing about the dead leader.
    const client::MasterClient successor_rpc(masters_[successor].address, milliseconds(1000));
    MasterCounts counts;          // the last answer
    json rebuilt = nullptr;       // recovered + dropped reached the catalogs' total
    json objects_back = nullptr;  // the master's object count reached it
    int64_t last_growth_ns = kill_ns;
    std::vector<json> status(workers_.size(), json{{"cmd", "probe_status"}, {"since_ns", kill_ns}});
    bool resumed = false;
    const double total = static_cast<double>(catalog_total_);
    for (int round = 0; SteadyClock::now() < deadline; ++round) {
      int64_t now_ns = FailoverProbe::NowNs();
      if (standby_ && takeover.is_null()) {
        auto record = etcd::FindLeader(*etcd_, cluster_id_);
        if (record.ok() && (record->address == masters_[successor].address ||
                            record->http_port == masters_[successor].http_port)) {
          takeover = Seconds(kill_ns, now_ns);
        }
      }
      auto stats = AskStats(successor_rpc);
      if (stats.ok()) {
        if (stats->recovered > counts.recovered || stats->objects > counts.objects) {
          last_growth_ns = now_ns;
        }
        counts = *stats;
        if (rebuilt.is_null() && counts.recovered > 0 &&
            counts.recovered + counts.dropped >= total) {
          rebuilt = Seconds(kill_ns, now_ns);
        }
        if (objects_back.is_null() && counts.objects >= total) {
          objects_back = Seconds(kill_ns, now_ns);
        }
      }
      if (round % 4 == 0) {
        LARDER_ASSIGN_OR_RETURN(std::vector<json> replies, AskAll(status, seconds(30)));
        resumed = std::all_of(replies.begin(), replies.end(), [](const json& r) {
          return r["first_put_ok_ns"].is_number() && r["first_get_ok_ns"].is_number();
        });
      }
      // Done when every client has resumed and the rebuild is over: the counts reached the
      // catalogs' total, or stopped growing short of it.
      bool plateau = (counts.recovered > 0 || !objects_back.is_null()) &&
                     now_ns - last_growth_ns > kRebuildPlateauNs;
      if (resumed && (!rebuilt.is_null() || plateau)) break;
      std::this_thread::sleep_for(kPollInterval);
    }
    std::vector<json> stop(workers_.size(), json{{"cmd", "probe_stop"}, {"since_ns", kill_ns}});
    LARDER_ASSIGN_OR_RETURN(std::vector<json> probes, AskAll(stop, seconds(30)));

    std::vector<std::optional<double>> resume_put, resume_get;
    json client_errors = json::object(), first_errors = json::object();
    uint64_t wrong = 0, failures_before = 0;
    for (const json& probe : probes) {
      auto at = [&](const char* field) -> std::optional<double> {
        if (!probe[field].is_number()) return std::nullopt;
        return Seconds(kill_ns, probe[field].get<int64_t>());
      };
      resume_put.push_back(at("first_put_ok_ns"));
      resume_get.push_back(at("first_get_ok_ns"));
      AddCounts(client_errors, probe["errors"]);
      for (const auto& [kind, message] : probe["first_errors"].items()) {
        if (!first_errors.contains(kind)) first_errors[kind] = message;
      }
      wrong += JsonU64(probe, "wrong");
      failures_before += JsonU64(probe["before"], "failures");
    }
    auto [put_median, put_max] = MedianAndMax(resume_put);
    auto [get_median, get_max] = MedianAndMax(resume_get);
    out["takeover_s"] = takeover;
    out["resume_put_s"] = put_median;
    out["resume_put_max_s"] = put_max;
    out["resume_get_s"] = get_median;
    out["resume_get_max_s"] = get_max;
    out["client_errors"] = client_errors;
    out["first_errors"] = first_errors;
    out["probe_wrong"] = wrong;
    out["probe_failures_before_kill"] = failures_before;
    out["expected_objects"] = catalog_total_;
    Progress(Cat("resumed: put ", put_median.dump(), " s, get ", get_median.dump(), " s"));

    // Read back every object from every client; while the master still rebuilds some of it,
    // again (until the deadline).
    std::optional<ReadBack> first_complete;
    ReadBack last;
    do {
      LARDER_ASSIGN_OR_RETURN(last, ReadBackAll());
      if (last.missing == 0 && last.unreadable == 0) {
        first_complete = last;
        break;
      }
    } while (SteadyClock::now() < deadline);
    out["objects_back_s"] = objects_back;
    out["readable_s"] = first_complete ? json(Seconds(kill_ns, first_complete->end_ns)) : json();
    out["restored_objects"] = static_cast<uint64_t>(counts.recovered);
    out["catalog_entries_dropped"] = static_cast<uint64_t>(counts.dropped);
    if (counts.recovered > 0) {
      out["rebuild_source"] = "recovered_objects";
      out["rebuild_complete"] = !rebuilt.is_null();
      out["rebuild_s"] = rebuilt.is_null() ? json(Seconds(kill_ns, last_growth_ns)) : rebuilt;
    } else {
      // The master reports no rebuilt object: time the rebuild by what clients can read.
      out["rebuild_source"] = "readable";
      out["rebuild_complete"] = first_complete.has_value();
      out["rebuild_s"] = out["readable_s"];
    }
    const double expected =
        static_cast<double>(workers_.size()) * static_cast<double>(options_.objects);
    out["readable_fraction"] = expected > 0 ? static_cast<double>(last.verified) / expected : 0.0;
    out["wrong_bytes"] = last.wrong + wrong;
    out["missing"] = last.missing;
    out["unreadable"] = last.unreadable;
    if (!last.first_error.empty()) out["readback_first_error"] = last.first_error;
    Progress(Cat("read back ", last.verified, " of ", static_cast<uint64_t>(expected), " (missing ",
                 last.missing, ", unreadable ", last.unreadable, ", wrong ", last.wrong, ")"));
    return Status::Ok();
  }

  // Every client reads every stored object (each round a client reads another owner's share).
  Result<ReadBack> ReadBackAll() {
    ReadBack total;
    const size_t n = workers_.size();
    for (size_t round = 0; round < n; ++round) {
      std::vector<json> commands;
      for (size_t i = 0; i < n; ++i) {
        size_t owner = (i + round) % n;
        commands.push_back({{"cmd", "get"},
                            {"prefix", ObjectPrefix(owner)},
                            {"count", shares_[owner]},
                            {"value_size", options_.value_size},
                            {"batch", options_.batch}});
      }
      LARDER_ASSIGN_OR_RETURN(std::vector<json> replies, AskAll(commands, BulkTimeout()));
      for (const json& reply : replies) {
        total.verified += JsonU64(reply, "verified");
        total.wrong += JsonU64(reply, "wrong");
        total.missing += JsonU64(reply, "missing");
        total.unreadable += JsonU64(reply, "retryable") + JsonU64(reply, "errors");
        if (total.first_error.empty()) total.first_error = reply.value("first_error", "");
      }
    }
    total.end_ns = FailoverProbe::NowNs();
    return total;
  }

  const FailoverBenchOptions& options_;
  const bool ha_;
  const bool standby_;  // ha_ and standby mode: etcd and two masters
  std::string etcd_endpoints_;
  std::string cluster_id_;
  std::unique_ptr<etcd::EtcdTestServer> etcd_server_;  // when the bench started etcd itself
  std::unique_ptr<etcd::EtcdClient> etcd_;
  std::vector<test::MasterProcess> masters_;
  size_t leader_ = 0;  // index in masters_ of the one killed
  std::vector<ChildProcess> workers_;
  std::vector<std::string> segments_;  // worker i's segment name
  std::vector<uint64_t> shares_;       // objects worker i owns
  std::vector<uint64_t> steady_ok_;    // steady-state puts worker i stored
  uint64_t catalog_total_ = 0;         // objects in all catalogs just before the kill
};

std::string Figure(const json& value, int precision, const char* null_text = "-") {
  if (value.is_null()) return null_text;
  if (value.is_number_float()) return Fixed(value.get<double>(), precision);
  if (value.is_number()) return std::to_string(value.get<uint64_t>());
  if (value.is_string()) return value.get<std::string>();
  return value.dump();
}

std::string Counts(const json& counts) {
  std::string text;
  for (const auto& [kind, n] : counts.items()) {
    if (!text.empty()) text += ' ';
    text += Cat(kind, "=", n.dump());
  }
  return text.empty() ? std::string("none") : text;
}

void PrintTable(const json& result, const json& ha_off) {
  std::string mode = result.value("ha", "") == "on" ? Cat(result.value("mode", ""), " mode")
                                                    : std::string("HA off (a plain master)");
  std::cout << "failover: " << mode << ", " << result["clients"] << " clients, "
            << result["objects"] << " objects of "
            << FormatByteSize(result.value("value_size", uint64_t{0})) << "\n";
  Table table({"figure", "value"});
  if (!ha_off.is_null()) {
    table.AddRow({"steady put ops/s, HA off", Figure(ha_off["steady_put_ops"], 0)});
    table.AddRow({"steady get ops/s, HA off", Figure(ha_off["steady_get_ops"], 0)});
  }
  if (result.value("ha", "") == "off") {
    table.AddRow({"steady put ops/s, HA off", Figure(result["steady_put_ops"], 0)});
    table.AddRow({"steady get ops/s, HA off", Figure(result["steady_get_ops"], 0)});
  } else {
    table.AddRow({"steady put ops/s", Figure(result["steady_put_ops"], 0)});
    table.AddRow({"steady get ops/s", Figure(result["steady_get_ops"], 0)});
    table.AddRow({"catalog sync wait s", Figure(result["catalog_sync_s"], 2)});
    table.AddRow({result.value("mode", "") == "standby" ? "standby leader after s"
                                                        : "master restarted after s",
                  Figure(result["takeover_s"], 3)});
    table.AddRow(
        {"resume put s (median / max)", Cat(Figure(result["resume_put_s"], 3, "never"), " / ",
                                            Figure(result["resume_put_max_s"], 3, "never"))});
    table.AddRow(
        {"resume get s (median / max)", Cat(Figure(result["resume_get_s"], 3, "never"), " / ",
                                            Figure(result["resume_get_max_s"], 3, "never"))});
    table.AddRow({Cat("rebuild s (", result.value("rebuild_source", ""), ")"),
                  Cat(Figure(result["rebuild_s"], 3, "never"),
                      result.value("rebuild_complete", false) ? "" : " (incomplete)")});
    table.AddRow({"master objects back s", Figure(result["objects_back_s"], 3, "never")});
    table.AddRow({"readable after s (read-back end)", Figure(result["readable_s"], 3, "never")});
    table.AddRow({"restored / expected objects", Cat(Figure(result["restored_objects"], 0), " / ",
                                                     Figure(result["expected_objects"], 0))});
    table.AddRow({"readable fraction", Fixed(result.value("readable_fraction", 0.0), 5)});
    table.AddRow({"wrong bytes (reads)", Figure(result["wrong_bytes"], 0)});
    table.AddRow({"missing / unreadable",
                  Cat(Figure(result["missing"], 0), " / ", Figure(result["unreadable"], 0))});
    table.AddRow({"client errors (keys)", Counts(result["client_errors"])});
  }
  std::cout << table.ToString();
  if (result.contains("first_errors")) {
    for (const auto& [kind, message] : result["first_errors"].items()) {
      std::cout << "  first " << kind << ": " << message.get<std::string>() << "\n";
    }
  }
}

}  // namespace

int RunFailoverBench(const FailoverBenchOptions& options) {
  if (options.mode != "standby" && options.mode != "restart") {
    std::cerr << "larder-bench failover: --mode must be standby or restart\n";
    return 2;
  }
  if (options.clients < 1 || options.objects < 1 || options.objects > kMaxObjects ||
      options.value_size == 0 || options.batch == 0 || options.probe_batch == 0) {
    std::cerr << "larder-bench failover: --clients, --objects (at most 1000000), --value-size "
                 "and the batches must be positive\n";
    return 2;
  }
  json ha_off = nullptr;
  json result;
  if (!options.ha || options.compare) {
    FailoverRun run(options, /*ha=*/false);
    auto figures = run.Run();
    if (!figures.ok()) {
      std::cerr << "larder-bench failover (HA off): " << figures.status() << "\n";
      return 1;
    }
    ha_off = *figures;
    result = *figures;
  }
  if (options.ha || options.compare) {
    FailoverRun run(options, /*ha=*/true);
    auto figures = run.Run();
    if (!figures.ok()) {
      std::cerr << "larder-bench failover: " << figures.status() << "\n";
      return 1;
    }
    result = *figures;
    if (options.compare) {
      result["ha_off"] = {{"steady_put_ops", ha_off["steady_put_ops"]},
                          {"steady_get_ops", ha_off["steady_get_ops"]}};
    }
  }
  if (options.json) {
    std::cout << result.dump(-1, ' ', false, json::error_handler_t::replace) << std::endl;
  } else {
    PrintTable(result, options.compare ? ha_off : json());
  }
  if (result.value("ha", "") != "on") return 0;
  bool resumed = result["resume_put_s"].is_number() && result["resume_get_s"].is_number();
  return resumed && result.value("wrong_bytes", uint64_t{0}) == 0 ? 0 : 1;
}

}  // namespace larder::bench
