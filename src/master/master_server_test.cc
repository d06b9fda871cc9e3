// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The master's HTTP endpoint, served by a real MasterServer.
#include "master/master_server.h"
#include "master/master_server_testing.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "larder/version.h"
#include "transfer/testing/test_util.h"

namespace larder::master {
namespace {

using namespace std::string_view_literals;

// A second master on a taken HTTP port fails to start instead of sharing the port (SO_REUSEPORT
// would hand it every other request), and the first keeps answering alone.
TEST(MasterServerTest, ASecondMasterCannotShareTheHttpPort) {
  auto first = MasterServer::Start(LoopbackServerOptions());
  ASSERT_TRUE(first.ok()) << first.status();
  MasterServerOptions options = LoopbackServerOptions();
  options.http_port = (*first)->http_port();
  auto second = MasterServer::Start(options);
  ASSERT_FALSE(second.ok()) << "two masters share HTTP port " << options.http_port;
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find(std::to_string(options.http_port)), std::string::npos)
      << second.status();
  httplib::Client http("127.0.0.1", options.http_port);
  for (int i = 0; i < 4; ++i) {
    auto health = http.Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 200);
  }
}

TEST(MasterServerTest, HttpEndpointServesMetricsHealthSegmentsAndKeys) {
  MasterServerOptions options = LoopbackServerOptions();
  auto server = MasterServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  MasterState& state = (*server)->state();
  ASSERT_TRUE(MountOne(state, "c", "h", {"seg-a", 0x10000, 1 << 20, {}}).ok());
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
  MasterServerOptions options = LoopbackServerOptions();
  options.master.metrics_per_client = true;
  auto server = MasterServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  MasterState& state = (*server)->state();
  SegmentMount huge{"huge-seg", 0x10000, 1 << 20, {}};
  huge.descriptor.page_size = 2097152;
  ASSERT_TRUE(MountOne(state, "prefill-a", "host-a", huge).ok());
  ClientTraffic traffic;
  traffic.routes.push_back({"prefill-b", "shm", 10, 40960, 0});
  traffic.routes.push_back({"decode \"x\"", "tcp", 2, 8192, 1});  // quotes must be escaped
  traffic.gauges = {{"shm", "mapped_segments", 1},
                    {"shm", "mapped_bytes", 1ull << 40},
                    {"device", "device_imports", 2},
                    {"device", "device_imported_bytes", 3ull << 30}};
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
  EXPECT_NE(body.find("larder_client_device_imports{client=\"prefill-a\"} 2\n"), std::string::npos);
  EXPECT_NE(body.find("larder_client_device_imported_bytes{client=\"prefill-a\"} 3221225472\n"),
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

// By default no label of /metrics names a client engine (its id holds a pid): what clients moved
// is in totals by route and locality, which a restarted client adds to without new series.
TEST(MasterServerTest, DefaultMetricsKeepTheirSeriesWhenClientsRestart) {
  auto server = MasterServer::Start(LoopbackServerOptions());
  ASSERT_TRUE(server.ok()) << server.status();
  MasterState& state = (*server)->state();
  httplib::Client http("127.0.0.1", (*server)->http_port());
  // The series of an exposition: each sample line without its value.
  auto series = [&] {
    auto metrics = http.Get("/metrics");
    EXPECT_TRUE(metrics);
    std::set<std::string> out;
    std::istringstream lines(metrics ? metrics->body : "");
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty() && line[0] != '#') out.insert(line.substr(0, line.rfind(' ')));
    }
    return out;
  };
  EXPECT_TRUE(series().count("larder_transfer_bytes_total{route=\"tcp\",locality=\"same_host\"}"));
  // The same segment name each time (an operator's --segment-name): the same series each time.
  std::vector<std::set<std::string>> seen;
  for (int pid : {100, 101}) {
    const std::string id = "host-a/" + std::to_string(pid) + "/key" + std::to_string(pid);
    ASSERT_TRUE(MountOne(state, id, "host-a", {"seg-a", 0x10000, 1 << 20, {}}).ok());
    for (uint64_t bytes : {1000, 5096}) {
      ClientTraffic traffic;
      traffic.routes.push_back({"host-a/200/other", "tcp", 1, bytes, 0});
      traffic.routes.push_back({"host-b/300/remote", "tcp", 1, bytes, 0});
      EXPECT_FALSE(state.Heartbeat(id, &traffic).remount_required);
    }
    seen.push_back(series());
    for (const std::string& line : seen.back()) {
      EXPECT_EQ(line.find(std::to_string(pid)), std::string::npos) << line;
    }
    ASSERT_TRUE(state.UnmountSegments(id, {}, /*unregister=*/true).ok());
  }
  EXPECT_EQ(seen[0], seen[1]);
  auto metrics = http.Get("/metrics");
  ASSERT_TRUE(metrics);
  // Each client's second report moved 4096 bytes to either peer.
  EXPECT_NE(metrics->body.find(
                "larder_transfer_bytes_total{route=\"tcp\",locality=\"same_host\"} 8192\n"),
            std::string::npos)
      << metrics->body;
  EXPECT_NE(metrics->body.find(
                "larder_transfer_bytes_total{route=\"tcp\",locality=\"other_host\"} 8192\n"),
            std::string::npos);
  (*server)->Shutdown();
}

TEST(MasterServerTest, MooncakeRoutesListSegmentsAndKeysAndQueryReplicas) {
  using namespace std::string_literals;
  MasterServerOptions options = LoopbackServerOptions();
  auto server = MasterServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  MasterState& state = (*server)->state();
  SegmentMount with_endpoint{"seg-a", 0x10000, 1 << 20, {}};
  with_endpoint.descriptor.address = "10.0.0.1:7000";
  SegmentMount without{"seg-b", 0x900000, 1 << 20, {}};
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
  MasterServerOptions options = LoopbackServerOptions();
  auto server = MasterServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  MasterState& state = (*server)->state();
  ASSERT_TRUE(MountOne(state, "c", "h", {"seg-a", 0x10000, 1 << 20, {}}).ok());
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

// The JSON routes behind the status page, against what the state holds.
TEST(MasterServerTest, ApiRoutesDescribeTheClusterAndItsRecentHistory) {
  MasterServerOptions options = LoopbackServerOptions();
  options.status_interval = std::chrono::milliseconds(50);
  auto server = MasterServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  MasterState& state = (*server)->state();
  SegmentMount huge{"seg-a", 0x10000, 1 << 20, {}};
  huge.descriptor.page_size = 2097152;
  ASSERT_TRUE(MountOne(state, "owner", "host-a", huge).ok());
  SegmentMount other{"seg-b", 0x10000, 1 << 20, {}};
  ASSERT_TRUE(state.MountSegments("reader", "host-b", std::span(&other, 1))[0].ok());
  for (std::string_view key : {"k1", "k2"}) {
    PutStartItem item{key, 4096};
    ASSERT_TRUE(state.BatchPutStart("owner", std::span(&item, 1), {}).ok());
    ASSERT_TRUE(state.BatchPutEnd("owner", std::span(&key, 1)).ok());
  }
  std::vector<std::string_view> keys = {"k1", "k2", "absent"};
  ASSERT_TRUE(state.BatchGetReplicas("reader", keys).ok());
  // Tenant t's engine looks up first (as SGLang and vLLM do): 1 of 4 found, and it gets that one.
  const std::string t_k1 = std::string("\0t\0k1", 5);
  ASSERT_TRUE(state.BatchPutStart("owner", std::vector<PutStartItem>{{t_k1, 4096}}, {}).ok());
  ASSERT_TRUE(state.BatchPutEnd("owner", std::vector<std::string_view>{t_k1}).ok());
  const std::string t_absent[] = {std::string("\0t\0x", 4), std::string("\0t\0y", 4),
                                  std::string("\0t\0z", 4)};
  ASSERT_TRUE(state
                  .BatchExist("reader", std::vector<std::string_view>{t_k1, t_absent[0],
                                                                      t_absent[1], t_absent[2]})
                  .ok());
  ASSERT_TRUE(state.BatchGetReplicas("reader", std::vector<std::string_view>{t_k1}).ok());
  ClientTraffic traffic;
  traffic.routes.push_back({"owner", "shm", 4, 8192, 0});
  traffic.routes.push_back({"owner", "tcp", 1, 100, 1});
  EXPECT_FALSE(state.Heartbeat("reader", &traffic).remount_required);

  httplib::Client http("127.0.0.1", (*server)->http_port());
  auto summary = http.Get("/api/summary");
  ASSERT_TRUE(summary);
  ASSERT_EQ(summary->status, 200);
  EXPECT_EQ(summary->get_header_value("Content-Type"), "application/json");
  auto s = nlohmann::json::parse(summary->body);
  EXPECT_EQ(s["version"], Version());
  EXPECT_EQ(s["role"], "single");
  EXPECT_EQ(s["objects"], 3);
  EXPECT_EQ(s["bytes_used"], 3 * 4096);
  EXPECT_EQ(s["bytes_capacity"], 2 << 20);
  EXPECT_EQ(s["segments"], 2);
  EXPECT_EQ(s["clients"], 2);
  EXPECT_EQ(s["puts"], 3);
  EXPECT_EQ(s["gets"], 4);
  EXPECT_EQ(s["get_misses"], 1);
  EXPECT_DOUBLE_EQ(s["get_hit_rate"].get<double>(), 3.0 / 4.0);
  EXPECT_EQ(s["lookups"], 4);
  EXPECT_EQ(s["lookup_misses"], 3);
  EXPECT_DOUBLE_EQ(s["lookup_hit_rate"].get<double>(), 1.0 / 4.0);
  // What the engines saw: the default tenant's gets (2 of 3) and tenant t's lookups (1 of 4).
  EXPECT_DOUBLE_EQ(s["hit_rate"].get<double>(), 3.0 / 7.0);

  auto tenants = http.Get("/api/tenants");
  ASSERT_TRUE(tenants);
  auto t = nlohmann::json::parse(tenants->body);
  ASSERT_EQ(t["tenants"].size(), 2u) << t;
  EXPECT_EQ(t["tenants"][0]["tenant"], "");
  EXPECT_EQ(t["tenants"][0]["hit_rate_of"], "gets");
  EXPECT_DOUBLE_EQ(t["tenants"][0]["hit_rate"].get<double>(), 2.0 / 3.0);
  EXPECT_EQ(t["tenants"][1]["tenant"], "t");
  EXPECT_EQ(t["tenants"][1]["hit_rate_of"], "lookups");
  EXPECT_EQ(t["tenants"][1]["lookups"], 4);
  EXPECT_EQ(t["tenants"][1]["gets"], 1);
  EXPECT_DOUBLE_EQ(t["tenants"][1]["hit_rate"].get<double>(), 1.0 / 4.0);
  EXPECT_FALSE(t.contains("other_tenants"));
  auto metrics = http.Get("/metrics");
  ASSERT_TRUE(metrics);
  for (const char* line : {"larder_lookups_total 4\n", "larder_lookup_misses_total 3\n",
                           "larder_tenant_lookups_total{tenant=\"t\"} 4\n",
                           "larder_tenant_lookup_misses_total{tenant=\"t\"} 3\n",
                           "larder_tenant_gets_total{tenant=\"\"} 3\n",
                           "larder_tenant_get_misses_total{tenant=\"\"} 1\n"}) {
    EXPECT_NE(metrics->body.find(line), std::string::npos) << line;
  }
  for (const char* field : {"ops_per_s", "evictions_per_s", "lease_expiries", "evictions"}) {
    EXPECT_TRUE(s.contains(field)) << field;
  }

  auto segments = http.Get("/api/segments");
  ASSERT_TRUE(segments);
  auto list = nlohmann::json::parse(segments->body)["segments"];
  ASSERT_EQ(list.size(), 2u);
  auto a = list[0]["name"] == "seg-a" ? list[0] : list[1];
  EXPECT_EQ(a["owner"], "owner");
  EXPECT_EQ(a["host_id"], "host-a");
  EXPECT_EQ(a["size"], 1 << 20);
  EXPECT_EQ(a["used"], 3 * 4096);
  EXPECT_EQ(a["objects"], 3);
  EXPECT_EQ(a["page_size"], 2097152);
  // What the reader moved from the owner, as the reader's heartbeat said.
  EXPECT_EQ(a["routes_to_owner"]["shm"]["bytes"], 8192);
  EXPECT_EQ(a["routes_to_owner"]["tcp"]["failures"], 1);

  auto clients = http.Get("/api/clients");
  ASSERT_TRUE(clients);
  auto c = nlohmann::json::parse(clients->body)["clients"];
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0]["client_id"], "owner");  // sorted by id
  EXPECT_EQ(c[1]["client_id"], "reader");
  EXPECT_EQ(c[1]["host_id"], "host-b");
  EXPECT_EQ(c[1]["alive"], true);
  EXPECT_EQ(c[1]["segments"], 1);
  EXPECT_GE(c[1]["last_heartbeat_ms_ago"].get<int64_t>(), 0);
  EXPECT_LT(c[1]["last_heartbeat_ms_ago"].get<int64_t>(), 60000);
  EXPECT_EQ(c[1]["routes"]["shm"]["requests"], 4);
  EXPECT_TRUE(c[0]["routes"].empty());

  // The sampler records every 50 ms. Once a sample is known to follow everything above (the
  // first one taken after `now_ms`), the rates of the points after it add up to what happens
  // next.
  auto fetch_points = [&http] {
    auto history = http.Get("/api/history");
    if (!history || history->status != 200) return nlohmann::json::array();
    return nlohmann::json::parse(history->body)["points"];
  };
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  int64_t barrier_ms = 0;
  nlohmann::json points;
  ASSERT_TRUE(testutil::WaitUntil(
      [&] {
        for (const auto& point : fetch_points()) {
          if (point["unix_ms"].get<int64_t>() > now_ms) {
            barrier_ms = point["unix_ms"].get<int64_t>();
            return true;
          }
        }
        return false;
      },
      std::chrono::seconds(20)));
  for (std::string_view key : {"k3", "k4", "k5", "k6"}) {
    PutStartItem item{key, 4096};
    ASSERT_TRUE(state.BatchPutStart("owner", std::span(&item, 1), {}).ok());
    ASSERT_TRUE(state.BatchPutEnd("owner", std::span(&key, 1)).ok());
  }
  // The reader's counters are cumulative: 1 MiB more over shm (Heartbeat took the last report).
  ClientTraffic more;
  more.routes.push_back({"owner", "shm", 5, 8192 + (1 << 20), 0});
  more.routes.push_back({"owner", "tcp", 1, 100, 1});
  EXPECT_FALSE(state.Heartbeat("reader", &more).remount_required);
  double puts = 0, shm_bytes = 0;
  auto add_up = [&] {
    puts = shm_bytes = 0;
    int64_t last_ms = 0;
    for (const auto& point : points) {
      const int64_t unix_ms = point["unix_ms"].get<int64_t>();
      EXPECT_GT(unix_ms, last_ms);
      last_ms = unix_ms;
      EXPECT_TRUE(point.contains("hit_rate"));
      EXPECT_EQ(point["bytes_capacity"], 2 << 20);
      if (unix_ms <= barrier_ms) continue;
      const double seconds = point["seconds"].get<double>();
      puts += point["puts_per_s"].get<double>() * seconds;
      shm_bytes += point["route_bytes_per_s"].value("shm", 0.0) * seconds;
    }
  };
  // Until both show (the puts and the heartbeat may land in different samples); then exactly.
  ASSERT_TRUE(testutil::WaitUntil(
      [&] {
        points = fetch_points();
        add_up();
        return puts > 3.5 && shm_bytes > 1e6;
      },
      std::chrono::seconds(20)))
      << points;
  EXPECT_NEAR(puts, 4.0, 1e-6) << points;
  EXPECT_NEAR(shm_bytes, 1 << 20, 1e-3) << points;
  (*server)->Shutdown();
}

// The status page is served from the binary and reads the routes above.
TEST(MasterServerTest, StatusPageIsServedAtTheRoot) {
  MasterServerOptions options = LoopbackServerOptions();
  auto server = MasterServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  httplib::Client http("127.0.0.1", (*server)->http_port());
  auto page = http.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
  for (const char* needed : {"/api/summary", "/api/history", "/api/segments", "/api/clients",
                             "id=\"objects\"", "id=\"segment-rows\""}) {
    EXPECT_NE(page->body.find(needed), std::string::npos) << needed;
  }
  // Nothing from elsewhere: no CDN, no outside script or style.
  EXPECT_EQ(page->body.find("http://"), std::string::npos);
  EXPECT_EQ(page->body.find("https://"), std::string::npos);
  (*server)->Shutdown();
}

TEST(MasterServerTest, TakenPortIsAClearError) {
  MasterServerOptions options = LoopbackServerOptions();
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
