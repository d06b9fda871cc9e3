// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// High availability of larder-master: MasterServers electing a leader in a real etcd (roles,
// /health, standbys refusing calls), the host lock of a cluster without etcd, and real
// larder-master processes (from $LARDER_BIN_DIR) where the standby replaces a SIGKILLed leader.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "common/child_process.h"
#include "etcd/etcd_fixture.h"
#include "etcd/etcd_test_server.h"
#include "master.grpc.pb.h"
#include "master/master_server.h"
#include "testing/master_process.h"
#include "transfer/testing/test_util.h"

namespace larder::master {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;

// /health's "role", or what went wrong.
std::string HealthRole(int http_port) {
  httplib::Client http("127.0.0.1", http_port);
  http.set_connection_timeout(seconds(2));
  http.set_read_timeout(seconds(2));
  auto response = http.Get("/health");
  if (!response) return "<no answer>";
  auto health = nlohmann::json::parse(response->body, nullptr, /*allow_exceptions=*/false);
  if (!health.is_object()) return "<not JSON: " + response->body + ">";
  return health.value("role", "<no role>");
}

grpc::Status GetStats(const std::string& address) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = proto::Master::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + seconds(5));
  proto::StatsRequest request;
  proto::StatsReply reply;
  return stub->GetStats(&context, request, &reply);
}

MasterServerOptions LoopbackOptions() {
  MasterServerOptions options;
  options.listen_host = "127.0.0.1";
  options.port = 0;
  options.http_port = 0;
  return options;
}

TEST(MasterHostLockTest, ASecondMasterOfAClusterWithoutEtcdIsRefused) {
  MasterServerOptions options = LoopbackOptions();
  options.cluster_id = "host-lock-test";
  auto first = MasterServer::Start(options);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ((*first)->role(), "single");

  auto second = MasterServer::Start(options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("cluster host-lock-test already has a master on this "
                                           "host; several masters of one cluster need --etcd"),
            std::string::npos)
      << second.status();

  // Another cluster, or no cluster id, is not held back.
  MasterServerOptions other = LoopbackOptions();
  other.cluster_id = "host-lock-test-2";
  EXPECT_TRUE(MasterServer::Start(other).ok());
  EXPECT_TRUE(MasterServer::Start(LoopbackOptions()).ok());

  // The lock goes with the master.
  first->reset();
  auto third = MasterServer::Start(options);
  EXPECT_TRUE(third.ok()) << third.status();
}

TEST(MasterHostLockTest, RefusesBadHaOptions) {
  MasterServerOptions no_cluster = LoopbackOptions();
  no_cluster.etcd_endpoints = {"127.0.0.1:2379"};
  auto refused = MasterServer::Start(no_cluster);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("cluster id"), std::string::npos) << refused.status();

  MasterServerOptions bad_id = LoopbackOptions();
  bad_id.cluster_id = "a b";
  EXPECT_EQ(MasterServer::Start(bad_id).status().code(), StatusCode::kInvalidArgument);

  MasterServerOptions bad_advertise = LoopbackOptions();
  bad_advertise.etcd_endpoints = {"127.0.0.1:2379"};
  bad_advertise.cluster_id = "c";
  bad_advertise.advertise_address = "host-without-port";
  auto advertise = MasterServer::Start(bad_advertise);
  EXPECT_EQ(advertise.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(advertise.status().message().find("advertise"), std::string::npos)
      << advertise.status();
}

class MasterHaTest : public etcd::EtcdTest {
 protected:
  MasterServerOptions HaOptions() const {
    MasterServerOptions options = LoopbackOptions();
    options.etcd_endpoints = {etcd_->endpoint()};
    options.cluster_id = "master-ha-test";
    options.leader_ttl = seconds(2);
    return options;
  }

  std::vector<std::string> HaFlags() const {
    return {"--etcd", etcd_->endpoint(), "--cluster-id", "master-ha-process-test", "--leader-ttl",
            "2s"};
  }
};

TEST_F(MasterHaTest, TheStandbyRefusesCallsNamingTheLeaderAndTakesOverOnShutdown) {
  auto a = MasterServer::Start(HaOptions());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(testutil::WaitUntil([&] { return (*a)->role() == "leader"; }, seconds(15)));
  auto b = MasterServer::Start(HaOptions());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->role(), "standby");

  EXPECT_EQ(HealthRole((*a)->http_port()), "leader");
  EXPECT_EQ(HealthRole((*b)->http_port()), "standby");
  EXPECT_TRUE(GetStats((*a)->address()).ok());
  // The standby answers once it knows the leader.
  grpc::Status refused;
  ASSERT_TRUE(testutil::WaitUntil(
      [&] {
        refused = GetStats((*b)->address());
        return refused.error_message().find("the leader is at") != std::string::npos;
      },
      seconds(15)))
      << refused.error_message();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(refused.error_message().find("standby of cluster master-ha-test; the leader is at " +
                                         (*a)->address()),
            std::string::npos)
      << refused.error_message();

  (*a)->Shutdown();
  EXPECT_EQ((*a)->role(), "stopped");
  ASSERT_TRUE(testutil::WaitUntil([&] { return (*b)->role() == "leader"; }, seconds(15)));
  EXPECT_TRUE(GetStats((*b)->address()).ok());
  EXPECT_EQ(HealthRole((*b)->http_port()), "leader");
}

// Real processes: the standby replaces a SIGKILLed leader.
TEST_F(MasterHaTest, ProcessesTheStandbyReplacesAKilledLeader) {
  using Master = test::MasterProcess;
  auto spawn = [&]() -> Master {
    auto master = test::SpawnMaster("", "0", HaFlags(), {});
    EXPECT_TRUE(master.ok()) << master.status();
    return master.ok() ? std::move(*master) : Master();
  };

  Master a = spawn();
  ASSERT_GT(a.http_port, 0);
  ASSERT_TRUE(testutil::WaitUntil([&] { return HealthRole(a.http_port) == "leader"; }, seconds(20)))
      << HealthRole(a.http_port);
  Master b = spawn();
  ASSERT_GT(b.http_port, 0);
  EXPECT_EQ(HealthRole(b.http_port), "standby");
  EXPECT_TRUE(GetStats(a.address).ok());
  EXPECT_EQ(GetStats(b.address).error_code(), grpc::StatusCode::UNAVAILABLE);

  const auto killed = steady_clock::now();
  a.process.Kill(SIGKILL);
  // The lease lapses within its TTL (2 s) of the last keep-alive; then a poll finds the key gone.
  ASSERT_TRUE(testutil::WaitUntil([&] { return HealthRole(b.http_port) == "leader"; }, seconds(20)))
      << HealthRole(b.http_port);
  EXPECT_GE(steady_clock::now() - killed, milliseconds(500));  // it waited for the lease
  EXPECT_TRUE(testutil::WaitUntil([&] { return GetStats(b.address).ok(); }, seconds(5)));
}

// A leading process cut off from etcd stops serving and exits with status 3.
TEST_F(MasterHaTest, ProcessesALeaderCutOffFromEtcdExitsWithStatus3) {
  auto master = test::SpawnMaster("", "0", HaFlags(), {});
  ASSERT_TRUE(master.ok()) << master.status();
  const int http_port = master->http_port;
  ChildProcess* child = &master->process;
  ASSERT_TRUE(testutil::WaitUntil([&] { return HealthRole(http_port) == "leader"; }, seconds(20)));

  etcd_->Stop();
  // Fenced within the TTL, exits one TTL later: its stdout closes.
  const auto cut = steady_clock::now();
  auto line = child->ReadLine(seconds(20));
  ASSERT_FALSE(line.ok()) << "unexpected output: " << *line;
  EXPECT_EQ(line.status().code(), StatusCode::kUnavailable) << line.status();
  EXPECT_LT(steady_clock::now() - cut, seconds(15));
  const int status = child->Stop(seconds(5));
  EXPECT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 3);
}

}  // namespace
}  // namespace larder::master
