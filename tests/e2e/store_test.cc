// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The store end to end: a real larder-master process and store clients in their own processes
// (`larder-bench store-worker`), talking gRPC to the master and shm or tcp to each other.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <httplib.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "client/master_client.h"
#include "common/child_process.h"
#include "testing/binaries.h"
#include "testing/json_worker.h"
#include "testing/master_process.h"
#include "transfer/testing/test_util.h"

namespace larder {
namespace {

using larder::ChildProcess;
using json = nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

using larder::test::Bin;

using Master = larder::test::MasterProcess;

// A larder-master on loopback; `port` "0" picks a free one. Its address is empty when it did not
// start.
Master StartMaster(const std::vector<std::string>& flags, const std::string& port = "0") {
  auto master = larder::test::SpawnMaster("", port, flags, {});
  EXPECT_TRUE(master.ok()) << master.status();
  return master.ok() ? std::move(*master) : Master();
}

ChildProcess StartWorker(const Master& master, const std::string& name,
                         const std::string& segment_size = "64M",
                         std::map<std::string, std::string> env = {},
                         std::vector<std::string> flags = {}) {
  std::vector<std::string> argv = {
      Bin("larder-bench"), "store-worker", "--master",       master.address,
      "--segment-size",    segment_size,   "--segment-name", name};
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto child = ChildProcess::Spawn(argv, env, seconds(20));
  EXPECT_TRUE(child.ok()) << child.status();
  return child.ok() ? std::move(*child) : ChildProcess();
}

json Send(ChildProcess& worker, const json& command, milliseconds timeout = seconds(60)) {
  auto reply = test::Exchange(worker, command, timeout);
  EXPECT_TRUE(reply.ok()) << reply.status();
  if (!reply.ok()) return json{{"error", reply.status().ToString()}};
  EXPECT_FALSE(reply->contains("error")) << *reply;
  return *reply;
}

// Starts a put or get loop on `worker` without waiting for it (0 s: every key once, else random
// keys for that long); ReadReply collects its answer.
Status Begin(ChildProcess& worker, const std::string& cmd, const std::string& prefix, int count,
             uint64_t value_size, int batch, double duration_s = 0) {
  return worker.WriteLine(json{
      {"cmd", cmd},
      {"prefix", prefix},
      {"count", count},
      {"value_size", value_size},
      {"batch", batch},
      {"duration",
       duration_s}}.dump());
}

json ReadReply(ChildProcess& worker) {
  auto line = worker.ReadLine(seconds(120));
  EXPECT_TRUE(line.ok()) << line.status();
  json reply = line.ok() ? json::parse(*line, nullptr, false) : json{};
  if (reply.is_object()) reply.erase("lat_us");
  return reply;
}

json Put(ChildProcess& worker, const std::string& prefix, int count, uint64_t value_size,
         const std::string& preferred, int replicas = 1) {
  return Send(worker, {{"cmd", "put"},
                       {"prefix", prefix},
                       {"count", count},
                       {"value_size", value_size},
                       {"batch", 16},
                       {"preferred", preferred},
                       {"replicas", replicas}});
}

json Get(ChildProcess& worker, const std::string& prefix, int count, uint64_t value_size) {
  return Send(worker, {{"cmd", "get"},
                       {"prefix", prefix},
                       {"count", count},
                       {"value_size", value_size},
                       {"batch", 16}});
}

std::vector<std::string> Keys(const std::string& prefix, int count) {
  std::vector<std::string> keys;
  for (int i = 0; i < count; ++i) keys.push_back(prefix + std::to_string(i));
  return keys;
}

// Three processes; each writes into the next one's segment and reads what the others wrote.
TEST(StoreE2ETest, ThreeClientsPutAndGetAcrossProcesses) {
  Master master = StartMaster({});
  std::vector<ChildProcess> workers;
  for (int i = 0; i < 3; ++i) workers.push_back(StartWorker(master, "w" + std::to_string(i)));
  for (int i = 0; i < 3; ++i) {
    std::string target = "w" + std::to_string((i + 1) % 3);
    json put = Put(workers[i], "from" + std::to_string(i) + "/", 100, 64 * 1024, target);
    EXPECT_EQ(put["ok"], 100) << put;
    EXPECT_EQ(put["errors"], 0) << put;
    json route = Send(workers[i], {{"cmd", "route"}, {"segment", target}});
    EXPECT_EQ(route["route"], "shm") << "same-host peers must not go through the network";
  }
  for (int reader = 0; reader < 3; ++reader) {
    for (int writer = 0; writer < 3; ++writer) {
      json got = Get(workers[reader], "from" + std::to_string(writer) + "/", 100, 64 * 1024);
      EXPECT_EQ(got["verified"], 100) << got;
      EXPECT_EQ(got["wrong"], 0) << got;
      EXPECT_EQ(got["errors"], 0) << got;
    }
  }
  // Immutable: a second put succeeds without rewriting; exist sees every key; remove works.
  json again = Put(workers[0], "from1/", 10, 64 * 1024, "w0");
  EXPECT_EQ(again["ok"], 10);
  json exist = Send(workers[2], {{"cmd", "exist"}, {"keys", {"from0/0", "from0/99", "nope"}}});
  EXPECT_EQ(exist["exist"], json({true, true, false}));
  // from0/0 was read, but every reader released its lease when its copy ended (on the back of
  // its next call), so nothing holds it any more.
  EXPECT_EQ(Put(workers[2], "rm/", 1, 4096, "w0")["ok"], 1);
  json removed = Send(workers[2], {{"cmd", "remove"}, {"keys", {"rm/0", "from0/0", "nope"}}});
  EXPECT_EQ(removed["codes"], json({0, 0, 5}));  // OK, OK, NotFound
  EXPECT_EQ(Send(workers[0], {{"cmd", "exist"}, {"keys", {"rm/0"}}})["exist"], json({false}));
}

std::string WriteTokenFile(const std::string& name, const std::string& token) {
  std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << token << "\n";
  return path;
}

// With a cluster token, clients that hold it store and read across processes over shm and tcp;
// a process without it, or with a wrong one, cannot even join, and the cache is unchanged.
TEST(StoreE2ETest, TheClusterTokenGuardsTheMasterAndThePeers) {
  const std::string token = "e2e-cluster-token-0123456789";
  const std::string admin = "e2e-admin-token-0123456789";
  Master master = StartMaster({"--auth-token-file", WriteTokenFile("cluster.token", token),
                               "--admin-token-file", WriteTokenFile("admin.token", admin)});
  ChildProcess a = StartWorker(master, "a", "64M", {{"LARDER_AUTH_TOKEN", token}});
  ChildProcess b = StartWorker(master, "b", "64M", {{"LARDER_AUTH_TOKEN", token}});
  ChildProcess c = StartWorker(master, "c", "64M",
                               {{"LARDER_AUTH_TOKEN", token}, {"LARDER_STORE_PROTOCOL", "tcp"}});
  EXPECT_EQ(Put(a, "shm/", 50, 64 * 1024, "b")["ok"], 50);
  EXPECT_EQ(Send(a, {{"cmd", "route"}, {"segment", "b"}})["route"], "shm");
  EXPECT_EQ(Put(c, "tcp/", 50, 64 * 1024, "a")["ok"], 50);
  EXPECT_EQ(Send(c, {{"cmd", "route"}, {"segment", "a"}})["route"], "tcp");
  EXPECT_EQ(Get(b, "tcp/", 50, 64 * 1024)["verified"], 50);
  EXPECT_EQ(Get(c, "shm/", 50, 64 * 1024)["verified"], 50);

  for (const std::string& wrong : {std::string(), std::string("not-the-token-0123456789")}) {
    std::map<std::string, std::string> env = {{"LARDER_AUTH_TOKEN", wrong}};
    auto intruder =
        ChildProcess::Spawn({Bin("larder-bench"), "store-worker", "--master", master.address,
                             "--segment-size", "64M", "--segment-name", "intruder"},
                            env, seconds(20));
    EXPECT_FALSE(intruder.ok()) << "a client without the token joined";
  }
  // RemoveAll needs the operator token.
  json refused = Send(a, {{"cmd", "remove_all"}}, seconds(60));
  EXPECT_NE(refused.value("code", ""), "OK") << refused;
  EXPECT_EQ(Get(b, "shm/", 50, 64 * 1024)["verified"], 50);
  EXPECT_EQ(Get(a, "tcp/", 50, 64 * 1024)["verified"], 50);
}

TEST(StoreE2ETest, StoreProtocolTcpTakesTheNetworkPath) {
  Master master = StartMaster({});
  ChildProcess a = StartWorker(master, "a", "64M", {{"LARDER_STORE_PROTOCOL", "tcp"}});
  ChildProcess b = StartWorker(master, "b", "64M", {{"LARDER_STORE_PROTOCOL", "tcp"}});
  json route = Send(a, {{"cmd", "route"}, {"segment", "b"}});
  EXPECT_EQ(route["route"], "tcp");
  EXPECT_EQ(Put(a, "k/", 50, 256 * 1024, "b")["ok"], 50);
  json got = Get(a, "k/", 50, 256 * 1024);
  EXPECT_EQ(got["verified"], 50) << got;
}

// Two processes of one host on the device protocol, each with its segment in (emulated) device
// memory on its own device: each reads and writes the other's through the device route (the
// owner's exported handle, imported on the reader's device), never through the network.
TEST(StoreE2ETest, TheDeviceProtocolMovesBytesBetweenProcessesThroughDeviceMemory) {
  Master master = StartMaster({});
  const std::map<std::string, std::string> device_env = {{"LARDER_STORE_PROTOCOL", "device"}};
  ChildProcess a = StartWorker(master, "a", "32M", device_env, {"--device", "0"});
  ChildProcess b = StartWorker(master, "b", "32M", device_env, {"--device", "1"});
  EXPECT_EQ(Send(a, {{"cmd", "route"}, {"segment", "b"}})["route"], "device");
  EXPECT_EQ(Send(b, {{"cmd", "route"}, {"segment", "a"}})["route"], "device");
  constexpr uint64_t kValue = 3 << 20;  // crosses 2 MiB registration boundaries on both sides
  EXPECT_EQ(Put(a, "into-b/", 6, kValue, "b")["ok"], 6);
  EXPECT_EQ(Put(b, "into-a/", 6, kValue, "a")["ok"], 6);
  for (ChildProcess* reader : {&a, &b}) {
    for (const char* prefix : {"into-a/", "into-b/"}) {
      json got = Get(*reader, prefix, 6, kValue);
      EXPECT_EQ(got["verified"], 6) << prefix << got;
      EXPECT_EQ(got["wrong"], 0) << got;
    }
  }
  json stats = Send(a, {{"cmd", "stats"}});
  EXPECT_GE(stats["routes"]["device"]["bytes"].get<uint64_t>(), 12 * kValue) << stats;
  EXPECT_FALSE(stats["routes"].contains("tcp")) << stats;
  EXPECT_FALSE(stats["routes"].contains("shm")) << stats;
  // a maps b's device segment (one import), and its own needs none.
  EXPECT_EQ(stats["device_imports"], 1) << stats;
  EXPECT_GE(stats["device_imported_bytes"].get<uint64_t>(), 32u << 20) << stats;
  EXPECT_EQ(stats["device_import_failures"], 0) << stats;
}

// Devices without peer access to each other: the device route cannot import the other's memory,
// so it is reached as another host's is, over tcp through pinned staging on both ends
// ("tcp-staged", counted as such), never by a CPU route touching device memory; a device of the
// same group is reached over the device route.
TEST(StoreE2ETest, DevicesWithoutPeerAccessReachEachOtherOnlyThroughStaging) {
  Master master = StartMaster({});
  const std::map<std::string, std::string> env = {{"LARDER_STORE_PROTOCOL", "device,tcp"},
                                                  {"LARDER_EMULATED_DEVICE_PEERS", "0-3,4-7"}};
  ChildProcess a = StartWorker(master, "a", "16M", env, {"--device", "1"});
  ChildProcess near = StartWorker(master, "near", "16M", env, {"--device", "2"});
  ChildProcess far = StartWorker(master, "far", "16M", env, {"--device", "5"});
  EXPECT_EQ(Send(a, {{"cmd", "route"}, {"segment", "near"}})["route"], "device");
  EXPECT_EQ(Send(a, {{"cmd", "route"}, {"segment", "far"}})["route"], "tcp-staged");
  EXPECT_EQ(Put(a, "near/", 4, 1 << 20, "near")["ok"], 4);
  json got = Get(a, "near/", 4, 1 << 20);
  EXPECT_EQ(got["verified"], 4) << got;
  // Into far's device memory and back, through staging; far reads its own.
  EXPECT_EQ(Put(a, "far/", 2, 1 << 20, "far")["ok"], 2);
  got = Get(a, "far/", 2, 1 << 20);
  EXPECT_EQ(got["verified"], 2) << got;
  EXPECT_EQ(Get(far, "far/", 2, 1 << 20)["verified"], 2);
}

TEST(StoreE2ETest, BadInputGetsClearErrorsAndTheMasterKeepsServing) {
  Master master = StartMaster({"--max-key-size", "32"});
  ChildProcess a = StartWorker(master, "a", "8M");
  json empty = Send(a, {{"cmd", "put"}, {"keys", {""}}, {"value_size", 64}});
  EXPECT_EQ(empty["errors"], 1);
  EXPECT_NE(empty["first_error"].get<std::string>().find("empty key"), std::string::npos);
  json long_key = Send(a, {{"cmd", "put"}, {"keys", {std::string(33, 'k')}}, {"value_size", 64}});
  EXPECT_NE(long_key["first_error"].get<std::string>().find("exceeds the maximum"),
            std::string::npos);
  json huge = Send(a, {{"cmd", "put"}, {"keys", {"huge"}}, {"value_size", 16 << 20}});
  EXPECT_NE(huge["first_error"].get<std::string>().find("larger than every mounted segment"),
            std::string::npos)
      << huge;
  json dup = Send(a, {{"cmd", "put"}, {"keys", {"d", "d"}}, {"value_size", 64}, {"batch", 2}});
  EXPECT_EQ(dup["ok"], 1);
  EXPECT_NE(dup["first_error"].get<std::string>().find("appears twice"), std::string::npos);
  json missing = Send(a, {{"cmd", "get"}, {"keys", {"unknown"}}, {"value_size", 64}});
  EXPECT_EQ(missing["missing"], 1);
  // Still serving.
  EXPECT_EQ(Put(a, "ok/", 5, 64, "a")["ok"], 5);
  EXPECT_EQ(Get(a, "ok/", 5, 64)["verified"], 5);
}

// The value of one Prometheus counter or gauge from the master's /metrics.
// The master's view of one client (GET /api/clients), or an empty object.
json ClientView(httplib::Client& http, const std::string& client_id) {
  auto response = http.Get("/api/clients");
  if (!response || response->status != 200) return json::object();
  json list = json::parse(response->body, nullptr, /*allow_exceptions=*/false);
  if (!list.is_object() || !list.contains("clients")) return json::object();
  for (const json& client : list["clients"]) {
    if (client.value("client_id", "") == client_id) return client;
  }
  return json::object();
}

double Metric(const Master& master, const std::string& name) {
  httplib::Client http("127.0.0.1", master.http_port);
  auto response = http.Get("/metrics");
  EXPECT_TRUE(response) << "no answer from /metrics";
  if (!response) return -1;
  size_t at = response->body.find("\n" + name + " ");
  EXPECT_NE(at, std::string::npos) << name << " missing from /metrics";
  if (at == std::string::npos) return -1;
  return std::stod(response->body.substr(at + name.size() + 2));
}

// Reads a metric until it reaches `at_least` or `timeout` passes, and returns its last value. Each
// read is one round trip to the master's /metrics, which paces the loop.
double WaitForMetric(const Master& master, const std::string& name, double at_least,
                     milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  double value = Metric(master, name);
  while (value >= 0 && value < at_least && std::chrono::steady_clock::now() < deadline) {
    value = Metric(master, name);
  }
  return value;
}

// kill -9 of a client under load: readers keep working, objects with a replica elsewhere stay
// readable, and the dead client's segment and objects leave the pool.
TEST(StoreE2ETest, KilledClientIsExpiredAndReplicasElsewhereStayReadable) {
  Master master = StartMaster({"--client-ttl", "4s"});
  ChildProcess a = StartWorker(master, "a");
  ChildProcess b = StartWorker(master, "b");
  ChildProcess c = StartWorker(master, "c");
  // Two replicas: b's segment first, then (local first) a's own.
  EXPECT_EQ(Put(a, "dup/", 64, 64 * 1024, "b", 2)["ok"], 64);
  EXPECT_EQ(Put(a, "only-b/", 16, 64 * 1024, "b")["ok"], 16);
  // c reads dup/ for 3 s while b dies.
  const double gets = Metric(master, "larder_gets_total");
  ASSERT_TRUE(Begin(c, "get", "dup/", 64, 64 * 1024, 8, 3.0).ok());
  // b dies once c's load is reading.
  EXPECT_GT(WaitForMetric(master, "larder_gets_total", gets + 1, seconds(10)), gets);
  b.Kill(SIGKILL);
  b.Stop(seconds(5));
  json load = ReadReply(c);
  EXPECT_GT(load["verified"].get<int>(), 0) << load;
  EXPECT_EQ(load["wrong"], 0) << load;
  EXPECT_EQ(load["errors"], 0) << load;
  EXPECT_EQ(load["missing"], 0) << load;
  // After the TTL, b's objects are gone and its segment unmounted; dup/ still reads from a.
  // Each exist is one round trip to c, which paces the loop.
  auto deadline = std::chrono::steady_clock::now() + seconds(20);
  json only_b;
  do {
    only_b = Send(c, {{"cmd", "exist"}, {"keys", Keys("only-b/", 16)}});
  } while (only_b["exist"] != json(std::vector<bool>(16, false)) &&
           std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(only_b["exist"], json(std::vector<bool>(16, false))) << only_b;
  json dup = Get(c, "dup/", 64, 64 * 1024);
  EXPECT_EQ(dup["verified"], 64) << dup;
  ASSERT_TRUE(c.WriteLine(json{{"cmd", "route"}, {"segment", "b"}}.dump()).ok());
  auto route = c.ReadLine(seconds(10));
  ASSERT_TRUE(route.ok());
  EXPECT_NE(route->find("no segment named 'b'"), std::string::npos) << *route;
}

// Reads a worker's stats until `done` accepts them or `timeout` passes; returns the last ones.
// Each read is one round trip to the worker, which paces the loop.
template <typename Condition>
json WaitForStats(ChildProcess& worker, Condition done, milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  json stats = Send(worker, {{"cmd", "stats"}});
  while (!done(stats) && std::chrono::steady_clock::now() < deadline) {
    stats = Send(worker, {{"cmd", "stats"}});
  }
  return stats;
}

// A reader's device imports go with the segments: an owner killed (expired by the master) and an
// owner that unmounts each take the reader's import of their segment with them.
TEST(StoreE2ETest, ReadersDropTheDeviceImportsOfSegmentsThatAreGone) {
  Master master = StartMaster({"--client-ttl", "3s"});
  const std::map<std::string, std::string> env = {{"LARDER_STORE_PROTOCOL", "device"}};
  ChildProcess reader = StartWorker(master, "reader", "8M", env, {"--device", "0"});
  ChildProcess killed = StartWorker(master, "killed", "16M", env, {"--device", "1"});
  ChildProcess leaving = StartWorker(master, "leaving", "16M", env, {"--device", "2"});
  for (ChildProcess* owner : {&killed, &leaving}) {
    const std::string name = owner == &killed ? "killed" : "leaving";
    EXPECT_EQ(Put(*owner, name + "/", 4, 1 << 20, name)["ok"], 4);
    EXPECT_EQ(Get(reader, name + "/", 4, 1 << 20)["verified"], 4);
  }
  json both = Send(reader, {{"cmd", "stats"}});
  EXPECT_EQ(both["device_imports"], 2) << both;
  // The reader's heartbeats carry its imports to the master (/api/clients).
  httplib::Client http("127.0.0.1", master.http_port);
  json reader_view;
  EXPECT_TRUE(testutil::WaitUntil(
      [&] {
        reader_view = ClientView(http, both["client_id"]);
        return reader_view.value("device_imports", 0) == 2;
      },
      seconds(20)))
      << reader_view;
  killed.Kill(SIGKILL);
  killed.Stop(seconds(5));
  json one = WaitForStats(
      reader, [](const json& s) { return s["device_imports"] == 1; }, seconds(20));
  EXPECT_EQ(one["device_imports"], 1) << one;
  EXPECT_EQ(Send(leaving, {{"cmd", "unmount"}})["unmounted"], true);
  json none = WaitForStats(
      reader, [](const json& s) { return s["device_imports"] == 0; }, seconds(20));
  EXPECT_EQ(none["device_imports"], 0) << none;
  EXPECT_EQ(none["device_imported_bytes"], 0) << none;
  EXPECT_EQ(none["device_import_calls"], 2) << none;
}

TEST(StoreE2ETest, ReadersDropTheMappingsOfSegmentsThatAreGone) {
  // A reader maps each owner's segment on its first read of it. When an owner dies (its process
  // is watched) or unmounts (the master says so), the mapping goes and the memory with it.
  Master master = StartMaster({"--client-ttl", "3s"});
  ChildProcess reader = StartWorker(master, "reader", "16M");
  constexpr int kOwners = 4;
  constexpr int kValues = 48;
  constexpr uint64_t kValueSize = 1 << 20;
  std::vector<ChildProcess> owners;
  for (int i = 0; i < kOwners; ++i) {
    std::string name = "owner" + std::to_string(i);
    owners.push_back(StartWorker(master, name, "128M"));
    EXPECT_EQ(Put(owners.back(), name + "/", kValues, kValueSize, name)["ok"], kValues);
  }
  const json baseline = Send(reader, {{"cmd", "stats"}});
  for (int i = 0; i < kOwners; ++i) {
    std::string name = "owner" + std::to_string(i);
    EXPECT_EQ(Get(reader, name + "/", kValues, kValueSize)["verified"], kValues);
  }
  json mapped = Send(reader, {{"cmd", "stats"}});
  EXPECT_EQ(mapped["mapped_segments"], kOwners) << mapped;
  EXPECT_EQ(mapped["mapped_bytes"], kOwners * (128ull << 20)) << mapped;
  const uint64_t per_owner = kValues * kValueSize;
  uint64_t shmem = mapped["rss_shmem_bytes"].get<uint64_t>();
  EXPECT_GE(shmem, baseline["rss_shmem_bytes"].get<uint64_t>() + kOwners * per_owner) << mapped;
  // Every byte came over shm, none over tcp.
  EXPECT_GE(mapped["routes"]["shm"]["bytes"].get<uint64_t>(), kOwners * per_owner) << mapped;
  EXPECT_FALSE(mapped["routes"].contains("tcp")) << mapped;

  // Owners killed in turn: each time the reader's shared memory falls by what it had mapped.
  for (int i = 0; i < kOwners - 1; ++i) {
    owners[i].Kill(SIGKILL);
    owners[i].Stop(seconds(5));
    const int left = kOwners - 1 - i;
    json after = WaitForStats(
        reader, [&](const json& s) { return s["mapped_segments"] == left; }, seconds(10));
    EXPECT_EQ(after["mapped_segments"], left) << after;
    const uint64_t now = after["rss_shmem_bytes"].get<uint64_t>();
    EXPECT_LE(now + per_owner - (4 << 20), shmem) << "owner " << i << ": " << after;
    shmem = now;
  }
  // The last owner leaves the cluster but its process lives on: the master's report drops it.
  EXPECT_EQ(Send(owners.back(), {{"cmd", "unmount"}})["unmounted"], true);
  json last = WaitForStats(
      reader, [](const json& s) { return s["mapped_segments"] == 0; }, seconds(10));
  EXPECT_EQ(last["mapped_segments"], 0) << last;
  EXPECT_EQ(last["mappings_dropped"], kOwners - 1) << last;
  EXPECT_LE(last["rss_shmem_bytes"].get<uint64_t>(),
            baseline["rss_shmem_bytes"].get<uint64_t>() + (8 << 20))
      << last;

  // The reader's heartbeats carried its traffic to the master (/api/clients).
  httplib::Client http("127.0.0.1", master.http_port);
  json reader_view = ClientView(http, last["client_id"]);
  EXPECT_GT(reader_view["routes"].value("shm", json::object()).value("bytes", 0), 0) << reader_view;
}

// Eviction under pressure while a reader holds leases: a reader may miss an evicted key, but
// never sees the bytes of another object.
TEST(StoreE2ETest, EvictionUnderPressureNeverShowsAnotherObjectsBytes) {
  Master master = StartMaster({"--lease-ttl", "2s"});
  ChildProcess owner = StartWorker(master, "small", "4M");
  ChildProcess writer = StartWorker(master, "writer", "0");
  ChildProcess reader = StartWorker(master, "reader", "0");
  // 64 KiB values into a 4 MiB segment: 64 fit, the writer puts 2000 of them while the reader
  // reads random ones of the 2000.
  ASSERT_TRUE(Begin(writer, "put", "p/", 2000, 64 * 1024, 8).ok());
  ASSERT_TRUE(Begin(reader, "get", "p/", 2000, 64 * 1024, 8, 3.0).ok());
  json wrote = ReadReply(writer);
  json read = ReadReply(reader);
  EXPECT_EQ(read["wrong"], 0) << read;
  // Misses (evicted) and retryable errors (still being written) are expected; nothing else.
  EXPECT_EQ(read["errors"], 0) << read;
  EXPECT_GT(read["verified"].get<int>(), 0) << read;
  // Objects were evicted to make room while the reader read.
  EXPECT_GT(wrote["ok"].get<int>(), 64) << wrote;
  EXPECT_GT(Metric(master, "larder_evictions_total"), 0);
  // The reader holds leases only while it copies, so every put finds something to evict.
  EXPECT_EQ(wrote["errors"], 0) << wrote;
  EXPECT_EQ(wrote["ok"], 2000) << wrote;
  EXPECT_EQ(Put(writer, "last/", 10, 64 * 1024, "small")["ok"], 10);
  EXPECT_EQ(Get(reader, "last/", 10, 64 * 1024)["verified"], 10);
  // The pool holds 64 values: of the first 200 keys, at most 64 can still be there (which ones
  // depends on what the reader touched last).
  json first = Send(reader, {{"cmd", "exist"}, {"keys", Keys("p/", 200)}});
  int present = 0;
  for (const json& e : first["exist"]) present += e == true ? 1 : 0;
  EXPECT_LE(present, 64) << first;
}

// A reader holds leases on 16 objects (the test plays a reader stuck mid-copy, through the
// master's own API) while a writer puts 2000 more into a pool of 64: every put succeeds by
// evicting other objects, and no held object is evicted. Once released, the held objects are
// plain LRU objects again: the oldest, so the next puts evict them first. The next puts are 32,
// half the pool: ranges that earlier evictions freed may come back to the pool meanwhile (once
// the owner acknowledges their removal), so a few of those puts may need no eviction at all.
TEST(StoreE2ETest, PutsEvictAroundObjectsReadersHold) {
  Master master = StartMaster({"--lease-ttl", "60s", "--client-ttl", "60s"});
  ChildProcess owner = StartWorker(master, "small", "4M");
  ChildProcess writer = StartWorker(master, "writer", "0");
  ASSERT_EQ(Put(writer, "held/", 16, 64 * 1024, "small")["ok"], 16);
  client::MasterClient rpc(master.address, seconds(10));
  proto::MountSegmentsRequest mount;
  proto::MountSegmentsReply mounted;
  mount.set_client_id("stuck-reader");
  mount.set_host_id("test");
  ASSERT_TRUE(rpc.Call("MountSegments", &proto::Master::Stub::MountSegments, mount, &mounted).ok());
  proto::BatchKeysRequest get;
  proto::BatchGetReplicasReply leased;
  get.set_client_id("stuck-reader");
  for (const std::string& key : Keys("held/", 16)) get.add_keys(key);
  ASSERT_TRUE(
      rpc.Call("BatchGetReplicas", &proto::Master::Stub::BatchGetReplicas, get, &leased).ok());
  ASSERT_EQ(leased.errors_size(), 0);
  ASSERT_NE(leased.lease_id(), 0u);

  json wrote = Send(writer, {{"cmd", "put"},
                             {"prefix", "p/"},
                             {"count", 2000},
                             {"value_size", 64 * 1024},
                             {"batch", 8},
                             {"preferred", "small"}});
  EXPECT_EQ(wrote["ok"], 2000) << wrote;  // puts never fail while something is evictable
  json held = Send(writer, {{"cmd", "exist"}, {"keys", Keys("held/", 16)}});
  for (const json& e : held["exist"]) EXPECT_EQ(e, true) << held;
  EXPECT_GE(Metric(master, "larder_evictions_total"), 2000 + 16 - 64);

  proto::ReleaseLeasesRequest release;
  proto::ReleaseLeasesReply released;
  release.set_client_id("stuck-reader");
  release.add_lease_id(leased.lease_id());
  ASSERT_TRUE(
      rpc.Call("ReleaseLeases", &proto::Master::Stub::ReleaseLeases, release, &released).ok());
  EXPECT_EQ(released.errors_size(), 0);
  EXPECT_EQ(Metric(master, "larder_leases_active"), 0);
  EXPECT_EQ(Put(writer, "after/", 32, 64 * 1024, "small")["ok"], 32);
  held = Send(writer, {{"cmd", "exist"}, {"keys", Keys("held/", 16)}});
  for (const json& e : held["exist"]) EXPECT_EQ(e, false) << held;
  // And the new puts all stayed: they evicted older objects, never one another.
  json recent = Send(writer, {{"cmd", "exist"}, {"keys", Keys("after/", 32)}});
  for (const json& e : recent["exist"]) EXPECT_EQ(e, true) << recent;
}

// Two readers get at full speed from a pool of 64 objects while two writers put 2000 new keys
// each into it. Every object read is leased only while it is copied, so however fast the
// readers are, the writers always find something to evict: no put is refused.
TEST(StoreE2ETest, ReadersAtFullSpeedNeverStarveWriters) {
  Master master = StartMaster({});  // the default lease TTL: 5 s
  ChildProcess owner = StartWorker(master, "small", "4M");
  std::vector<ChildProcess> writers, readers;
  for (int i = 0; i < 2; ++i) {
    writers.push_back(StartWorker(master, "writer" + std::to_string(i), "0"));
    readers.push_back(StartWorker(master, "reader" + std::to_string(i), "0"));
  }
  // Something to read from the start.
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(Put(writers[i], "w" + std::to_string(i) + "/", 32, 64 * 1024, "small")["ok"], 32);
  }
  for (int i = 0; i < 2; ++i) {
    // Readers pick random keys among the first 64 of both writers: at full speed they read every
    // object in the pool many times over within one lease TTL.
    ASSERT_TRUE(
        Begin(readers[i], "get", "w" + std::to_string(i % 2) + "/", 64, 64 * 1024, 8, 4.0).ok());
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(Begin(writers[i], "put", "w" + std::to_string(i) + "/", 2000, 64 * 1024, 8).ok());
  }
  for (int i = 0; i < 2; ++i) {
    json wrote = ReadReply(writers[i]);
    EXPECT_EQ(wrote["errors"], 0) << wrote;  // no put refused, for any reason
    EXPECT_EQ(wrote["ok"], 2000) << wrote;
  }
  for (int i = 0; i < 2; ++i) {
    json read = ReadReply(readers[i]);
    EXPECT_EQ(read["wrong"], 0) << read;
    EXPECT_EQ(read["errors"], 0) << read;
    EXPECT_GT(read["verified"].get<int>(), 0) << read;
  }
  // 64 keys were there before the writers started (their puts of those succeed without
  // rewriting): the pool of 64 took 4000 objects in all.
  EXPECT_GE(Metric(master, "larder_evictions_total"), 4000 - 64);
  EXPECT_GT(Metric(master, "larder_lease_releases_total"), 0);
  EXPECT_EQ(Metric(master, "larder_lease_releases_refused_total"), 0);
  EXPECT_EQ(Metric(master, "larder_put_refusals_total{reason=\"no_space\"}"), 0);
}

// A reader killed with kill -9 between its GetReplicas and its release (its release waits to
// ride on a next call that never comes) never releases: the master ends the lease at the TTL, and
// nothing waits for it meanwhile (puts evict around the objects it holds).
TEST(StoreE2ETest, LeasesOfAKilledReaderExpireAtTheTtl) {
  Master master = StartMaster({"--lease-ttl", "2s"});
  ChildProcess owner = StartWorker(master, "small", "4M");
  ChildProcess writer = StartWorker(master, "writer", "0");
  ChildProcess reader = StartWorker(master, "reader", "0", {{"LARDER_LEASE_RELEASE_DELAY", "60s"}});
  ASSERT_EQ(Put(writer, "r/", 8, 64 * 1024, "small")["ok"], 8);
  EXPECT_EQ(Get(reader, "r/", 8, 64 * 1024)["verified"], 8);
  EXPECT_EQ(Metric(master, "larder_leases_active"), 1);
  reader.Kill(SIGKILL);
  reader.Stop(seconds(5));
  // While its lease lasts, puts still succeed by evicting the objects nobody holds.
  EXPECT_EQ(Put(writer, "p/", 200, 64 * 1024, "small")["ok"], 200);
  EXPECT_EQ(WaitForMetric(master, "larder_lease_expiries_total", 1, seconds(20)), 1);
  EXPECT_EQ(Metric(master, "larder_leases_active"), 0);
  EXPECT_EQ(Metric(master, "larder_lease_releases_total"), 0);
  // What it held is evictable again: it is the oldest, and goes first. (Half the pool's worth of
  // puts, so that they must evict.)
  EXPECT_EQ(Put(writer, "q/", 32, 64 * 1024, "small")["ok"], 32);
  json r = Send(writer, {{"cmd", "exist"}, {"keys", Keys("r/", 8)}});
  for (const json& e : r["exist"]) EXPECT_EQ(e, false) << r;
}

// The master restarts under its clients: they reconnect and remount by themselves; objects known
// only to the old master are gone, new puts and gets work.
TEST(StoreE2ETest, ClientsRemountAfterMasterRestart) {
  Master master = StartMaster({});
  ChildProcess a = StartWorker(master, "a");
  ChildProcess b = StartWorker(master, "b");
  EXPECT_EQ(Put(a, "before/", 10, 4096, "b")["ok"], 10);
  std::string port = master.address.substr(master.address.find(':') + 1);
  master.process.Kill(SIGKILL);
  master.process.Stop(seconds(5));
  Master restarted = StartMaster({}, port);
  ASSERT_EQ(restarted.address, master.address);
  // Heartbeats (every second) notice the new master; a data call remounts on its own as well.
  bool recovered =
      testutil::WaitUntil([&] { return Put(a, "after/", 10, 4096, "b")["ok"] == 10; }, seconds(20));
  ASSERT_TRUE(recovered);
  json after = Get(b, "after/", 10, 4096);
  EXPECT_EQ(after["verified"], 10) << after;
  json before = Send(b, {{"cmd", "exist"}, {"keys", Keys("before/", 3)}});
  EXPECT_EQ(before["exist"], json({false, false, false}));
}

TEST(StoreE2ETest, MasterShutsDownCleanlyOnSigterm) {
  auto child = ChildProcess::Spawn(
      {Bin("larder-master"), "--host", "127.0.0.1", "--port", "0", "--http-port", "-1"}, {},
      seconds(20));
  ASSERT_TRUE(child.ok()) << child.status();
  child->Kill(SIGTERM);
  int status = child->Stop(seconds(10));
  EXPECT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace larder
