// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The store end to end: a real larder-master process and store clients in their own processes
// (`larder-bench store-worker`), talking gRPC to the master and shm or tcp to each other.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <httplib.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "bench/process.h"

namespace larder {
namespace {

using bench::ChildProcess;
using json = nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

std::string Bin(const std::string& name) {
  const char* dir = std::getenv("LARDER_BIN_DIR");
  return std::string(dir != nullptr ? dir : ".") + "/" + name;
}

struct Master {
  ChildProcess process;
  std::string address;  // ip:port
  int http_port = 0;
};

Master StartMaster(std::vector<std::string> flags, const std::string& port = "0") {
  std::vector<std::string> argv = {Bin("larder-master"), "--host", "127.0.0.1",     "--port", port,
                                   "--http-port",        "0",      "--parent-watch"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto child = ChildProcess::Spawn(argv, {}, seconds(20));
  EXPECT_TRUE(child.ok()) << child.status();
  Master master;
  if (!child.ok()) return master;
  std::string announced = child->address();
  master.address = announced.substr(0, announced.find(' '));
  master.http_port = std::stoi(announced.substr(announced.find(' ') + 1));
  master.process = std::move(*child);
  return master;
}

ChildProcess StartWorker(const Master& master, const std::string& name,
                         const std::string& segment_size = "64M",
                         std::map<std::string, std::string> env = {}) {
  auto child = ChildProcess::Spawn({Bin("larder-bench"), "store-worker", "--master", master.address,
                                    "--segment-size", segment_size, "--segment-name", name},
                                   env, seconds(20));
  EXPECT_TRUE(child.ok()) << child.status();
  return child.ok() ? std::move(*child) : ChildProcess();
}

json Send(ChildProcess& worker, const json& command, milliseconds timeout = seconds(60)) {
  Status written = worker.WriteLine(command.dump());
  EXPECT_TRUE(written.ok()) << written;
  auto line = worker.ReadLine(timeout);
  EXPECT_TRUE(line.ok()) << line.status();
  if (!line.ok()) return json{{"error", line.status().ToString()}};
  json reply = json::parse(*line, nullptr, false);
  EXPECT_FALSE(reply.is_discarded()) << *line;
  EXPECT_FALSE(reply.contains("error")) << *line;
  reply.erase("lat_us");  // keeps failure messages readable
  return reply;
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
  // from0/0 was just read: its lease holds it (Unavailable, retry later).
  EXPECT_EQ(Put(workers[2], "rm/", 1, 4096, "w0")["ok"], 1);
  json removed = Send(workers[2], {{"cmd", "remove"}, {"keys", {"rm/0", "from0/0", "nope"}}});
  EXPECT_EQ(removed["codes"], json({0, 14, 5}));  // OK, Unavailable, NotFound
  EXPECT_EQ(Send(workers[0], {{"cmd", "exist"}, {"keys", {"rm/0"}}})["exist"], json({false}));
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

// kill -9 of a client under load: readers keep working, objects with a replica elsewhere stay
// readable, and the dead client's segment and objects leave the pool.
TEST(StoreE2ETest, KilledClientIsExpiredAndReplicasElsewhereStayReadable) {
  Master master = StartMaster({"--client-ttl", "2s"});
  ChildProcess a = StartWorker(master, "a");
  ChildProcess b = StartWorker(master, "b");
  ChildProcess c = StartWorker(master, "c");
  // Two replicas: b's segment first, then (local first) a's own.
  EXPECT_EQ(Put(a, "dup/", 64, 64 * 1024, "b", 2)["ok"], 64);
  EXPECT_EQ(Put(a, "only-b/", 16, 64 * 1024, "b")["ok"], 16);
  // c reads dup/ for 3 s while b dies.
  ASSERT_TRUE(Begin(c, "get", "dup/", 64, 64 * 1024, 8, 3.0).ok());
  std::this_thread::sleep_for(milliseconds(500));
  b.Kill(SIGKILL);
  b.Stop(seconds(5));
  json load = ReadReply(c);
  EXPECT_GT(load["verified"].get<int>(), 0) << load;
  EXPECT_EQ(load["wrong"], 0) << load;
  EXPECT_EQ(load["errors"], 0) << load;
  EXPECT_EQ(load["missing"], 0) << load;
  // After the TTL, b's objects are gone and its segment unmounted; dup/ still reads from a.
  std::this_thread::sleep_for(milliseconds(3000));
  json only_b = Send(c, {{"cmd", "exist"}, {"keys", Keys("only-b/", 16)}});
  for (const json& e : only_b["exist"]) EXPECT_EQ(e, false) << only_b;
  json dup = Get(c, "dup/", 64, 64 * 1024);
  EXPECT_EQ(dup["verified"], 64) << dup;
  ASSERT_TRUE(c.WriteLine(json{{"cmd", "route"}, {"segment", "b"}}.dump()).ok());
  auto route = c.ReadLine(seconds(10));
  ASSERT_TRUE(route.ok());
  EXPECT_NE(route->find("no segment named 'b'"), std::string::npos) << *route;
}

// The value of one Prometheus counter or gauge from the master's /metrics.
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
  // A fast enough reader may hold a lease on every object in the pool at some moment; a put then
  // fails, and for that reason only (PutsEvictAroundObjectsReadersHold bounds what is leased).
  EXPECT_EQ(wrote["errors"], wrote["error_codes"].value("ResourceExhausted", 0)) << wrote;
  if (wrote["errors"].get<int>() > 0) {
    EXPECT_NE(wrote["first_error"].get<std::string>().find("nothing is evictable"),
              std::string::npos)
        << wrote;
  }
  // Once the reader's leases run out, fresh puts succeed again and read back intact.
  std::this_thread::sleep_for(milliseconds(2100));
  EXPECT_EQ(Put(writer, "last/", 10, 64 * 1024, "small")["ok"], 10);
  EXPECT_EQ(Get(reader, "last/", 10, 64 * 1024)["verified"], 10);
  // The pool holds 64 values: of the first 200 keys, at most 64 can still be there (which ones
  // depends on what the reader touched last).
  json first = Send(reader, {{"cmd", "exist"}, {"keys", Keys("p/", 200)}});
  int present = 0;
  for (const json& e : first["exist"]) present += e == true ? 1 : 0;
  EXPECT_LE(present, 64) << first;
}

// A reader keeps 16 objects leased (it reads them again and again) while a writer puts 2000
// more into a pool of 64: every put succeeds by evicting other objects, and no held object is
// ever evicted.
TEST(StoreE2ETest, PutsEvictAroundObjectsReadersHold) {
  Master master = StartMaster({"--lease-ttl", "2s"});
  ChildProcess owner = StartWorker(master, "small", "4M");
  ChildProcess writer = StartWorker(master, "writer", "0");
  ChildProcess reader = StartWorker(master, "reader", "0");
  ASSERT_EQ(Put(writer, "held/", 16, 64 * 1024, "small")["ok"], 16);
  ASSERT_TRUE(Begin(reader, "get", "held/", 16, 64 * 1024, 8, 6.0).ok());
  std::this_thread::sleep_for(milliseconds(300));  // every held object is leased by now
  json wrote = Send(writer, {{"cmd", "put"},
                             {"prefix", "p/"},
                             {"count", 2000},
                             {"value_size", 64 * 1024},
                             {"batch", 8},
                             {"preferred", "small"}});
  EXPECT_EQ(wrote["ok"], 2000) << wrote;  // puts never fail while something is evictable
  json held = Send(writer, {{"cmd", "exist"}, {"keys", Keys("held/", 16)}});
  for (const json& e : held["exist"]) EXPECT_EQ(e, true) << held;
  json read = ReadReply(reader);
  EXPECT_EQ(read["missing"], 0) << read;  // a held object was never evicted
  EXPECT_EQ(read["wrong"], 0) << read;
  EXPECT_EQ(read["errors"], 0) << read;
  EXPECT_EQ(read["retryable"], 0) << read;
  EXPECT_GT(read["verified"].get<int>(), 0) << read;
  EXPECT_GE(Metric(master, "larder_evictions_total"), 2000 + 16 - 64);
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
  bool recovered = false;
  for (int attempt = 0; attempt < 40 && !recovered; ++attempt) {
    json put = Put(a, "after/", 10, 4096, "b");
    recovered = put["ok"] == 10;
    if (!recovered) std::this_thread::sleep_for(milliseconds(250));
  }
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
