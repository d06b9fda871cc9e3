// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Master failover end to end: real larder-master processes (one restarted on its port, or a
// leader and a standby of one cluster in a real etcd), store clients in their own processes
// (`larder-bench store-worker`), and the objects those clients stored surviving the master's
// SIGKILL because the new master rebuilds them from the clients' catalogs (docs/store.md, "High
// availability"). Every wait polls a condition under a deadline; TTLs stay at 2 s or more, for
// sanitizer builds.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <httplib.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/child_process.h"
#include "etcd/etcd_client.h"
#include "etcd/etcd_fixture.h"
#include "etcd/etcd_test_server.h"
#include "testing/binaries.h"
#include "testing/json_worker.h"
#include "testing/master_process.h"

namespace larder {
namespace {

using json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr uint64_t kValueSize = 4096;
constexpr int kObjectsPerClient = 500;
constexpr char kCluster[] = "ha-e2e";

using larder::test::Bin;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now().time_since_epoch())
      .count();
}

using Master = larder::test::MasterProcess;

// A larder-master on loopback; `port` "0" picks a free one. Its address is empty when it did not
// start.
Master StartMaster(const std::vector<std::string>& flags, const std::string& port = "0") {
  auto master = larder::test::SpawnMaster("", port, flags, {});
  EXPECT_TRUE(master.ok()) << master.status();
  return master.ok() ? std::move(*master) : Master();
}

// `master_address`: "ip:port" or "etcd://.../CLUSTER".
ChildProcess StartWorker(const std::string& master_address, const std::string& name,
                         const std::string& segment_size = "64M") {
  auto child = ChildProcess::Spawn({Bin("larder-bench"), "store-worker", "--master", master_address,
                                    "--segment-size", segment_size, "--segment-name", name},
                                   {{"LARDER_MASTER_CONNECT_TIMEOUT", "60s"}}, seconds(90));
  EXPECT_TRUE(child.ok()) << child.status();
  return child.ok() ? std::move(*child) : ChildProcess();
}

json Send(ChildProcess& worker, const json& command, milliseconds timeout = seconds(120)) {
  auto reply = test::Exchange(worker, command, timeout);
  EXPECT_TRUE(reply.ok()) << reply.status();
  return reply.ok() ? *reply : json{{"error", reply.status().ToString()}};
}

json Put(ChildProcess& worker, const std::string& prefix, int count, const std::string& preferred) {
  return Send(worker, {{"cmd", "put"},
                       {"prefix", prefix},
                       {"count", count},
                       {"value_size", kValueSize},
                       {"batch", 16},
                       {"preferred", preferred}});
}

json Get(ChildProcess& worker, const std::string& prefix, int count) {
  return Send(worker, {{"cmd", "get"},
                       {"prefix", prefix},
                       {"count", count},
                       {"value_size", kValueSize},
                       {"batch", 16}});
}

uint64_t Field(const json& reply, const char* name) {
  auto it = reply.find(name);
  return it != reply.end() && it->is_number() ? it->get<uint64_t>() : 0;
}

std::string Prefix(size_t owner) { return "obj/" + std::to_string(owner) + "/"; }

// Each worker stores kObjectsPerClient objects in its own segment, then waits until its catalog
// holds them (the master syncs catalogs every 200 ms).
void StoreObjects(std::vector<ChildProcess>& workers, const std::vector<std::string>& names) {
  for (size_t i = 0; i < workers.size(); ++i) {
    json put = Put(workers[i], Prefix(i), kObjectsPerClient, names[i]);
    ASSERT_EQ(Field(put, "ok"), kObjectsPerClient) << put;
  }
  auto deadline = SteadyClock::now() + seconds(60);
  for (size_t i = 0; i < workers.size(); ++i) {
    json catalog = Send(workers[i], {{"cmd", "catalog"}});
    while (Field(catalog, "objects") < kObjectsPerClient && SteadyClock::now() < deadline) {
      catalog = Send(workers[i], {{"cmd", "catalog"}});  // one round trip paces the loop
    }
    ASSERT_GE(Field(catalog, "objects"), kObjectsPerClient)
        << "worker " << i << "'s catalog never caught up: " << catalog;
  }
}

// What every reader read of every owner's objects.
struct ReadBack {
  uint64_t verified = 0, wrong = 0, missing = 0, unreadable = 0;
  std::string first_error;
};

ReadBack ReadAll(std::vector<ChildProcess*> readers, const std::vector<size_t>& owners) {
  ReadBack total;
  for (ChildProcess* reader : readers) {
    for (size_t owner : owners) {
      json got = Get(*reader, Prefix(owner), kObjectsPerClient);
      total.verified += Field(got, "verified");
      total.wrong += Field(got, "wrong");
      total.missing += Field(got, "missing");
      total.unreadable += Field(got, "retryable") + Field(got, "errors");
      if (total.first_error.empty()) total.first_error = got.value("first_error", "");
    }
  }
  return total;
}

// Reads everything again until nothing is missing or unreadable (the new master may still be
// rebuilding: gets then answer Unavailable, or NotFound before the owner remounted), or until
// `timeout`. Each pass is a full read, which paces the loop.
ReadBack ReadAllUntilRecovered(std::vector<ChildProcess*> readers,
                               const std::vector<size_t>& owners, milliseconds timeout) {
  auto deadline = SteadyClock::now() + timeout;
  ReadBack read = ReadAll(readers, owners);
  while ((read.missing > 0 || read.unreadable > 0) && read.wrong == 0 &&
         SteadyClock::now() < deadline) {
    read = ReadAll(readers, owners);
  }
  return read;
}

void ExpectRecovered(const ReadBack& read, uint64_t expected) {
  EXPECT_EQ(read.wrong, 0u) << read.first_error;
  EXPECT_GE(static_cast<double>(read.verified), 0.999 * static_cast<double>(expected))
      << read.verified << " of " << expected << " read back; missing " << read.missing
      << ", unreadable " << read.unreadable << "; first error: " << read.first_error;
  EXPECT_LE(read.missing, expected / 1000) << read.first_error;
}

// Puts fresh keys until a batch of 10 fully succeeds (the client has found the new master), then
// reads them from `reader`.
void ExpectNewPutsWork(ChildProcess& writer, ChildProcess& reader, const std::string& preferred) {
  auto deadline = SteadyClock::now() + seconds(60);
  json put;
  int attempt = 0;
  std::string prefix;
  do {
    prefix = "after/" + std::to_string(attempt++) + "/";
    put = Put(writer, prefix, 10, preferred);  // a call to the master paces the loop
  } while (Field(put, "ok") != 10 && SteadyClock::now() < deadline);
  ASSERT_EQ(Field(put, "ok"), 10u) << put;
  json got = Get(reader, prefix, 10);
  EXPECT_EQ(Field(got, "verified"), 10u) << got;
}

// A mixed put/get loop in every worker (tools/bench/failover/failover_probe.h), for load across the
// kill.
void StartProbes(std::vector<ChildProcess>& workers) {
  for (size_t i = 0; i < workers.size(); ++i) {
    json started = Send(workers[i], {{"cmd", "probe_start"},
                                     {"put_prefix", "probe/" + std::to_string(i) + "/"},
                                     {"max_puts", 20000},
                                     {"get_prefix", Prefix((i + 1) % workers.size())},
                                     {"get_count", kObjectsPerClient},
                                     {"value_size", kValueSize},
                                     {"batch", 4},
                                     {"interval_us", 5000}});
    ASSERT_EQ(started.value("started", false), true) << started;
  }
}

// Polls the probes until each has put and got successfully in a batch that began at or after
// `since_ns`; returns their last summaries.
std::vector<json> WaitForProbesToResume(std::vector<ChildProcess*> workers, int64_t since_ns,
                                        milliseconds timeout) {
  auto deadline = SteadyClock::now() + timeout;
  std::vector<json> summaries;
  for (;;) {
    summaries.clear();
    bool resumed = true;
    for (ChildProcess* worker : workers) {
      summaries.push_back(Send(*worker, {{"cmd", "probe_status"}, {"since_ns", since_ns}}));
      resumed = resumed && summaries.back()["first_put_ok_ns"].is_number() &&
                summaries.back()["first_get_ok_ns"].is_number();
    }
    if (resumed || SteadyClock::now() >= deadline) return summaries;
    std::this_thread::sleep_for(milliseconds(50));  // polling interval, bounded by the deadline
  }
}

std::string Lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

bool SaysLeadershipLost(const std::string& error) {
  std::string lower = Lower(error);
  return lower.find("lease") != std::string::npos || lower.find("leader") != std::string::npos;
}

std::string HealthRole(const Master& master) {
  httplib::Client http("127.0.0.1", master.http_port);
  http.set_connection_timeout(seconds(2));
  auto response = http.Get("/health");
  if (!response) return "<no answer>";
  json health = json::parse(response->body, nullptr, false);
  if (!health.is_object()) return "<not JSON: " + response->body + ">";
  return health.value("role", "<no role>");
}

// Polls /health until it reports `role`; returns the last role seen.
std::string WaitForRole(const Master& master, const std::string& role, milliseconds timeout) {
  auto deadline = SteadyClock::now() + timeout;
  std::string seen = HealthRole(master);
  while (seen != role && SteadyClock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(50));  // polling interval, bounded by the deadline
    seen = HealthRole(master);
  }
  return seen;
}

// (a) A single master killed with -9 and started again on its port: the clients remount with
// their catalogs and the new master rebuilds their objects.
TEST(HaE2ETest, SingleMasterRestartedKeepsTheStoredObjects) {
  Master master = StartMaster({});
  ASSERT_FALSE(master.address.empty());
  std::vector<ChildProcess> workers;
  std::vector<std::string> names = {"a", "b", "c"};
  for (const std::string& name : names) workers.push_back(StartWorker(master.address, name));
  StoreObjects(workers, names);
  if (HasFatalFailure()) return;

  const std::string port = master.port();
  master.process.Kill(SIGKILL);
  master.process.Stop(seconds(5));
  Master restarted = StartMaster({}, port);
  ASSERT_EQ(restarted.address, master.address);

  std::vector<ChildProcess*> readers = {&workers[0], &workers[1], &workers[2]};
  ReadBack read = ReadAllUntilRecovered(readers, {0, 1, 2}, seconds(60));
  ExpectRecovered(read, 3 * 3 * kObjectsPerClient);
  ExpectNewPutsWork(workers[0], workers[1], "c");
}

// Polls the worker's catalog until it holds at least `objects` entries; returns what it last held.
uint64_t WaitForCatalog(ChildProcess& worker, uint64_t objects, milliseconds timeout) {
  auto deadline = SteadyClock::now() + timeout;
  uint64_t held = Field(Send(worker, {{"cmd", "catalog"}}), "objects");
  while (held < objects && SteadyClock::now() < deadline) {
    held = Field(Send(worker, {{"cmd", "catalog"}}), "objects");  // a round trip paces the loop
  }
  return held;
}

// The owner's catalog lags the master: objects evicted while it cannot sync are still named by it,
// at ranges the master has given to new objects at once. When the master then dies, the owner
// reports only the entries whose ranges still hold their own bytes: every get after the restart
// returns the right bytes or NotFound, never another object's bytes.
TEST(HaE2ETest, RangesReusedBeforeTheOwnerHeardOfTheEvictionNeverServeWrongBytes) {
  Master master = StartMaster({});
  ASSERT_FALSE(master.address.empty());
  ChildProcess owner = StartWorker(master.address, "owner", "1M");  // 256 values of 4 KiB
  ChildProcess writer = StartWorker(master.address, "writer", "0");
  constexpr int kOld = 200;
  ASSERT_EQ(Field(Put(writer, "old/", kOld, "owner"), "ok"), kOld);
  ASSERT_EQ(WaitForCatalog(owner, kOld, seconds(30)), uint64_t{kOld});
  // The sync that brings one more ADD acknowledges every change before it.
  ASSERT_EQ(Field(Put(writer, "marker/", 1, "owner"), "ok"), 1u);
  ASSERT_EQ(WaitForCatalog(owner, kOld + 1, seconds(30)), uint64_t{kOld + 1});

  // The owner stops syncing; new objects evict most of the old ones and take their ranges at once
  // (the writer writes through the shared mapping, which needs nothing of the owner's process).
  owner.Kill(SIGSTOP);
  json fresh = Put(writer, "new/", kOld, "owner");
  EXPECT_EQ(Field(fresh, "ok"), uint64_t{kOld}) << fresh;
  EXPECT_EQ(Field(Get(writer, "new/", kOld), "verified"), uint64_t{kOld});

  const std::string port = master.port();
  master.process.Kill(SIGKILL);
  master.process.Stop(seconds(5));
  Master restarted = StartMaster({}, port);
  ASSERT_EQ(restarted.address, master.address);
  owner.Kill(SIGCONT);

  // The marker comes back once the owner has remounted with its catalog; then read the old keys
  // until the rebuild is over (absent keys answer Unavailable until then).
  auto deadline = SteadyClock::now() + seconds(60);
  while (Field(Get(writer, "marker/", 1), "verified") != 1 && SteadyClock::now() < deadline) {
  }  // each get is a round trip to the master, which paces the loop
  json got = Get(writer, "old/", kOld);
  while ((Field(got, "retryable") > 0 || Field(got, "errors") > 0) &&
         SteadyClock::now() < deadline) {
    got = Get(writer, "old/", kOld);  // a full read paces the loop
  }
  EXPECT_EQ(Field(got, "wrong"), 0u) << got;
  EXPECT_EQ(Field(got, "retryable") + Field(got, "errors"), 0u) << got;
  EXPECT_EQ(Field(got, "verified") + Field(got, "missing"), uint64_t{kOld}) << got;
  EXPECT_GT(Field(got, "verified"), 0u) << "old objects that kept their ranges survive: " << got;
  EXPECT_GT(Field(got, "missing"), 0u) << "overwritten ones are dropped: " << got;
  EXPECT_EQ(Field(Get(writer, "marker/", 1), "verified"), 1u);
}

// Tests with a real etcd and masters that elect a leader in it.
class HaEtcdE2ETest : public etcd::EtcdTest {
 protected:
  void SetUp() override {
    etcd::EtcdTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    etcd::EtcdOptions options;
    options.endpoints = {etcd_->endpoint()};
    options.timeout = milliseconds(1000);
    auto client = etcd::EtcdClient::Create(options);
    ASSERT_TRUE(client.ok()) << client.status();
    etcd_client_ = std::move(*client);
  }

  std::string ClusterAddress() const {
    return "etcd://" + etcd_->endpoint() + "/" + std::string(kCluster);
  }

  Master StartHaMaster() {
    return StartMaster(
        {"--etcd", etcd_->endpoint(), "--cluster-id", kCluster, "--leader-ttl", "2s"});
  }

  // Polls etcd until it names `master` as the leader; false at the deadline.
  bool WaitForLeader(const Master& master, milliseconds timeout) {
    auto deadline = SteadyClock::now() + timeout;
    for (;;) {
      auto record = etcd::FindLeader(*etcd_client_, kCluster);
      if (record.ok() && record->address == master.address) return true;
      if (SteadyClock::now() >= deadline) {
        ADD_FAILURE() << "etcd never named " << master.address << " the leader; last: "
                      << (record.ok() ? record->address : record.status().ToString());
        return false;
      }
      std::this_thread::sleep_for(milliseconds(50));  // polling interval
    }
  }

  // A leader and a standby, and three workers that follow the leader through etcd and stored
  // their objects.
  void StartCluster() {
    masters_.push_back(StartHaMaster());
    ASSERT_FALSE(masters_[0].address.empty());
    ASSERT_TRUE(WaitForLeader(masters_[0], seconds(30)));
    masters_.push_back(StartHaMaster());
    ASSERT_FALSE(masters_[1].address.empty());
    EXPECT_EQ(WaitForRole(masters_[0], "leader", seconds(10)), "leader");
    EXPECT_EQ(WaitForRole(masters_[1], "standby", seconds(10)), "standby");
    for (const std::string& name : names_) workers_.push_back(StartWorker(ClusterAddress(), name));
    StoreObjects(workers_, names_);
  }

  std::unique_ptr<etcd::EtcdClient> etcd_client_;
  std::vector<Master> masters_;
  std::vector<ChildProcess> workers_;
  std::vector<std::string> names_ = {"a", "b", "c"};
};

// (b) The leader killed with -9 under load: the standby takes over, the clients follow it and
// remount, and everything they stored reads back.
TEST_F(HaEtcdE2ETest, LeaderKilledUnderLoadTheStandbyServesTheStoredObjects) {
  StartCluster();
  if (HasFatalFailure()) return;
  StartProbes(workers_);
  if (HasFatalFailure()) return;
  std::vector<ChildProcess*> all = {&workers_[0], &workers_[1], &workers_[2]};
  // The load runs before the kill.
  std::vector<json> before = WaitForProbesToResume(all, 0, seconds(30));
  for (const json& probe : before) ASSERT_TRUE(probe["first_get_ok_ns"].is_number()) << probe;

  const int64_t kill_ns = NowNs();
  masters_[0].process.Kill(SIGKILL);
  masters_[0].process.Stop(seconds(5));
  ASSERT_TRUE(WaitForLeader(masters_[1], seconds(30)));
  EXPECT_EQ(WaitForRole(masters_[1], "leader", seconds(10)), "leader");

  std::vector<json> probes = WaitForProbesToResume(all, kill_ns, seconds(60));
  for (json& probe : probes) {
    EXPECT_TRUE(probe["first_put_ok_ns"].is_number()) << "puts never resumed: " << probe;
    EXPECT_TRUE(probe["first_get_ok_ns"].is_number()) << "gets never resumed: " << probe;
    EXPECT_EQ(Field(probe, "wrong"), 0u) << probe;
  }
  for (ChildProcess* worker : all) Send(*worker, {{"cmd", "probe_stop"}});

  ReadBack read = ReadAllUntilRecovered(all, {0, 1, 2}, seconds(60));
  ExpectRecovered(read, 3 * 3 * kObjectsPerClient);
  ExpectNewPutsWork(workers_[2], workers_[0], "a");
}

// (c) A client killed while the new leader rebuilds: the others' objects stay readable; the dead
// client's are reported missing (once the master lets its segment go), never wrong.
TEST_F(HaEtcdE2ETest, ClientKilledDuringRecoveryItsObjectsGoMissingNotWrong) {
  StartCluster();
  if (HasFatalFailure()) return;
  masters_[0].process.Kill(SIGKILL);
  masters_[0].process.Stop(seconds(5));
  ASSERT_TRUE(WaitForLeader(masters_[1], seconds(30)));
  // Recovery is under way: the clients find the new leader and remount with their catalogs.
  workers_[2].Kill(SIGKILL);
  workers_[2].Stop(seconds(5));

  std::vector<ChildProcess*> survivors = {&workers_[0], &workers_[1]};
  ReadBack alive = ReadAllUntilRecovered(survivors, {0, 1}, seconds(60));
  ExpectRecovered(alive, 2 * 2 * kObjectsPerClient);

  // The dead client's objects: missing once the master has let its segment go (its client TTL,
  // when it had remounted before dying), and never another object's bytes meanwhile.
  auto deadline = SteadyClock::now() + seconds(60);
  ReadBack dead = ReadAll(survivors, {2});
  uint64_t wrong = dead.wrong;
  while (dead.missing < 2 * kObjectsPerClient && SteadyClock::now() < deadline) {
    dead = ReadAll(survivors, {2});  // a full read paces the loop
    wrong += dead.wrong;
  }
  EXPECT_EQ(wrong, 0u) << dead.first_error;
  EXPECT_EQ(dead.missing, 2u * kObjectsPerClient) << "verified " << dead.verified << ", unreadable "
                                                  << dead.unreadable << ": " << dead.first_error;
  EXPECT_EQ(dead.verified, 0u);
  ExpectNewPutsWork(workers_[0], workers_[1], "b");
}

// (d) etcd gone while the leader serves: it cannot renew its lease, so it stops serving (puts
// fail saying the leadership was lost) and exits with status 3 one TTL later.
TEST_F(HaEtcdE2ETest, LeaderThatLosesEtcdRefusesCallsAndExitsWithStatus3) {
  masters_.push_back(StartHaMaster());
  ASSERT_FALSE(masters_[0].address.empty());
  ASSERT_TRUE(WaitForLeader(masters_[0], seconds(30)));
  ChildProcess worker = StartWorker(ClusterAddress(), "a");
  ASSERT_EQ(Field(Put(worker, "before/", 10, "a"), "ok"), 10u);

  etcd_->Stop();
  auto deadline = SteadyClock::now() + seconds(30);
  json put;
  std::string error;
  int attempt = 0;
  for (;;) {
    put = Put(worker, "during/" + std::to_string(attempt++) + "/", 1, "a");  // paces the loop
    error = put.value("first_error", "");
    if (SaysLeadershipLost(error) || SteadyClock::now() >= deadline) break;
  }
  EXPECT_EQ(Field(put, "ok"), 0u) << put;
  EXPECT_TRUE(SaysLeadershipLost(error))
      << "puts never failed for the lost leadership; last reply: " << put;

  // The master exits by itself (its stdin stays open, so --parent-watch does not end it).
  const pid_t pid = masters_[0].process.pid();
  int status = 0;
  pid_t done = 0;
  deadline = SteadyClock::now() + seconds(30);
  while ((done = waitpid(pid, &status, WNOHANG)) == 0 && SteadyClock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(50));  // polling interval, bounded by the deadline
  }
  ASSERT_EQ(done, pid) << "the fenced master did not exit within 30 s";
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 3);
}

// `larder-bench failover --json`: its stdout's last line, parsed; the run's stderr is kept for
// failure messages.
json RunFailoverBench(const std::string& mode, std::string* log) {
  std::string stderr_path = ::testing::TempDir() + "/failover-" + mode + ".log";
  std::string command = Bin("larder-bench") + " failover --mode " + mode +
                        " --objects 2000 --steady-puts 1000 --steady-duration 1 "
                        "--leader-ttl 2s --json 2>" +
                        stderr_path;
  FILE* pipe = popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr) << command;
  if (pipe == nullptr) return json();
  std::string out;
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof(chunk), pipe)) > 0) out.append(chunk, n);
  int status = pclose(pipe);
  std::ifstream err(stderr_path);
  log->assign(std::istreambuf_iterator<char>(err), std::istreambuf_iterator<char>());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << command << " exited with " << status << "; stderr:\n"
      << *log;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  json result = json::parse(out.substr(out.rfind('\n') + 1), nullptr, false);
  EXPECT_TRUE(result.is_object()) << "stdout: " << out << "\nstderr:\n" << *log;
  return result.is_object() ? result : json();
}

void ExpectFullRecovery(const json& result, const std::string& mode, const std::string& log) {
  ASSERT_TRUE(result.is_object()) << log;
  EXPECT_EQ(result.value("mode", ""), mode);
  for (const char* field :
       {"mode", "objects", "readable_fraction", "wrong_bytes", "resume_put_s", "resume_get_s",
        "rebuild_s", "client_errors", "steady_put_ops", "steady_get_ops"}) {
    EXPECT_TRUE(result.contains(field)) << field << " missing: " << result;
  }
  EXPECT_EQ(result.value("objects", 0), 2000) << result;
  EXPECT_GE(result.value("readable_fraction", 0.0), 0.999) << result << "\n" << log;
  EXPECT_EQ(result.value("wrong_bytes", uint64_t{1}), 0u) << result;
  EXPECT_TRUE(result["resume_put_s"].is_number()) << result;
  EXPECT_TRUE(result["resume_get_s"].is_number()) << result;
}

// (e) The bench itself, restart mode (no etcd needed).
TEST(HaE2ETest, FailoverBenchRestartModeReportsFullRecovery) {
  std::string log;
  json result = RunFailoverBench("restart", &log);
  ExpectFullRecovery(result, "restart", log);
}

// (e) The bench itself, standby mode (it starts its own etcd).
TEST(HaE2ETest, FailoverBenchStandbyModeReportsFullRecovery) {
  std::string why;
  if (!etcd::EtcdTestServer::Available(&why)) GTEST_SKIP() << why;
  std::string log;
  json result = RunFailoverBench("standby", &log);
  ExpectFullRecovery(result, "standby", log);
}

}  // namespace
}  // namespace larder
