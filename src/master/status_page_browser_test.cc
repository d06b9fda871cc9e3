// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The status page in a real browser: headless Chromium (Debian's chromium) loads it from a
// master, runs its script, and the rendered numbers are checked against the JSON routes. A
// screenshot of the page goes into the build folder (status-page.png).
#include <gtest/gtest.h>
#include <httplib.h>
#include <stdio.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/env.h"
#include "master/master_server.h"
#include "master/master_state.h"

namespace larder::master {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string FindChromium() {
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
    const char* path = std::getenv("PATH");
    std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
    size_t start = 0;
    while (start <= dirs.size()) {
      size_t end = dirs.find(':', start);
      if (end == std::string::npos) end = dirs.size();
      fs::path candidate = fs::path(dirs.substr(start, end - start)) / name;
      if (!candidate.parent_path().empty() && access(candidate.c_str(), X_OK) == 0) {
        return candidate.string();
      }
      start = end + 1;
    }
  }
  return "";
}

struct ShellRun {
  int status = -1;
  std::string out;
};

// Runs a shell command line, its stdout captured.
ShellRun Shell(const std::string& command) {
  ShellRun run;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  std::array<char, 65536> buffer;
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) run.out.append(buffer.data(), n);
  run.status = pclose(pipe);
  return run;
}

// The page's bytes() in JavaScript: "512 B", "8.0 KiB", "2.0 MiB".
std::string Bytes(double n) { return FormatReadableBytes(n); }

// The text of the first element after `marker` (an attribute, e.g. id="objects"), up to the next
// tag; searched from `from`.
std::string TextAfter(const std::string& dom, const std::string& marker, size_t from = 0) {
  size_t at = dom.find(marker, from);
  if (at == std::string::npos) return "<no " + marker + ">";
  size_t open = dom.find('>', at);
  size_t close = dom.find('<', open);
  if (open == std::string::npos || close == std::string::npos) return "<unterminated>";
  return dom.substr(open + 1, close - open - 1);
}

class StatusPageBrowserTest : public ::testing::Test {
 protected:
  void SetUp() override {
    chromium_ = FindChromium();
    if (chromium_.empty()) GTEST_SKIP() << "no chromium on PATH (Debian package chromium)";
    profile_ = fs::temp_directory_path() / ("larder-chromium-" + std::to_string(getpid()));
    fs::create_directories(profile_);
  }
  void TearDown() override {
    std::error_code ignored;
    if (!profile_.empty()) fs::remove_all(profile_, ignored);
  }

  // Chromium headless on `url` with `what` (--dump-dom or --screenshot=...): the script runs for
  // up to 5 s of virtual time, which covers the page's first refresh.
  ShellRun Chromium(const std::string& url, const std::string& what) const {
    return Shell("timeout 120 " + chromium_ +
                 " --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run"
                 " --hide-scrollbars --user-data-dir=" +
                 profile_.string() + " --window-size=1280,1100 --virtual-time-budget=5000 " + what +
                 " " + url + " 2>" + (profile_ / "stderr.txt").string());
  }
  std::string ChromiumErrors() const {
    std::ifstream in(profile_ / "stderr.txt");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return text.size() > 2000 ? text.substr(text.size() - 2000) : text;
  }

  std::string chromium_;
  fs::path profile_;
};

TEST_F(StatusPageBrowserTest, PageRendersWhatTheJsonRoutesSay) {
  MasterServerOptions options;
  options.listen_host = "127.0.0.1";
  options.port = 0;
  options.http_port = 0;
  options.status_interval = std::chrono::milliseconds(100);
  auto server = MasterServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  MasterState& state = (*server)->state();
  SegmentMount mount{"seg-a", 0x10000, 64 << 20, {}};
  mount.descriptor.page_size = 2097152;
  ASSERT_TRUE(state.MountSegments("prefill-0", "host-a", std::span(&mount, 1))[0].ok());
  SegmentMount other{"seg-b", 0x10000, 32 << 20, {}};
  ASSERT_TRUE(state.MountSegments("decode-0", "host-a", std::span(&other, 1))[0].ok());
  for (int i = 0; i < 5; ++i) {
    const std::string key = "page/" + std::to_string(i);
    PutStartItem item{key, 3 << 20};
    std::string_view name = key;
    ASSERT_TRUE(state.BatchPutStart("prefill-0", std::span(&item, 1), {}).ok());
    ASSERT_TRUE(state.BatchPutEnd("prefill-0", std::span(&name, 1)).ok());
  }
  std::vector<std::string_view> keys = {"page/0", "page/1", "page/2", "absent"};
  ASSERT_TRUE(state.BatchGetReplicas("decode-0", keys).ok());
  // Tenant "sglang" looks its keys up first: 1 of 4 found.
  const std::vector<std::string> sglang_keys = {
      std::string("\0sglang\0page/9", 15), std::string("\0sglang\0x", 10),
      std::string("\0sglang\0y", 10), std::string("\0sglang\0z", 10)};
  const std::vector<std::string_view> lookups(sglang_keys.begin(), sglang_keys.end());
  {
    PutStartItem item{sglang_keys[0], 1 << 20};
    ASSERT_TRUE(state.BatchPutStart("prefill-0", std::span(&item, 1), {}).ok());
    ASSERT_TRUE(state.BatchPutEnd("prefill-0", std::span(&lookups[0], 1)).ok());
  }
  ASSERT_TRUE(state.BatchExist("decode-0", lookups).ok());
  ClientTraffic traffic;
  traffic.routes.push_back({"prefill-0", "shm", 3, 9 << 20, 0});
  traffic.routes.push_back({"prefill-0", "tcp", 1, 1000, 0});
  EXPECT_FALSE(state.Heartbeat("decode-0", &traffic).remount_required);

  const std::string url = "http://127.0.0.1:" + std::to_string((*server)->http_port()) + "/";
  ShellRun dump = Chromium(url, "--dump-dom");
  if (dump.status != 0 || dump.out.find("<html") == std::string::npos) {
    GTEST_SKIP() << "chromium cannot start here (exit " << dump.status << "): " << ChromiumErrors();
  }
  const std::string& dom = dump.out;
  EXPECT_EQ(TextAfter(dom, "id=\"error\""), "") << "the page reported an error";

  httplib::Client http("127.0.0.1", (*server)->http_port());
  auto summary_reply = http.Get("/api/summary");
  ASSERT_TRUE(summary_reply);
  json summary = json::parse(summary_reply->body);
  EXPECT_EQ(TextAfter(dom, "id=\"version\""), summary["version"].get<std::string>());
  EXPECT_EQ(TextAfter(dom, "id=\"objects\""), std::to_string(summary["objects"].get<int>()));
  EXPECT_EQ(TextAfter(dom, "id=\"bytes_used\""), Bytes(summary["bytes_used"].get<double>()));
  EXPECT_EQ(TextAfter(dom, "id=\"bytes_capacity\""),
            Bytes(summary["bytes_capacity"].get<double>()));
  char hit_rate[32];
  std::snprintf(hit_rate, sizeof(hit_rate), "%.1f%%", 100 * summary["hit_rate"].get<double>());
  EXPECT_EQ(TextAfter(dom, "id=\"hit_rate\""), hit_rate);
  EXPECT_EQ(TextAfter(dom, "id=\"clients\""), std::to_string(summary["clients"].get<int>()));
  EXPECT_EQ(TextAfter(dom, "id=\"segments\""), std::to_string(summary["segments"].get<int>()));
  // And the figures are the ones put in above: the engines found 3 of 4 gets (default tenant)
  // and 1 of 4 lookups (tenant sglang).
  EXPECT_EQ(summary["objects"], 6);
  EXPECT_EQ(TextAfter(dom, "id=\"bytes_used\""), "16.0 MiB");
  EXPECT_EQ(TextAfter(dom, "id=\"hit_rate\""), "50.0%");
  const size_t sglang_row = dom.find("data-tenant=\"sglang\"");
  ASSERT_NE(sglang_row, std::string::npos) << "no row for tenant sglang";
  EXPECT_EQ(TextAfter(dom, "data-field=\"lookups\"", sglang_row), "4");
  EXPECT_EQ(TextAfter(dom, "data-field=\"hit_rate\"", sglang_row), "25.0%");
  EXPECT_EQ(TextAfter(dom, "data-field=\"hit_rate_of\"", sglang_row), "lookups");
  const size_t default_row = dom.find("data-tenant=\"(default)\"");
  ASSERT_NE(default_row, std::string::npos) << "no row for the default tenant";
  EXPECT_EQ(TextAfter(dom, "data-field=\"hit_rate\"", default_row), "75.0%");

  auto segments_reply = http.Get("/api/segments");
  ASSERT_TRUE(segments_reply);
  const json segments = json::parse(segments_reply->body)["segments"];
  ASSERT_EQ(segments.size(), 2u);
  for (const json& segment : segments) {
    const std::string name = segment["name"];
    const size_t row = dom.find("data-segment=\"" + name + "\"");
    ASSERT_NE(row, std::string::npos) << "no row for segment " << name;
    EXPECT_EQ(TextAfter(dom, "data-field=\"owner\"", row), segment["owner"].get<std::string>());
    EXPECT_EQ(TextAfter(dom, "data-field=\"size\"", row), Bytes(segment["size"].get<double>()));
    EXPECT_EQ(TextAfter(dom, "data-field=\"used\"", row), Bytes(segment["used"].get<double>()));
    EXPECT_EQ(TextAfter(dom, "data-field=\"objects\"", row),
              std::to_string(segment["objects"].get<int>()));
  }
  const size_t seg_a = dom.find("data-segment=\"seg-a\"");
  EXPECT_EQ(TextAfter(dom, "data-field=\"page_size\"", seg_a), "2.0 MiB");
  EXPECT_EQ(TextAfter(dom, "data-field=\"routes\"", seg_a), "shm 9.0 MiB, tcp 1000 B");

  auto clients_reply = http.Get("/api/clients");
  ASSERT_TRUE(clients_reply);
  const json clients = json::parse(clients_reply->body)["clients"];
  ASSERT_EQ(clients.size(), 2u);
  for (const json& client : clients) {
    const std::string id = client["client_id"];
    const size_t row = dom.find("data-client=\"" + id + "\"");
    ASSERT_NE(row, std::string::npos) << "no row for client " << id;
    EXPECT_EQ(TextAfter(dom, "data-field=\"host_id\"", row), client["host_id"].get<std::string>());
    EXPECT_EQ(TextAfter(dom, "data-field=\"alive\"", row), "yes");
    EXPECT_EQ(TextAfter(dom, "data-field=\"segments\"", row),
              std::to_string(client["segments"].get<int>()));
  }
  // The charts were drawn: one line per series, and a legend entry per route.
  EXPECT_NE(dom.find("<polyline"), std::string::npos);
  EXPECT_NE(dom.find("<span>shm</span>"), std::string::npos);
  EXPECT_NE(dom.find("<span>tcp</span>"), std::string::npos);

  // The screenshot, beside the binaries' folder when run from the build (LARDER_BIN_DIR).
  const std::string bin_dir = GetEnv("LARDER_BIN_DIR");
  const fs::path shot =
      (bin_dir.empty() ? fs::temp_directory_path() : fs::path(bin_dir).parent_path()) /
      "status-page.png";
  fs::remove(shot);
  ShellRun screenshot = Chromium(url, "--screenshot=" + shot.string());
  ASSERT_EQ(screenshot.status, 0) << ChromiumErrors();
  std::ifstream png(shot, std::ios::binary);
  std::string head(8, '\0');
  ASSERT_TRUE(png.read(head.data(), 8)) << "no screenshot at " << shot;
  EXPECT_EQ(head, std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_GT(fs::file_size(shot), 10000u);
  std::cout << "status page screenshot: " << shot.string() << std::endl;
  (*server)->Shutdown();
}

// A master that has no samples yet draws empty charts, not "NaN".
TEST_F(StatusPageBrowserTest, AnIdleMasterWithoutSamplesDrawsNoNaN) {
  MasterServerOptions options;
  options.listen_host = "127.0.0.1";
  options.port = 0;
  options.http_port = 0;
  options.status_interval = std::chrono::hours(1);  // no sample is taken while the page loads
  auto server = MasterServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string url = "http://127.0.0.1:" + std::to_string((*server)->http_port()) + "/";
  ShellRun dump = Chromium(url, "--dump-dom");
  if (dump.status != 0 || dump.out.find("<html") == std::string::npos) {
    GTEST_SKIP() << "chromium cannot start here (exit " << dump.status << "): " << ChromiumErrors();
  }
  EXPECT_EQ(TextAfter(dump.out, "id=\"error\""), "") << "the page reported an error";
  EXPECT_NE(dump.out.find("id=\"chart-ops\""), std::string::npos);
  EXPECT_EQ(dump.out.find("NaN"), std::string::npos) << dump.out;
}

}  // namespace
}  // namespace larder::master
