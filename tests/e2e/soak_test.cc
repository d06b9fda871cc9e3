// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// `larder-bench soak` for 75 seconds: a master and four store clients under mixed load, with
// every fault of the schedule injected (a client killed and restarted, the master killed and
// restarted on its port, the master paused past the clients' TTL, a client stalled): one every
// 12 s after 15 s of warm-up, so each kind once, the first kind again, and the last one's grace.
// No value may come back wrong, and no error may happen outside a fault and its grace period.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "testing/binaries.h"

namespace larder {
namespace {

using json = nlohmann::json;

using larder::test::Bin;

TEST(SoakTest, FaultsOfEveryKindLeaveNoWrongBytesAndNoUnexpectedErrors) {
  const std::string log_path = ::testing::TempDir() + "/soak.log";
  const std::string command =
      Bin("larder-bench") + " soak --duration 75 --warmup 15 --fault-every 12 --json 2>" + log_path;
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr) << command;
  std::string out;
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof(chunk), pipe)) > 0) out.append(chunk, n);
  const int status = pclose(pipe);
  std::ifstream err(log_path);
  const std::string log((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << command << " exited with " << status << "; stderr:\n"
      << log;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  const json s = json::parse(out.substr(out.rfind('\n') + 1), nullptr, false);
  ASSERT_TRUE(s.is_object()) << "stdout: " << out << "\nstderr:\n" << log;

  EXPECT_GE(s["duration_s"].get<double>(), 75.0);
  EXPECT_EQ(s["wrong_bytes"].get<uint64_t>(), 0u) << s["first_unexpected"].dump();
  EXPECT_EQ(s["wrong_keys"].get<uint64_t>(), 0u);
  EXPECT_EQ(s["unexpected_errors"].get<uint64_t>(), 0u) << s["errors_by_class"].dump() << "\n"
                                                        << s["first_unexpected"].dump();
  EXPECT_TRUE(s["unexpected_exits"].empty()) << s["unexpected_exits"].dump();
  EXPECT_TRUE(s["expected_errors"].is_number());
  // Every kind of fault happened, and the store worked through them.
  EXPECT_GE(s["faults_injected"].get<uint64_t>(), 4u) << s["faults"].dump();
  for (const char* kind : {"client_kill", "master_restart", "master_pause", "peer_stall"}) {
    EXPECT_GE(s["faults_by_kind"].value(kind, 0), 1) << kind << ": " << s["faults"].dump();
  }
  EXPECT_GT(s["puts"].get<uint64_t>(), 0u);
  EXPECT_GT(s["gets"].get<uint64_t>(), 0u);
  EXPECT_GT(s["removes"].get<uint64_t>(), 0u);
  // Figures for every process; a process that ran past its warm-up leaks no fds.
  for (const char* process : {"master", "client-0", "client-1", "client-2", "client-3"}) {
    ASSERT_TRUE(s["rss_growth_bytes"].contains(process)) << s["rss_growth_bytes"].dump();
    ASSERT_TRUE(s["fd_growth"].contains(process)) << s["fd_growth"].dump();
    const json& fds = s["fd_growth"][process];
    if (fds.is_number()) {
      EXPECT_LE(fds.get<int64_t>(), 32) << process;
    }
    EXPECT_FALSE(s["processes"][process]["series"].empty()) << process;
  }
}

}  // namespace
}  // namespace larder
