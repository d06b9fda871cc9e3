// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The master's HTTP endpoint, served by a real MasterServer.
#include "master/master_server.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

namespace larder::master {
namespace {

TEST(MasterServerTest, HttpEndpointServesMetricsHealthSegmentsAndKeys) {
  MasterServerOptions options;
  options.listen_host = "127.0.0.1";
  options.port = 0;
  options.http_port = 0;
  auto server = MasterServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  MasterState& state = (*server)->state();
  SegmentMount mount{"seg-a", 0x10000, 1 << 20, "{}"};
  ASSERT_TRUE(state.MountSegments("c", "h", std::span(&mount, 1))[0].ok());
  for (std::string_view key : {"page/1", "page/2", "other"}) {
    PutStartItem item{key, 4096};
    ASSERT_TRUE(state.BatchPutStart("c", std::span(&item, 1), {}).ok());
    ASSERT_TRUE(state.BatchPutEnd("c", std::span(&key, 1)).ok());
  }

  httplib::Client http("127.0.0.1", (*server)->http_port());
  auto health = http.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(health->body, "ok\n");

  auto metrics = http.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("larder_objects 3\n"), std::string::npos) << metrics->body;
  EXPECT_NE(metrics->body.find("larder_bytes_used 12288\n"), std::string::npos);
  EXPECT_NE(metrics->body.find("larder_segment_bytes_capacity{segment=\"seg-a\"} 1048576"),
            std::string::npos);
  EXPECT_NE(metrics->body.find("# TYPE larder_evictions_total counter"), std::string::npos);

  auto segments = http.Get("/segments");
  ASSERT_TRUE(segments);
  auto parsed = nlohmann::json::parse(segments->body);
  ASSERT_EQ(parsed.size(), 1u);
  EXPECT_EQ(parsed[0]["name"], "seg-a");
  EXPECT_EQ(parsed[0]["objects"], 3);

  auto keys = http.Get("/keys?prefix=page/&limit=1");
  ASSERT_TRUE(keys);
  auto listed = nlohmann::json::parse(keys->body);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0]["key"], "page/1");
  auto bad = http.Get("/keys?limit=lots");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  (*server)->Shutdown();
}

TEST(MasterServerTest, ClientTrafficFromHeartbeatsIsInTheMetrics) {
  MasterServerOptions options;
  options.listen_host = "127.0.0.1";
  options.port = 0;
  options.http_port = 0;
  auto server = MasterServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  MasterState& state = (*server)->state();
  SegmentMount mount{"huge-seg", 0x10000, 1 << 20, R"({"page_size":2097152})"};
  ASSERT_TRUE(state.MountSegments("prefill-a", "host-a", std::span(&mount, 1))[0].ok());
  ClientTraffic traffic;
  traffic.routes.push_back({"prefill-b", "shm", 10, 40960, 0});
  traffic.routes.push_back({"decode \"x\"", "tcp", 2, 8192, 1});  // quotes must be escaped
  traffic.mapped_segments = 1;
  traffic.mapped_bytes = 1ull << 40;
  EXPECT_FALSE(state.Heartbeat("prefill-a", &traffic).remount_required);
  ClientTraffic stranger;
  stranger.routes.push_back({"x", "tcp", 1, 1, 0});
  EXPECT_TRUE(state.Heartbeat("unknown", &stranger).remount_required);  // not kept

  httplib::Client http("127.0.0.1", (*server)->http_port());
  auto metrics = http.Get("/metrics");
  ASSERT_TRUE(metrics);
  const std::string& body = metrics->body;
  EXPECT_NE(body.find("larder_client_transfer_bytes_total{client=\"prefill-a\",peer=\"prefill-b\","
                      "route=\"shm\"} 40960\n"),
            std::string::npos)
      << body;
  EXPECT_NE(body.find("larder_client_transfer_failures_total{client=\"prefill-a\",peer=\"decode "
                      "\\\"x\\\"\",route=\"tcp\"} 1\n"),
            std::string::npos)
      << body;
  EXPECT_NE(body.find("larder_client_mapped_bytes{client=\"prefill-a\"} 1099511627776\n"),
            std::string::npos);
  EXPECT_NE(body.find("larder_segment_page_bytes{segment=\"huge-seg\"} 2097152\n"),
            std::string::npos);
  EXPECT_EQ(body.find("client=\"unknown\""), std::string::npos);
  auto segments = http.Get("/segments");
  ASSERT_TRUE(segments);
  EXPECT_EQ(nlohmann::json::parse(segments->body)[0]["page_size"], 2097152);

  // A client that leaves takes its report with it.
  ASSERT_TRUE(state.UnmountSegments("prefill-a", {}, /*unregister=*/true).ok());
  metrics = http.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->body.find("client=\"prefill-a\""), std::string::npos);
  (*server)->Shutdown();
}

TEST(MasterServerTest, TakenPortIsAClearError) {
  MasterServerOptions options;
  options.listen_host = "127.0.0.1";
  options.port = 0;
  options.http_port = -1;
  auto first = MasterServer::Start(options);
  ASSERT_TRUE(first.ok());
  options.port = (*first)->port();
  auto second = MasterServer::Start(options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace larder::master
