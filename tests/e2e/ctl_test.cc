// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// larder-ctl end to end: a larder-master process with a cluster token and an admin token, a store
// client in this process holding objects, and larder-ctl run as an operator would run it.
#include <gtest/gtest.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "common/child_process.h"
#include "larder/store_client.h"
#include "larder/version.h"
#include "testing/binaries.h"
#include "testing/master_process.h"

namespace larder {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using std::chrono::seconds;

constexpr char kClusterToken[] = "cluster-token-of-the-ctl-test-0123456789";
constexpr char kAdminToken[] = "admin-token-of-the-ctl-test-0123456789";

using larder::test::Bin;

std::string Quote(const std::string& arg) {
  std::string out = "'";
  for (char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

struct Ctl {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `command` with the shell: its stdout and exit code (-1 when it did not exit by itself).
Ctl RunShell(const std::string& command) {
  Ctl ctl;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return ctl;
  char buffer[65536];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) ctl.out.append(buffer, n);
  const int status = pclose(pipe);
  ctl.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return ctl;
}

// A store client of the master at `master` with the cluster token and a 16 MiB segment `segment`.
std::unique_ptr<StoreClient> ClientWithSegment(const std::string& master,
                                               const std::string& segment) {
  StoreClientOptions options;
  options.master_address = master;
  options.auth_token = kClusterToken;
  options.global_segment_size = 16 << 20;
  options.segment_name = segment;
  auto client = StoreClient::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(*client) : nullptr;
}

class CtlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("larder-ctl-test-" + std::to_string(getpid()));
    fs::create_directories(dir_);
    std::ofstream(dir_ / "cluster.token") << kClusterToken << "\n";
    std::ofstream(dir_ / "admin.token") << kAdminToken << "\n";
    std::ofstream(dir_ / "wrong.token") << "not-the-admin-token-0123456789\n";
    auto master = larder::test::SpawnMaster("", "0",
                                            {"--auth-token-file", (dir_ / "cluster.token").string(),
                                             "--admin-token-file", (dir_ / "admin.token").string()},
                                            {});
    ASSERT_TRUE(master.ok()) << master.status();
    address_ = master->address;
    http_ = "127.0.0.1:" + std::to_string(master->http_port);
    master_ = std::move(master->process);

    client_ = ClientWithSegment(address_, "ctl-test-segment");
    ASSERT_NE(client_, nullptr);
    for (int i = 0; i < 5; ++i) {
      const std::string key = "model/a/" + std::to_string(i);
      ASSERT_TRUE(Put(key, Value(i)).ok());
    }
    ASSERT_TRUE(Put("other/x", "kept").ok());
  }
  void TearDown() override {
    client_.reset();
    master_.Stop(seconds(5));
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  Status Put(const std::string& key, const std::string& value) {
    return client_->Put(key, std::as_bytes(std::span(value.data(), value.size())));
  }
  static std::string Value(int i) {
    std::string value(1000 + 100 * i, '\0');
    for (size_t j = 0; j < value.size(); ++j) value[j] = static_cast<char>((j * 7 + i) & 0xff);
    return value;
  }

  // larder-ctl with the addresses and `args` (shell-quoted), stdin from /dev/null.
  // `http` replaces the master's HTTP address.
  Ctl Run(const std::vector<std::string>& args, bool with_tokens = true,
          const std::string& http = "") const {
    std::string command = Quote(Bin("larder-ctl")) + " --master " + address_ + " --http " +
                          (http.empty() ? http_ : http);
    if (with_tokens) {
      command += " --auth-token-file " + Quote((dir_ / "cluster.token").string()) +
                 " --admin-token-file " + Quote((dir_ / "admin.token").string());
    }
    for (const std::string& arg : args) command += " " + Quote(arg);
    command += " </dev/null 2>" + Quote((dir_ / "stderr").string());
    Ctl ctl = RunShell(command);
    ctl.err = ReadFile(dir_ / "stderr");
    return ctl;
  }
  static json Json(const Ctl& ctl) {
    json parsed = json::parse(ctl.out, nullptr, false);
    EXPECT_FALSE(parsed.is_discarded()) << ctl.out << ctl.err;
    return parsed;
  }

  fs::path dir_;
  ChildProcess master_;
  std::string address_, http_;
  std::unique_ptr<StoreClient> client_;
};

TEST_F(CtlTest, StatusNeedsNoAdminTokenAndSaysWhatTheMasterHolds) {
  Ctl json_status = Run({"--json", "status"}, /*with_tokens=*/false);
  ASSERT_EQ(json_status.exit_code, 0) << json_status.err;
  json s = Json(json_status);
  EXPECT_EQ(s["objects"], 6);
  EXPECT_EQ(s["segments"], 1);
  EXPECT_EQ(s["clients"], 1);
  EXPECT_EQ(s["version"], Version());
  EXPECT_EQ(s["bytes_capacity"], 16 << 20);

  // Global flags go anywhere on the line, as kubectl and etcdctl users type them.
  Ctl after = Run({"status", "--json"}, /*with_tokens=*/false);
  ASSERT_EQ(after.exit_code, 0) << after.err;
  EXPECT_EQ(Json(after)["objects"], 6);

  Ctl table = Run({"status"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("objects         6\n"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("of 16.0 MiB"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("version " + std::string(Version())), std::string::npos) << table.out;
}

TEST_F(CtlTest, SegmentsAndClientsNeedTheAdminToken) {
  for (const char* command : {"segments", "clients", "keys"}) {
    Ctl without = Run({command}, /*with_tokens=*/false);
    EXPECT_EQ(without.exit_code, 1) << command;
    EXPECT_NE(without.err.find("needs the admin token"), std::string::npos) << without.err;
    Ctl wrong = Run({"--admin-token-file", (dir_ / "wrong.token").string(), command}, false);
    EXPECT_EQ(wrong.exit_code, 1) << command;
    EXPECT_NE(wrong.err.find("refused the admin token"), std::string::npos) << wrong.err;
  }
  Ctl segments = Run({"--json", "segments"});
  ASSERT_EQ(segments.exit_code, 0) << segments.err;
  json list = Json(segments);
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0]["name"], "ctl-test-segment");
  EXPECT_EQ(list[0]["owner"], client_->client_id());
  EXPECT_EQ(list[0]["objects"], 6);
  EXPECT_EQ(list[0]["size"], 16 << 20);

  Ctl table = Run({"segments"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_EQ(table.out.rfind("SEGMENT", 0), 0u) << table.out;
  EXPECT_NE(table.out.find("ctl-test-segment"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("16.0 MiB"), std::string::npos) << table.out;

  Ctl clients = Run({"--json", "clients"});
  ASSERT_EQ(clients.exit_code, 0) << clients.err;
  json c = Json(clients);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0]["client_id"], client_->client_id());
  EXPECT_EQ(c[0]["pid"], getpid());
  EXPECT_EQ(c[0]["segments"], 1);
  EXPECT_EQ(c[0]["alive"], true);
  Ctl client_table = Run({"clients"});
  ASSERT_EQ(client_table.exit_code, 0) << client_table.err;
  EXPECT_EQ(client_table.out.rfind("CLIENT", 0), 0u) << client_table.out;
  EXPECT_NE(client_table.out.find("ALIVE"), std::string::npos) << client_table.out;
  EXPECT_NE(client_table.out.find(" yes "), std::string::npos) << client_table.out;
}

TEST_F(CtlTest, KeysAndGetReadWhatWasPut) {
  Ctl keys = Run({"--json", "keys", "--prefix", "model/"});
  ASSERT_EQ(keys.exit_code, 0) << keys.err;
  json list = Json(keys);
  ASSERT_EQ(list.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(list[i]["key"], "model/a/" + std::to_string(i));
    EXPECT_EQ(list[i]["size"], Value(i).size());
  }
  Ctl limited = Run({"keys", "--prefix", "model/", "--limit", "2"});
  ASSERT_EQ(limited.exit_code, 0) << limited.err;
  EXPECT_NE(limited.out.find("model/a/1"), std::string::npos) << limited.out;
  EXPECT_EQ(limited.out.find("model/a/2"), std::string::npos) << limited.out;
  EXPECT_NE(limited.err.find("--limit"), std::string::npos) << limited.err;

  const fs::path file = dir_ / "value.bin";
  Ctl get = Run({"get", "model/a/3", "-o", file.string()});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  EXPECT_EQ(ReadFile(file), Value(3));
  // To stdout, as `larder-ctl get KEY > file` does.
  Ctl to_stdout = Run({"get", "model/a/4"});
  ASSERT_EQ(to_stdout.exit_code, 0) << to_stdout.err;
  EXPECT_EQ(to_stdout.out, Value(4));

  Ctl absent = Run({"get", "model/absent", "-o", (dir_ / "absent.bin").string()});
  EXPECT_EQ(absent.exit_code, 1);
  EXPECT_NE(absent.err.find("model/absent"), std::string::npos) << absent.err;
  EXPECT_NE(absent.err.find("NotFound"), std::string::npos) << absent.err;
  // Without the cluster token the master refuses the reader.
  Ctl untrusted = Run({"--admin-token-file", (dir_ / "admin.token").string(), "--timeout", "3s",
                       "get", "model/a/3", "-o", file.string()},
                      /*with_tokens=*/false);
  EXPECT_EQ(untrusted.exit_code, 1) << untrusted.err;
}

TEST_F(CtlTest, RemoveByPrefixAsksFirst) {
  // stdin is not a terminal: no confirmation, nothing removed.
  Ctl unconfirmed = Run({"remove", "--prefix", "model/"});
  EXPECT_EQ(unconfirmed.exit_code, 1);
  EXPECT_NE(unconfirmed.err.find("5 keys start with 'model/'"), std::string::npos)
      << unconfirmed.err;
  EXPECT_NE(unconfirmed.err.find("--yes"), std::string::npos) << unconfirmed.err;
  auto exists = client_->Exist("model/a/0");
  ASSERT_TRUE(exists.ok()) << exists.status();
  EXPECT_TRUE(*exists);

  Ctl empty = Run({"remove", "--prefix", "", "--yes"});
  EXPECT_EQ(empty.exit_code, 1);
  EXPECT_NE(empty.err.find("non-empty --prefix"), std::string::npos) << empty.err;

  Ctl removed = Run({"--json", "remove", "--prefix", "model/", "--yes"});
  ASSERT_EQ(removed.exit_code, 0) << removed.err;
  json reply = Json(removed);
  EXPECT_EQ(reply["removed"], 5);
  EXPECT_EQ(reply["skipped_leased"], 0);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(client_->Get("model/a/" + std::to_string(i)).status().code(), StatusCode::kNotFound);
  }
  auto kept = client_->Get("other/x");
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(*kept, "kept");

  Ctl again = Run({"remove", "--prefix", "model/"});
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.err.find("no key starts with 'model/'"), std::string::npos) << again.err;
}

// A second process's worth of memory: the segment a drain moves objects into.
std::unique_ptr<StoreClient> SecondClient(const std::string& master) {
  return ClientWithSegment(master, "ctl-test-segment-2");
}

// The segment each key's first replica is on.
std::string SegmentOf(StoreClient& client, const std::string& key) {
  const std::string keys[] = {key};
  auto info = std::move(client.BatchGetObjectInfo(keys).at(0));
  if (!info.ok()) return "<" + info.status().ToString() + ">";
  if (info->replicas.empty()) return "<no replica>";
  return info->replicas[0].segment_name;
}

TEST_F(CtlTest, DrainMovesEveryObjectThatFitsAndTheSegmentTakesNoMore) {
  auto second = SecondClient(address_);
  ASSERT_NE(second, nullptr);
  ASSERT_EQ(SegmentOf(*client_, "model/a/0"), "ctl-test-segment");

  // Not confirmed (stdin is no terminal): nothing happens.
  Ctl unconfirmed = Run({"drain", "ctl-test-segment"});
  EXPECT_EQ(unconfirmed.exit_code, 1);
  EXPECT_NE(unconfirmed.err.find("--yes"), std::string::npos) << unconfirmed.err;
  EXPECT_EQ(SegmentOf(*client_, "model/a/0"), "ctl-test-segment");

  Ctl drained = Run({"--json", "drain", "ctl-test-segment", "--yes"});
  ASSERT_EQ(drained.exit_code, 0) << drained.err << drained.out;
  json reply = Json(drained);
  EXPECT_EQ(reply["listed"], 6);
  EXPECT_EQ(reply["migrated"], 6);
  EXPECT_EQ(reply["dropped"], 0);
  EXPECT_EQ(reply["pool_full"], false);
  for (int i = 0; i < 5; ++i) {
    const std::string key = "model/a/" + std::to_string(i);
    EXPECT_EQ(SegmentOf(*client_, key), "ctl-test-segment-2") << key;
    auto value = client_->Get(key);
    ASSERT_TRUE(value.ok()) << value.status();
    EXPECT_EQ(*value, Value(i));
  }
  // The owner's own puts go elsewhere while it drains.
  ASSERT_TRUE(Put("new/while-draining", "n").ok());
  EXPECT_EQ(SegmentOf(*client_, "new/while-draining"), "ctl-test-segment-2");
  // The moved objects' old ranges come back once the owner's catalog has applied their removal
  // (a catalog sync away): the drained segment empties within a deadline.
  json list;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  do {
    Ctl segments = Run({"--json", "segments"});
    ASSERT_EQ(segments.exit_code, 0) << segments.err;
    list = Json(segments);
    ASSERT_EQ(list.size(), 2u);
  } while (list[0]["objects"] != 0 && std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(list[0]["draining"], true);
  EXPECT_EQ(list[0]["objects"], 0);
  EXPECT_EQ(list[0]["used"], 0);
  EXPECT_EQ(list[1]["draining"], false);

  Ctl undo = Run({"drain", "ctl-test-segment", "--undo"});
  ASSERT_EQ(undo.exit_code, 0) << undo.err;
  ASSERT_TRUE(Put("new/after-drain", "n").ok());
  EXPECT_EQ(SegmentOf(*client_, "new/after-drain"), "ctl-test-segment");

  Ctl unknown = Run({"drain", "no-such-segment", "--yes"});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.err.find("no segment named"), std::string::npos) << unknown.err;
}

TEST_F(CtlTest, DrainWithABudgetMovesTheMostUsedAndDropsTheRest) {
  auto second = SecondClient(address_);
  ASSERT_NE(second, nullptr);
  // Used last: model/a/1, then model/a/3 (1100 and 1300 bytes); other/x was put after the rest.
  ASSERT_TRUE(client_->Get("model/a/3").ok());
  ASSERT_TRUE(client_->Get("model/a/1").ok());

  Ctl drained = Run({"--json", "drain", "ctl-test-segment", "--yes", "--migrate-bytes", "3000"});
  ASSERT_EQ(drained.exit_code, 0) << drained.err << drained.out;
  json reply = Json(drained);
  EXPECT_EQ(reply["migrated"], 3);
  EXPECT_EQ(reply["migrated_bytes"], 1100 + 1300 + 4);
  EXPECT_EQ(reply["not_moved"], 3);
  EXPECT_EQ(reply["dropped"], 3);
  for (const char* kept : {"model/a/1", "model/a/3", "other/x"}) {
    EXPECT_EQ(SegmentOf(*client_, kept), "ctl-test-segment-2") << kept;
  }
  for (const char* dropped : {"model/a/0", "model/a/2", "model/a/4"}) {
    EXPECT_EQ(client_->Get(dropped).status().code(), StatusCode::kNotFound) << dropped;
  }
  auto value = second->Get("model/a/3");
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, Value(3));
}

// A drain of a big segment takes a while: it says at once what it is about to move (on stderr;
// stdout keeps the result).
TEST_F(CtlTest, DrainSaysWhatItWillMoveBeforeItMoves) {
  auto second = SecondClient(address_);
  ASSERT_NE(second, nullptr);
  Ctl drained = Run({"drain", "ctl-test-segment", "--keep"});
  ASSERT_EQ(drained.exit_code, 0) << drained.err << drained.out;
  EXPECT_NE(drained.err.find("segment ctl-test-segment holds 6 objects"), std::string::npos)
      << drained.err;
  EXPECT_EQ(drained.out.find("holds"), std::string::npos) << drained.out;
  EXPECT_NE(drained.out.find("moved 6 objects"), std::string::npos) << drained.out;
  Ctl quiet = Run({"--json", "drain", "ctl-test-segment", "--undo"});
  ASSERT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_EQ(quiet.err.find("holds"), std::string::npos) << quiet.err;
}

// `larder-bench store` against a master of the user's says so, puts into a tenant of its own and
// removes its objects at the end: the master holds what it held before.
TEST_F(CtlTest, StoreBenchOnALiveMasterLeavesNothingBehind) {
  const std::string command = std::string("LARDER_AUTH_TOKEN=") + kClusterToken +
                              " LARDER_ADMIN_TOKEN=" + kAdminToken + " " +
                              Quote(Bin("larder-bench")) + " store --master " + address_ +
                              " --op put --value-size 64K --duration 0.5 --segment-size 32M"
                              " </dev/null 2>&1";
  Ctl bench = RunShell(command);
  const std::string& out = bench.out;
  EXPECT_EQ(bench.exit_code, 0) << out;
  EXPECT_NE(out.find("as tenant 'larder-bench-"), std::string::npos) << out;
  EXPECT_NE(out.find("can evict other clients' objects"), std::string::npos) << out;
  EXPECT_NE(out.find("removed the bench's"), std::string::npos) << out;
  Ctl after = Run({"--json", "status"}, /*with_tokens=*/false);
  ASSERT_EQ(after.exit_code, 0) << after.err;
  EXPECT_LE(Json(after)["objects"].get<int>(), 6) << "the bench left objects behind";
}

// `larder-bench store --protocol` takes every protocol the build has: the device route (the
// emulated device here) with each worker bound to a device as a serving process binds its thread.
TEST(StoreBenchTest, RunsOverTheDeviceRoute) {
  Ctl bench = RunShell(Quote(Bin("larder-bench")) +
                       " store --protocol device --op put,get --value-size 64K --duration 0.5"
                       " --json </dev/null 2>/dev/null");
  ASSERT_EQ(bench.exit_code, 0) << bench.out;
  std::istringstream lines(bench.out);
  int runs = 0;
  for (std::string line; std::getline(lines, line);) {
    json run = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!run.is_object() || run.value("bench", "") != "store") continue;
    ++runs;
    EXPECT_EQ(run["protocol"], "device") << line;
    EXPECT_EQ(run["errors"], 0) << line;
    if (run["op"] == "get") EXPECT_GT(run["verified"].get<uint64_t>(), 0u) << line;
  }
  EXPECT_EQ(runs, 2) << bench.out;
  Ctl unknown = RunShell(Quote(Bin("larder-bench")) + " store --protocol nvlink </dev/null 2>&1");
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.out.find("this build has: auto"), std::string::npos) << unknown.out;
}

TEST_F(CtlTest, VersionAndHelp) {
  Ctl version = Run({"--version"}, false);
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_EQ(version.out, "larder-ctl " + std::string(Version()) + "\n");
  Ctl help = Run({"--help"}, false);
  EXPECT_EQ(help.exit_code, 0);
  for (const char* command : {"status", "segments", "clients", "keys", "get", "remove", "drain"}) {
    EXPECT_NE(help.out.find(command), std::string::npos) << command;
  }
  Ctl unreachable = Run({"status"}, false, "127.0.0.1:1");
  EXPECT_EQ(unreachable.exit_code, 1);
  EXPECT_NE(unreachable.err.find("cannot reach larder-master's HTTP port"), std::string::npos)
      << unreachable.err;
}

// The services refuse a log level they do not know rather than ignore it.
TEST(ServiceFlagsTest, AnUnknownLogLevelIsRefused) {
  for (const char* tool : {"larder-master", "larder-client"}) {
    Ctl run = RunShell(Quote(Bin(tool)) + " --log-level verbose </dev/null 2>&1");
    const std::string& out = run.out;
    EXPECT_GT(run.exit_code, 0) << tool << ": " << out;
    EXPECT_NE(out.find("--log-level"), std::string::npos) << tool << ": " << out;
    EXPECT_NE(out.find("verbose"), std::string::npos) << tool << ": " << out;
  }
}

}  // namespace
}  // namespace larder
