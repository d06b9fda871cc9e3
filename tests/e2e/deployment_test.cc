// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// `larder-bench deployment` end to end: the RFC topology (two prefills sharing a store on host A,
// a decode pulling PD KV pages from them on host B) in real processes. Host B is a network
// namespace when this test runs as root with iproute2, else this namespace under another
// LARDER_HOST_ID; the bench decides, and the test checks which it chose. With --memory device the
// KV is device memory of each process (the emulated backend on a machine without a device).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/child_process.h"
#include "testing/binaries.h"
#include "testing/netns.h"
#include "transfer/device/device_transport.h"

namespace larder {
namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

using larder::test::Bin;

// Removes what a bench with this pid may have left (a killed bench cannot tear down), even when
// an assertion ends the test early.
class NamespaceCleanup {
 public:
  explicit NamespaceCleanup(pid_t pid) : pid_(pid) {}
  ~NamespaceCleanup() {
    if (pid_ > 0 && larder::test::NetnsUsable().ok()) larder::test::RemoveNamespacesOfPid(pid_);
  }

 private:
  pid_t pid_;
};

struct BenchRun {
  std::vector<json> summaries;  // JSON lines with "store_protocol"
  int exit_status = -1;
  bool netns_left = false;  // a namespace of the bench's pid still existed after it exited
};

// Every thread's stack of `pid` and its children (gdb, where installed): what a test that gives up
// on a hung process prints, so that the hang can be told apart from a slow machine.
std::string StacksOf(pid_t pid) {
  if (access("/usr/bin/gdb", X_OK) != 0) return "(no /usr/bin/gdb: no stacks)";
  const std::string command = "for p in " + std::to_string(pid) + " $(pgrep -P " +
                              std::to_string(pid) +
                              "); do echo \"== pid $p: $(tr '\\0' ' ' < /proc/$p/cmdline)\"; "
                              "timeout 60 /usr/bin/gdb -p $p -batch -ex 'thread apply all bt' "
                              "2>&1 | grep -E '^(Thread|#)'; done";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "(cannot run gdb)";
  std::string out;
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof(chunk), pipe)) > 0) out.append(chunk, n);
  pclose(pipe);
  return out;
}

// Runs `larder-bench deployment <flags> --json` to completion (bounded by a deadline).
BenchRun RunDeployment(std::vector<std::string> flags) {
  // The shell announces readiness for ChildProcess::Spawn, then becomes the bench (same pid, so
  // the bench's namespace is "larder-dep-<that pid>").
  std::vector<std::string> argv = {
      "/bin/sh",           "-c",         "echo READY bench; exec \"$0\" \"$@\"",
      Bin("larder-bench"), "deployment", "--json"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  BenchRun run;
  auto child = ChildProcess::Spawn(argv, {}, seconds(30));
  EXPECT_TRUE(child.ok()) << child.status();
  if (!child.ok()) return run;
  NamespaceCleanup cleanup(child->pid());
  auto deadline = std::chrono::steady_clock::now() + seconds(180);
  for (;;) {
    auto left =
        std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      ADD_FAILURE() << "larder-bench deployment did not finish in time; its threads:\n"
                    << StacksOf(child->pid());
      break;
    }
    auto line = child->ReadLine(left);
    if (!line.ok()) {
      EXPECT_EQ(line.status().code(), StatusCode::kUnavailable) << line.status();
      break;  // exited
    }
    json parsed = json::parse(*line, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object() && parsed.contains("store_protocol")) run.summaries.push_back(parsed);
  }
  pid_t pid = child->pid();
  run.exit_status = child->Stop(seconds(10));
  if (larder::test::NetnsUsable().ok()) {
    // The bench removes its namespace on exit; look for one named after it.
    std::string ip = larder::test::IpProgram();
    auto listed = ChildProcess::Spawn(
        {"/bin/sh", "-c", "echo READY ns; exec \"$0\" netns list", ip}, {}, seconds(10));
    if (listed.ok()) {
      std::string prefix = "larder-dep-" + std::to_string(pid);
      for (;;) {
        auto line = listed->ReadLine(seconds(10));
        if (!line.ok()) break;
        std::string name = line->substr(0, line->find(' '));
        if (name == prefix || name.rfind(prefix + "-", 0) == 0) run.netns_left = true;
      }
    }
  }
  return run;
}

uint64_t U64(const json& object, const std::string& field) {
  return object.contains(field) ? object[field].get<uint64_t>() : 0;
}

// What every run must show, faults or not. `pd_route`: the route of the decode's pulls.
void ExpectTopology(const json& s, const std::string& pd_route = "tcp") {
  EXPECT_EQ(s["netns"].get<bool>(), larder::test::NetnsUsable().ok()) << s.dump();
  // The decode is another host: its PD transfers use the network, never shm.
  for (const auto& [route, n] : s["pd_routes"].items()) EXPECT_EQ(route, pd_route) << s.dump();
  EXPECT_GT(U64(s, "pd_transfers"), 0u);
  EXPECT_GT(U64(s, "pd_idle_transfers"), 0u);
  EXPECT_GT(U64(s, "store_ops"), 0u);
  EXPECT_GT(U64(s, "read_bytes"), 0u);
  EXPECT_EQ(U64(s, "verified_bytes"), U64(s, "read_bytes")) << "bytes read but not verified";
  // The decode paces its pulls at --pd-rate (default 200/s): never faster than the schedule.
  double rate = s["pd_rate"].get<double>();
  EXPECT_EQ(rate, 200.0);
  EXPECT_LE(s["pd_transfers_per_s"].get<double>(), rate * 1.05) << s.dump();
  for (const char* phase : {"pd_", "pd_idle_"}) {
    std::string p = phase;
    double p50 = s[p + "p50_ms"], p99 = s[p + "p99_ms"], p999 = s[p + "p999_ms"];
    double max = s[p + "max_ms"];
    EXPECT_GT(p50, 0.0) << p;
    EXPECT_LE(p50, p99) << p;
    EXPECT_LE(p99, p999) << p;
    EXPECT_LE(p999, max) << p;
  }
  EXPECT_DOUBLE_EQ(s["pd_p99_loaded_vs_idle"].get<double>(),
                   s["pd_p99_ms"].get<double>() / s["pd_idle_p99_ms"].get<double>());
}

// The healthy run under store protocol auto: nothing fails, same-host store traffic is shm.
void ExpectHealthyAuto(const json& s) {
  ExpectTopology(s);
  EXPECT_EQ(s["store_protocol"], "auto");
  EXPECT_EQ(U64(s, "failures"), 0u)
      << s["failures_by_kind"].dump() << " " << s["first_errors"].dump();
  EXPECT_TRUE(s["failures_by_kind"].empty()) << s["failures_by_kind"].dump();
  EXPECT_EQ(U64(s, "pd_failures"), 0u);
  EXPECT_EQ(U64(s, "same_host_tcp_bytes"), 0u) << "store traffic between the prefills hairpinned";
  EXPECT_EQ(U64(s["bytes_by_route"], "tcp"), 0u) << s["bytes_by_route"].dump();
  EXPECT_GT(U64(s["bytes_by_route"], "shm"), 0u) << s["bytes_by_route"].dump();
  EXPECT_GT(U64(s, "store_gets"), 0u);
  EXPECT_GT(U64(s, "store_verified_bytes"), 0u);
  EXPECT_GT(U64(s, "pd_verified_bytes"), 0u);
  EXPECT_TRUE(s["unexpected_exits"].empty()) << s["unexpected_exits"].dump();
}

TEST(DeploymentTest, AutoStoreProtocolKeepsSameHostTrafficOffTcp) {
  BenchRun run = RunDeployment({"--store-protocol", "auto", "--duration", "3", "--idle-baseline",
                                "1", "--segment-size", "256M"});
  EXPECT_EQ(run.exit_status, 0);
  EXPECT_FALSE(run.netns_left) << "the bench left its network namespace behind";
  ASSERT_EQ(run.summaries.size(), 1u);
  ExpectHealthyAuto(run.summaries[0]);
}

TEST(DeploymentTest, SparseHugeSegmentsWork) {
  // 700 GB per prefill, as in the RFC: sparse memfd segments cost only the pages written.
  BenchRun run = RunDeployment({"--store-protocol", "auto", "--duration", "2", "--idle-baseline",
                                "1", "--segment-size", "700G"});
  EXPECT_EQ(run.exit_status, 0);
  ASSERT_EQ(run.summaries.size(), 1u);
  EXPECT_EQ(U64(run.summaries[0], "segment_size"), 700ull << 30);
  ExpectHealthyAuto(run.summaries[0]);
}

TEST(DeploymentTest, KilledPrefillFailsOnlyItsPdRequestsFastWithUnavailable) {
  BenchRun run = RunDeployment({"--store-protocol", "auto", "--duration", "3", "--idle-baseline",
                                "1", "--segment-size", "256M", "--kill-prefill-after", "1",
                                "--pd-timeout-ms", "5000"});
  EXPECT_EQ(run.exit_status, 0) << "the run must still finish with a summary";
  EXPECT_FALSE(run.netns_left);
  ASSERT_EQ(run.summaries.size(), 1u);
  const json& s = run.summaries[0];
  ExpectTopology(s);
  const json& dead = s["pd_by_prefill"]["prefill-1"];
  const json& alive = s["pd_by_prefill"]["prefill-2"];
  EXPECT_GT(U64(dead, "failures"), 0u) << s.dump();
  // Fail fast: every failure is Unavailable (none waited for the 5 s deadline).
  for (const auto& [code, n] : dead["codes"].items()) EXPECT_EQ(code, "Unavailable") << s.dump();
  EXPECT_LT(dead["fail_max_ms"].get<double>(), 5000.0);
  std::string error = dead["first_error"].get<std::string>();
  EXPECT_NE(error.find("Unavailable"), std::string::npos) << error;
  EXPECT_NE(error.find("prefill-1"), std::string::npos) << error;
  EXPECT_EQ(U64(alive, "failures"), 0u) << alive.dump();
  EXPECT_GT(U64(alive, "transfers"), 0u);
  // The summary counts them as failures; every PD failure kind is prefill-1's Unavailable. The
  // kinds count every phase, pd_by_prefill the loaded one only: a request that fails while the
  // run stops is in the first and not in the second.
  const json& kinds = s["failures_by_kind"];
  EXPECT_GE(U64(kinds, "pd.prefill-1.Unavailable"), U64(dead, "failures"));
  EXPECT_EQ(U64(kinds, "prefill_died.prefill-1"), 1u);
  for (const auto& [kind, n] : kinds.items()) {
    if (kind.rfind("pd.", 0) == 0) {
      EXPECT_EQ(kind, "pd.prefill-1.Unavailable");
    }
  }
  EXPECT_GE(U64(s, "failures"), U64(dead, "failures") + 1);
  EXPECT_FALSE(s["faults_injected"].empty());
  EXPECT_TRUE(s["unexpected_exits"].empty()) << s["unexpected_exits"].dump();
  // The other prefill's store carries on: at most the batches in flight at the kill fail (its
  // puts then leave the dead segment out until the master expires it), and it keeps working.
  uint64_t survivor_put_failures = kinds.contains("store.prefill-2.put.Unavailable")
                                       ? U64(kinds, "store.prefill-2.put.Unavailable")
                                       : 0;
  EXPECT_LE(survivor_put_failures, 2u * 16) << s.dump();
  EXPECT_GT(U64(s, "store_ops_after_fault"), 0u) << "the surviving prefill's store stopped";
}

TEST(DeploymentTest, KilledDecodeIsReportedAndPrefillsCarryOn) {
  BenchRun run = RunDeployment({"--store-protocol", "auto", "--duration", "3", "--idle-baseline",
                                "1", "--segment-size", "256M", "--kill-decode-after", "1"});
  EXPECT_EQ(run.exit_status, 0);
  ASSERT_EQ(run.summaries.size(), 1u);
  const json& s = run.summaries[0];
  EXPECT_EQ(s["failures_by_kind"], json({{"decode_died", 1}})) << s.dump();
  EXPECT_EQ(U64(s, "failures"), 1u);
  // The prefills finished cleanly and kept serving the store.
  for (const char* name : {"prefill-1", "prefill-2"}) {
    EXPECT_TRUE(s["prefills"][name]["final"].get<bool>()) << name;
    EXPECT_GT(U64(s["prefills"][name], "puts"), 0u) << name;
  }
  EXPECT_GT(U64(s, "store_gets"), 0u);
  EXPECT_GT(U64(s, "store_ops_after_fault"), 0u) << "the store stopped with the decode";
  EXPECT_EQ(U64(s, "verified_bytes"), U64(s, "read_bytes"));
}

// --memory device: the prefills' PD and store segments and the decode's KV buffers in device
// memory. The decode's pulls cross hosts through pinned staging on both ends ("tcp-staged"), the
// prefills' store traffic takes the device route, and every byte read is still verified (through
// host copies).
TEST(DeploymentTest, DeviceMemoryPullsGoTcpStagedWithoutFailures) {
  // The bench's processes bind device 0 of the build's device backend, as this probe does.
  std::shared_ptr<transfer::DeviceBackend> device = transfer::DefaultDeviceBackend();
  if (Status bound = device->SetCurrentDevice(0); !bound.ok()) {
    GTEST_SKIP() << "no device 0 here: " << bound;
  }
  device->SetCurrentDevice(-1).IgnoreError();

  BenchRun run = RunDeployment(
      {"--memory", "device", "--duration", "3", "--idle-baseline", "1", "--segment-size", "256M"});
  EXPECT_EQ(run.exit_status, 0) << "the run must finish with a summary";
  EXPECT_FALSE(run.netns_left) << "the bench left its network namespace behind";
  // Device memory's default is the one store protocol auto (the device route carries the
  // prefills' store traffic under tcp too).
  ASSERT_EQ(run.summaries.size(), 1u);
  const json& s = run.summaries[0];
  ExpectTopology(s, "tcp-staged");
  EXPECT_EQ(s["memory"], "device");
  EXPECT_EQ(s["store_protocol"], "auto");
  EXPECT_EQ(s["store_engine_protocol"], "device,auto");
  EXPECT_NE(s["pd_protocol"].get<std::string>().find("device"), std::string::npos) << s.dump();
  // Every process's KV is device memory, as the processes themselves report it.
  EXPECT_EQ(s["memory_kinds"]["decode"], "device") << s["memory_kinds"].dump();
  for (const char* name : {"prefill-1", "prefill-2"}) {
    EXPECT_EQ(s["memory_kinds"][name], json({{"pd", "device"}, {"store", "device"}}))
        << s["memory_kinds"].dump();
  }
  // Nothing failed, PD or store.
  EXPECT_EQ(U64(s, "failures"), 0u)
      << s["failures_by_kind"].dump() << " " << s["first_errors"].dump();
  EXPECT_EQ(U64(s, "pd_failures"), 0u);
  EXPECT_EQ(U64(s, "pd_failures_total"), 0u);
  EXPECT_EQ(U64(s, "store_failures"), 0u);
  // The decode's bytes went over tcp-staged, all of them.
  const json& pd_bytes = s["pd_bytes_by_route"];
  EXPECT_EQ(pd_bytes.size(), 1u) << pd_bytes.dump();
  EXPECT_GT(U64(pd_bytes, "tcp-staged"), 0u) << pd_bytes.dump();
  EXPECT_EQ(U64(pd_bytes, "tcp-staged"), U64(s, "pd_bytes")) << s.dump();
  // The prefills' store traffic: the device route between processes of one host, no hairpin.
  EXPECT_GT(U64(s, "store_ops"), 0u);
  EXPECT_GT(U64(s, "store_gets"), 0u);
  EXPECT_GT(U64(s["bytes_by_route"], "device"), 0u) << s["bytes_by_route"].dump();
  EXPECT_EQ(U64(s["bytes_by_route"], "tcp-staged"), 0u) << s["bytes_by_route"].dump();
  EXPECT_EQ(U64(s, "same_host_tcp_bytes"), 0u);
  // Every byte read verified, and the run completed: the processes ended with final reports.
  EXPECT_GT(U64(s, "pd_verified_bytes"), 0u);
  EXPECT_GT(U64(s, "store_verified_bytes"), 0u);
  for (const char* name : {"prefill-1", "prefill-2"}) {
    EXPECT_TRUE(s["prefills"][name]["final"].get<bool>()) << name;
  }
  EXPECT_FALSE(s["interrupted"].get<bool>());
  EXPECT_TRUE(s["unexpected_exits"].empty()) << s["unexpected_exits"].dump();
}

}  // namespace
}  // namespace larder
