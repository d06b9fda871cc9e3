// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// `larder-bench tier` end to end (from LARDER_BIN_DIR) with tiny sizes on a directory under /tmp:
// every value read back intact, every figure present and positive, nothing left behind. No
// assertion depends on time.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "testing/binaries.h"

namespace {

using json = nlohmann::json;
using larder::test::Bin;
namespace fs = std::filesystem;

class TierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/larder-tier-test-XXXXXX";
    ASSERT_NE(mkdtemp(name), nullptr);
    dir_ = name;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // Runs `larder-bench tier --disk-path <dir_> <args>`; returns its stdout and exit code.
  std::string RunTier(const std::string& args, int* exit_code) {
    std::string command = Bin("larder-bench") + " tier --disk-path " + dir_ + " " + args;
    std::string out;
    FILE* pipe = popen(command.c_str(), "r");
    if (pipe == nullptr) {
      ADD_FAILURE() << "cannot run " << command;
      return out;
    }
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), pipe)) > 0) out.append(chunk, n);
    int status = pclose(pipe);
    *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::printf("%s", out.c_str());  // the result, for the log
    return out;
  }

  std::string dir_;
};

TEST_F(TierTest, EveryValueComesBackAndEveryFigureIsThere) {
  int exit_code = -1;
  std::string out = RunTier("--bytes 16M --value-sizes 64K,1M --repeat 1", &exit_code);
  ASSERT_EQ(exit_code, 0);
  json result = json::parse(out, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(result.is_object()) << out;
  EXPECT_EQ(result["wrong_values"].get<uint64_t>(), 0u);
  EXPECT_FALSE(result["fs_type"].get<std::string>().empty());
  ASSERT_TRUE(result["rows"].is_array());
  ASSERT_EQ(result["rows"].size(), 2u);
  const uint64_t sizes[] = {64u << 10, 1u << 20};
  for (size_t i = 0; i < 2; ++i) {
    const json& row = result["rows"][i];
    SCOPED_TRACE(row.dump());
    EXPECT_EQ(row["value_size"].get<uint64_t>(), sizes[i]);
    EXPECT_GT(row["values"].get<uint64_t>(), 0u);
    EXPECT_EQ(row["values"].get<uint64_t>(), (16u << 20) / sizes[i]);
    EXPECT_EQ(row["wrong_values"].get<uint64_t>(), 0u);
    for (const char* field :
         {"write_gbps", "raw_write_gbps", "read_gbps", "raw_read_gbps", "read_vs_raw"}) {
      EXPECT_GT(row[field].get<double>(), 0) << field;
    }
    EXPECT_EQ(row["read_gbps_runs"].size(), 1u);
    EXPECT_EQ(row["raw_read_gbps_runs"].size(), 1u);
    EXPECT_TRUE(row["direct_io"].is_boolean());
    EXPECT_TRUE(row["io_uring"].is_boolean());
  }
  // The bench's own subdirectory is gone.
  EXPECT_TRUE(fs::is_empty(dir_)) << dir_;
}

TEST_F(TierTest, ValuesLargerThanBytesAreRefused) {
  int exit_code = -1;
  std::string out = RunTier("--bytes 64K --value-sizes 1M --repeat 1", &exit_code);
  EXPECT_EQ(exit_code, 1);
  EXPECT_TRUE(out.empty()) << out;
  EXPECT_TRUE(fs::is_empty(dir_)) << dir_;
}

}  // namespace
