// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The master's HTTP endpoint, served by a real MasterServer.
#include "master/master_server.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace larder::master {
namespace {

using namespace std::string_view_literals;

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

TEST(MasterServerTest, MooncakeRoutesListSegmentsAndKeysAndQueryReplicas) {
  using namespace std::string_literals;
  MasterServerOptions options;
  options.listen_host = "127.0.0.1";
  options.port = 0;
  options.http_port = 0;
  auto server = MasterServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  MasterState& state = (*server)->state();
  SegmentMount with_endpoint{"seg-a", 0x10000, 1 << 20, R"({"address":"10.0.0.1:7000"})"};
  SegmentMount without{"seg-b", 0x900000, 1 << 20, "{}"};
  ASSERT_TRUE(state.MountSegments("c", "h", std::span(&with_endpoint, 1))[0].ok());
  ASSERT_TRUE(state.MountSegments("d", "h2", std::span(&without, 1))[0].ok());
  PutOptions two;
  two.replica_num = 2;
  const std::string tenant_key = "\0t\0k\n"s;
  for (std::string_view key : {"page/1"sv, "page/2"sv, std::string_view(tenant_key)}) {
    PutStartItem item{key, 4096};
    auto started = state.BatchPutStart("c", std::span(&item, 1), two);
    ASSERT_TRUE(started.ok() && (*started)[0].status.ok());
    ASSERT_TRUE(state.BatchPutEnd("c", std::span(&key, 1)).ok());
  }
  PutStartItem unfinished{"writing", 4096};
  ASSERT_TRUE(state.BatchPutStart("c", std::span(&unfinished, 1), {}).ok());

  httplib::Client http("127.0.0.1", (*server)->http_port());
  auto segments = http.Get("/get_all_segments");
  ASSERT_TRUE(segments);
  EXPECT_EQ(segments->status, 200);
  EXPECT_EQ(segments->get_header_value("Content-Type"), "text/plain; version=0.0.4");
  EXPECT_EQ(segments->body, "seg-a\nseg-b\n");

  // Complete keys only, sorted, each on its line; bytes that are not printable escaped.
  auto keys = http.Get("/get_all_keys");
  ASSERT_TRUE(keys);
  EXPECT_EQ(keys->status, 200);
  EXPECT_EQ(keys->body, "\\x00t\\x00k\\x0a\npage/1\npage/2\n");

  auto query = http.Get("/query_key?key=page/1");
  ASSERT_TRUE(query);
  EXPECT_EQ(query->status, 200);
  auto replicas = state.DescribeKeys(std::vector<std::string_view>{"page/1"})[0].replicas;
  ASSERT_EQ(replicas.size(), 2u);
  std::string expected;
  for (const ReplicaLocation& replica : replicas) {
    const bool on_a = replica.segment_id == state.ListSegments({})[0].segment_id;
    expected += R"({"size_":4096,"buffer_address_":)" +
                std::to_string((on_a ? 0x10000 : 0x900000) + replica.offset) +
                R"(,"protocol_":"tcp","transport_endpoint_":")" +
                (on_a ? "10.0.0.1:7000" : "seg-b") + "\"}\n";
  }
  EXPECT_EQ(query->body, expected);
  // A tenant's key, percent-encoded.
  auto tenant = http.Get("/query_key?key=%00t%00k%0A");
  ASSERT_TRUE(tenant);
  EXPECT_EQ(tenant->status, 200) << tenant->body;
  for (const char* path : {"/query_key?key=missing", "/query_key?key=writing", "/query_key"}) {
    auto missing = http.Get(path);
    ASSERT_TRUE(missing);
    EXPECT_EQ(missing->status, 404) << path;
    EXPECT_EQ(missing->body, "OBJECT_NOT_FOUND") << path;
  }

  auto batch = http.Get("/batch_query_keys?keys=page/2,missing");
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->status, 200);
  auto parsed = nlohmann::json::parse(batch->body);
  EXPECT_EQ(parsed["success"], true);
  EXPECT_EQ(parsed["data"]["page/2"]["ok"], true);
  ASSERT_EQ(parsed["data"]["page/2"]["values"].size(), 2u);
  EXPECT_EQ(parsed["data"]["page/2"]["values"][0]["size_"], 4096);
  EXPECT_EQ(parsed["data"]["page/2"]["values"][0]["protocol_"], "tcp");
  EXPECT_EQ(parsed["data"]["missing"],
            nlohmann::json({{"ok", false}, {"error", "OBJECT_NOT_FOUND"}}));
  for (const char* path :
       {"/batch_query_keys", "/batch_query_keys?keys=", "/batch_query_keys?keys=,"}) {
    auto none = http.Get(path);
    ASSERT_TRUE(none);
    EXPECT_EQ(none->status, 400) << path;
    EXPECT_EQ(none->body,
              R"({"success":false,"error":"No keys provided. Use ?keys=key1,key2,..."})")
        << path;
  }
  std::string too_many = "/batch_query_keys?keys=k";
  for (int i = 0; i < 1024; ++i) too_many += ",k";
  auto refused = http.Get(too_many);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400);

  auto segment = http.Get("/query_segment?segment=seg-a");
  ASSERT_TRUE(segment);
  EXPECT_EQ(segment->status, 200);
  EXPECT_EQ(segment->body, "seg-a\nUsed(bytes): " + std::to_string(state.ListSegments({})[0].used) +
                               "\nCapacity(bytes) : 1048576\n");
  for (const char* path : {"/query_segment?segment=nope", "/query_segment"}) {
    auto unknown = http.Get(path);
    ASSERT_TRUE(unknown);
    EXPECT_EQ(unknown->status, 500) << path;
    EXPECT_EQ(unknown->body, "Failed to query segment");
  }

  // An empty pool lists nothing.
  ASSERT_TRUE(state.UnmountSegments("c", {}, /*unregister=*/true).ok());
  ASSERT_TRUE(state.UnmountSegments("d", {}, /*unregister=*/true).ok());
  segments = http.Get("/get_all_segments");
  ASSERT_TRUE(segments);
  EXPECT_EQ(segments->body, "");
  keys = http.Get("/get_all_keys");
  ASSERT_TRUE(keys);
  EXPECT_EQ(keys->body, "");
  (*server)->Shutdown();
}

TEST(MasterServerTest, SoftPinnedObjectsAreInTheMetrics) {
  MasterServerOptions options;
  options.listen_host = "127.0.0.1";
  options.port = 0;
  options.http_port = 0;
  auto server = MasterServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  MasterState& state = (*server)->state();
  SegmentMount mount{"seg-a", 0x10000, 1 << 20, "{}"};
  ASSERT_TRUE(state.MountSegments("c", "h", std::span(&mount, 1))[0].ok());
  PutOptions soft;
  soft.soft_pin_action = SoftPinAction::kEnable;
  for (std::string_view key : {"a", "b"}) {
    PutStartItem item{key, 4096};
    ASSERT_TRUE(state.BatchPutStart("c", std::span(&item, 1), soft).ok());
    ASSERT_TRUE(state.BatchPutEnd("c", std::span(&key, 1)).ok());
  }
  httplib::Client http("127.0.0.1", (*server)->http_port());
  auto metrics = http.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(
      metrics->body.find("# TYPE larder_soft_pinned_objects gauge\nlarder_soft_pinned_objects 2\n"),
      std::string::npos)
      << metrics->body;
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
