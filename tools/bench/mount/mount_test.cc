// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// `larder-bench mount` end to end (from LARDER_BIN_DIR): a peer that opens a 1 TiB segment over
// shm and reads 4 MiB from it costs about what it costs on a 1 GiB segment, and so does the owner
// that mounted it. Memory only: no assertion depends on time.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "testing/binaries.h"

namespace {

using json = nlohmann::json;

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t k1G = 1ull << 30;
constexpr uint64_t k1T = 1ull << 40;

using larder::test::Bin;

// Runs larder-bench with `args`; returns its JSON lines by segment size, and its exit code.
std::map<uint64_t, json> RunMount(const std::string& args, int* exit_code) {
  std::string command = Bin("larder-bench") + " mount --json " + args;
  std::map<uint64_t, json> rows;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "cannot run " << command;
    return rows;
  }
  std::string out;
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof(chunk), pipe)) > 0) out.append(chunk, n);
  int status = pclose(pipe);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::printf("%s", out.c_str());  // the rows, for the log
  size_t start = 0;
  while (start < out.size()) {
    size_t end = out.find('\n', start);
    if (end == std::string::npos) end = out.size();
    json row = json::parse(out.substr(start, end - start), nullptr, /*allow_exceptions=*/false);
    if (row.is_object() && row.contains("segment_bytes")) {
      rows[row["segment_bytes"].get<uint64_t>()] = row;
    }
    start = end + 1;
  }
  return rows;
}

TEST(MountTest, PeerOfATebibyteSegmentPaysOnlyForWhatItReads) {
  int exit_code = -1;
  auto rows = RunMount("--sizes 1G,1T --repeat 1", &exit_code);
  ASSERT_EQ(exit_code, 0);
  ASSERT_TRUE(rows.count(k1G)) << "no 1G row";
  ASSERT_TRUE(rows.count(k1T)) << "no 1T row";
  for (const auto& [size, row] : rows) {
    SCOPED_TRACE("segment " + std::to_string(size));
    ASSERT_FALSE(row.contains("error")) << row.dump();
    ASSERT_FALSE(row.contains("skipped")) << row.dump();
    EXPECT_EQ(row["route"], "shm");
    EXPECT_TRUE(row["verified"].get<bool>());
    EXPECT_EQ(row["page_size"].get<uint64_t>(), 4096u);
    // The whole segment is mapped in the reader...
    EXPECT_GE(row["reader_vm_size_bytes"].get<uint64_t>(), size);
    // ...but its page tables cover only what was copied.
    EXPECT_LT(row["reader_pte_bytes"].get<uint64_t>(), 16 * kMiB);
  }
  const json& small = rows[k1G];
  const json& large = rows[k1T];
  uint64_t reader_1g = small["reader_rss_bytes"].get<uint64_t>();
  uint64_t reader_1t = large["reader_rss_bytes"].get<uint64_t>();
  EXPECT_LT(reader_1t, 256 * kMiB);
  EXPECT_LE(reader_1t, 2 * reader_1g + 64 * kMiB);
  // The owner wrote 4 MiB + 4 KiB of a sparse segment: its memory does not follow the size.
  uint64_t owner_1g = small["owner_rss_bytes"].get<uint64_t>();
  uint64_t owner_1t = large["owner_rss_bytes"].get<uint64_t>();
  EXPECT_LT(owner_1t, 256 * kMiB);
  EXPECT_LE(owner_1t, 2 * owner_1g + 64 * kMiB);
  EXPECT_LT(large["owner_rss_shmem_bytes"].get<uint64_t>(), 64 * kMiB);
  EXPECT_LT(large["owner_pte_bytes"].get<uint64_t>(), 16 * kMiB);
}

TEST(MountTest, TwoMebibytePagesWhenTheyCanBeReserved) {
  int exit_code = -1;
  auto rows = RunMount("--sizes 1G --huge-pages 2m --repeat 1", &exit_code);
  ASSERT_EQ(exit_code, 0);
  ASSERT_TRUE(rows.count(k1G)) << "no 1G row";
  const json& row = rows[k1G];
  if (row.contains("skipped")) GTEST_SKIP() << row.value("reason", "skipped");
  ASSERT_FALSE(row.contains("error")) << row.dump();
  EXPECT_EQ(row["page_size"].get<uint64_t>(), 2097152u);
  EXPECT_EQ(row["route"], "shm");
  EXPECT_TRUE(row["verified"].get<bool>());
  EXPECT_LT(row["reader_pte_bytes"].get<uint64_t>(), 16 * kMiB);
  EXPECT_LT(row["reader_rss_bytes"].get<uint64_t>(), 256 * kMiB);
}

}  // namespace
