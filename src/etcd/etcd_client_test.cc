// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// EtcdClient against a real etcd (EtcdTestServer), and the parsing of etcd addresses and leader
// records.
#include "etcd/etcd_client.h"

#include <gtest/gtest.h>

#include <thread>

#include "common/net.h"
#include "etcd/etcd_fixture.h"
#include "etcd/etcd_test_server.h"
#include "transfer/testing/test_util.h"

namespace larder::etcd {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;

// A loopback port nothing listens on (it was free a moment ago).
std::string DeadEndpoint() {
  auto listener = TcpListen(HostPort{"127.0.0.1", 0});
  EXPECT_TRUE(listener.ok()) << listener.status();
  if (!listener.ok()) return "127.0.0.1:1";
  auto port = BoundPort(listener->get());
  EXPECT_TRUE(port.ok());
  return "127.0.0.1:" + std::to_string(port.value_or(1));
}

class EtcdClientTest : public EtcdTest {
 protected:
  void SetUp() override {
    EtcdTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    client_ = NewClient({etcd_->endpoint()});
    ASSERT_NE(client_, nullptr);
  }

  static std::unique_ptr<EtcdClient> NewClient(std::vector<std::string> endpoints,
                                               milliseconds timeout = milliseconds(2000)) {
    auto client = EtcdClient::Create(EtcdOptions{std::move(endpoints), timeout});
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(client).value() : nullptr;
  }

  std::unique_ptr<EtcdClient> client_;
};

TEST_F(EtcdClientTest, GetAndPut) {
  auto absent = client_->Get("/t/a");
  ASSERT_TRUE(absent.ok()) << absent.status();
  EXPECT_FALSE(absent->has_value());

  ASSERT_TRUE(client_->Put("/t/a", "one").ok());
  auto first = client_->Get("/t/a");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(first->has_value());
  EXPECT_EQ((*first)->key, "/t/a");
  EXPECT_EQ((*first)->value, "one");
  EXPECT_EQ((*first)->lease, 0);
  EXPECT_GT((*first)->create_revision, 0);

  ASSERT_TRUE(client_->Put("/t/a", std::string("two\0bytes", 9)).ok());
  auto second = client_->Get("/t/a");
  ASSERT_TRUE(second.ok() && second->has_value());
  EXPECT_EQ((*second)->value, std::string("two\0bytes", 9));
  EXPECT_EQ((*second)->create_revision, (*first)->create_revision);
  EXPECT_GT((*second)->mod_revision, (*first)->mod_revision);
}

TEST_F(EtcdClientTest, RefusesOversizedKeysAndValues) {
  EXPECT_EQ(client_->Put(std::string(kMaxEtcdKeyBytes + 1, 'k'), "v").code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Put("/t/big", std::string(kMaxEtcdValueBytes + 1, 'v')).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Get("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(client_->Put("/t/big", std::string(kMaxEtcdValueBytes, 'v')).ok());
  auto big = client_->Get("/t/big");
  ASSERT_TRUE(big.ok() && big->has_value()) << big.status();
  EXPECT_EQ((*big)->value.size(), kMaxEtcdValueBytes);
}

TEST_F(EtcdClientTest, PutIfAbsentAndDeleteIfLease) {
  auto a = client_->GrantLease(seconds(10));
  auto b = client_->GrantLease(seconds(10));
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_NE(a->id, b->id);

  auto created = client_->PutIfAbsent("/t/leader", "A", a->id);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE(*created);
  auto taken = client_->PutIfAbsent("/t/leader", "B", b->id);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_FALSE(*taken);
  // A retry by the holder (its first reply lost) reports the key as its own.
  auto retried = client_->PutIfAbsent("/t/leader", "A", a->id);
  ASSERT_TRUE(retried.ok());
  EXPECT_TRUE(*retried);
  auto held = client_->Get("/t/leader");
  ASSERT_TRUE(held.ok() && held->has_value());
  EXPECT_EQ((*held)->value, "A");
  EXPECT_EQ((*held)->lease, a->id);

  auto not_b = client_->DeleteIfLease("/t/leader", b->id);
  ASSERT_TRUE(not_b.ok()) << not_b.status();
  EXPECT_FALSE(*not_b);
  EXPECT_TRUE(client_->Get("/t/leader")->has_value());
  auto deleted = client_->DeleteIfLease("/t/leader", a->id);
  ASSERT_TRUE(deleted.ok());
  EXPECT_TRUE(*deleted);
  EXPECT_FALSE(client_->Get("/t/leader")->has_value());
  auto again = client_->DeleteIfLease("/t/leader", a->id);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again);

  EXPECT_EQ(client_->PutIfAbsent("/t/leader", "x", 0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->DeleteIfLease("/t/leader", 0).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(EtcdClientTest, LeaseKeepAliveExpiryAndRevoke) {
  auto lease = client_->GrantLease(seconds(2));
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->ttl, seconds(2));
  ASSERT_TRUE(client_->Put("/t/leased", "v", lease->id).ok());

  // Kept alive over more than one TTL, the key stays.
  const auto until = steady_clock::now() + seconds(3);
  while (steady_clock::now() < until) {
    auto ttl = client_->KeepAlive(lease->id);
    ASSERT_TRUE(ttl.ok()) << ttl.status();
    EXPECT_EQ(*ttl, seconds(2));
    std::this_thread::sleep_for(milliseconds(400));  // keep-alive pace, well inside the TTL
  }
  auto kept = client_->Get("/t/leased");
  ASSERT_TRUE(kept.ok() && kept->has_value());
  EXPECT_EQ((*kept)->lease, lease->id);

  // Left alone, it expires and takes the key with it.
  EXPECT_TRUE(testutil::WaitUntil(
      [&] { return !client_->Get("/t/leased").value_or({}).has_value(); }, seconds(10)));
  EXPECT_EQ(client_->KeepAlive(lease->id).status().code(), StatusCode::kNotFound);

  auto revoked = client_->GrantLease(seconds(30));
  ASSERT_TRUE(revoked.ok());
  ASSERT_TRUE(client_->Put("/t/revoked", "v", revoked->id).ok());
  ASSERT_TRUE(client_->KeepAlive(revoked->id).ok());
  ASSERT_TRUE(client_->RevokeLease(revoked->id).ok());
  EXPECT_FALSE(client_->Get("/t/revoked")->has_value());
  auto after = client_->KeepAlive(revoked->id);
  EXPECT_EQ(after.status().code(), StatusCode::kNotFound) << after.status();
  EXPECT_EQ(client_->RevokeLease(revoked->id).code(), StatusCode::kNotFound);
  EXPECT_EQ(client_->GrantLease(milliseconds(0)).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(EtcdClientTest, TtlBelowOneSecondRoundsUp) {
  auto lease = client_->GrantLease(milliseconds(2500));
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->ttl, seconds(3));
}

TEST_F(EtcdClientTest, FailsOverPastADeadFirstEndpoint) {
  auto client = NewClient({DeadEndpoint(), etcd_->endpoint()});
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Put("/t/failover", "v").ok());
  auto got = client->Get("/t/failover");
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status();
  auto lease = client->GrantLease(seconds(5));
  ASSERT_TRUE(lease.ok()) << lease.status();
  auto ttl = client->KeepAlive(lease->id);
  ASSERT_TRUE(ttl.ok()) << ttl.status();
  auto created = client->PutIfAbsent("/t/failover-leader", "v", lease->id);
  ASSERT_TRUE(created.ok() && *created) << created.status();
  EXPECT_TRUE(client->RevokeLease(lease->id).ok());
}

TEST_F(EtcdClientTest, UnreachableNamesEveryEndpoint) {
  const std::string first = DeadEndpoint();
  const std::string second = DeadEndpoint();
  auto client = NewClient({first, second}, milliseconds(500));
  ASSERT_NE(client, nullptr);
  auto got = client->Get("/t/x");
  ASSERT_EQ(got.status().code(), StatusCode::kUnavailable) << got.status();
  EXPECT_NE(got.status().message().find("unreachable"), std::string::npos) << got.status();
  EXPECT_NE(got.status().message().find(first), std::string::npos) << got.status();
  EXPECT_NE(got.status().message().find(second), std::string::npos) << got.status();
  EXPECT_EQ(client->KeepAlive(42).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(client->GrantLease(seconds(2)).status().code(), StatusCode::kUnavailable);
}

TEST_F(EtcdClientTest, KeepAliveStreamSurvivesARestartAndAPause) {
  auto client = NewClient({etcd_->endpoint()}, milliseconds(500));
  ASSERT_NE(client, nullptr);
  auto lease = client->GrantLease(seconds(30));
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(client->KeepAlive(lease->id).ok());

  ASSERT_TRUE(etcd_->Restart().ok());
  // The stream broke with the restart; the next calls reopen it (the lease survived).
  EXPECT_TRUE(testutil::WaitUntil([&] { return client->KeepAlive(lease->id).ok(); }, seconds(10)));

  etcd_->Pause();
  const auto before = steady_clock::now();
  auto paused = client->KeepAlive(lease->id);
  EXPECT_EQ(paused.status().code(), StatusCode::kUnavailable) << paused.status();
  EXPECT_LT(steady_clock::now() - before, seconds(5));  // bounded by the call timeout
  auto get = client->Get("/t/x");
  EXPECT_EQ(get.status().code(), StatusCode::kUnavailable) << get.status();
  etcd_->Resume();
  EXPECT_TRUE(testutil::WaitUntil([&] { return client->KeepAlive(lease->id).ok(); }, seconds(10)));
}

TEST_F(EtcdClientTest, FindLeader) {
  auto none = FindLeader(*client_, "c1");
  EXPECT_EQ(none.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(none.status().message().find("no leader of cluster c1"), std::string::npos)
      << none.status();

  LeaderRecord record{"10.0.0.7:50051", 1234567890123ull, 9003};
  ASSERT_TRUE(client_->Put(LeaderKey("c1"), EncodeLeaderRecord(record)).ok());
  auto found = FindLeader(*client_, "c1");
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->address, record.address);
  EXPECT_EQ(found->incarnation, record.incarnation);
  EXPECT_EQ(found->http_port, record.http_port);

  ASSERT_TRUE(client_->Put(LeaderKey("c2"), "{not json").ok());
  EXPECT_EQ(FindLeader(*client_, "c2").status().code(), StatusCode::kInternal);
  EXPECT_EQ(FindLeader(*client_, "bad/id").status().code(), StatusCode::kInvalidArgument);
}

TEST(EtcdCreateTest, RefusesBadOptions) {
  EXPECT_EQ(EtcdClient::Create({}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(EtcdClient::Create({{"nocolon"}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(EtcdClient::Create({{"127.0.0.1:2379"}, milliseconds(0)}).status().code(),
            StatusCode::kInvalidArgument);
  // Creating never waits for etcd.
  EXPECT_TRUE(EtcdClient::Create({{"127.0.0.1:1"}}).ok());
}

TEST(EtcdAddressTest, ParsesGoodAddresses) {
  auto one = ParseEtcdAddress("etcd://127.0.0.1:2379/prod");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->endpoints, std::vector<std::string>{"127.0.0.1:2379"});
  EXPECT_EQ(one->cluster_id, "prod");

  auto many = ParseEtcdAddress("etcd://etcd-0.etcd:2379,10.1.2.3:32379,[::1]:2379/a-b_c.9");
  ASSERT_TRUE(many.ok()) << many.status();
  EXPECT_EQ(many->endpoints,
            (std::vector<std::string>{"etcd-0.etcd:2379", "10.1.2.3:32379", "[::1]:2379"}));
  EXPECT_EQ(many->cluster_id, "a-b_c.9");

  EXPECT_TRUE(IsEtcdAddress("etcd://x"));
  EXPECT_FALSE(IsEtcdAddress("127.0.0.1:50051"));
}

TEST(EtcdAddressTest, RefusesBadAddressesSayingWhy) {
  struct Case {
    const char* address;
    const char* says;
  };
  const Case cases[] = {
      {"127.0.0.1:50051", "not an etcd address"},
      {"etcd://", "no cluster id"},
      {"etcd://127.0.0.1:2379", "no cluster id"},
      {"etcd:///prod", "no endpoint"},
      {"etcd://127.0.0.1:2379/", "cluster id is empty"},
      {"etcd://127.0.0.1/prod", "no :PORT"},
      {"etcd://127.0.0.1:0/prod", "outside 1..65535"},
      {"etcd://127.0.0.1:65536/prod", "outside 1..65535"},
      {"etcd://127.0.0.1:http/prod", "not a number"},
      {"etcd://:2379/prod", "host is empty"},
      {"etcd://a b:2379/prod", "outside [A-Za-z0-9._-]"},
      {"etcd://[::1/prod", "lacks its ']'"},
      {"etcd://127.0.0.1:2379,,127.0.0.2:2379/prod", "empty entry"},
      {"etcd://127.0.0.1:2379/prod/extra", "outside [A-Za-z0-9._-]"},
      {"etcd://127.0.0.1:2379/pr od", "outside [A-Za-z0-9._-]"},
  };
  for (const Case& c : cases) {
    auto parsed = ParseEtcdAddress(c.address);
    ASSERT_FALSE(parsed.ok()) << c.address;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << c.address;
    EXPECT_NE(parsed.status().message().find(c.says), std::string::npos)
        << c.address << ": " << parsed.status();
  }
  EXPECT_FALSE(ParseEtcdAddress("etcd://h:1/" + std::string(129, 'c')).ok());
  EXPECT_TRUE(ParseEtcdAddress("etcd://h:1/" + std::string(128, 'c')).ok());
}

TEST(EtcdAddressTest, ParsesEndpointLists) {
  auto plain = ParseEtcdEndpoints("127.0.0.1:2379,http://127.0.0.2:2379/");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(*plain, (std::vector<std::string>{"127.0.0.1:2379", "127.0.0.2:2379"}));
  auto tls = ParseEtcdEndpoints("https://127.0.0.1:2379");
  ASSERT_FALSE(tls.ok());
  EXPECT_NE(tls.status().message().find("TLS"), std::string::npos) << tls.status();
  EXPECT_FALSE(ParseEtcdEndpoints("").ok());
  EXPECT_FALSE(ParseEtcdEndpoints("127.0.0.1:2379,").ok());
}

TEST(EtcdAddressTest, ValidatesClusterIds) {
  EXPECT_TRUE(ValidateClusterId("prod-1.eu_west").ok());
  EXPECT_FALSE(ValidateClusterId("").ok());
  EXPECT_FALSE(ValidateClusterId("a/b").ok());
  EXPECT_FALSE(ValidateClusterId("..").ok());
  EXPECT_FALSE(ValidateClusterId(std::string(129, 'a')).ok());
  EXPECT_FALSE(ValidateClusterId(std::string("a\0b", 3)).ok());
  EXPECT_EQ(LeaderKey("prod"), "/larder/clusters/prod/leader");
}

TEST(LeaderRecordTest, RoundTripsAndRefusesBadRecords) {
  LeaderRecord record{"master-0:50051", 18446744073709551615ull, -1};
  auto decoded = DecodeLeaderRecord(EncodeLeaderRecord(record));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->address, record.address);
  EXPECT_EQ(decoded->incarnation, record.incarnation);
  EXPECT_EQ(decoded->http_port, -1);

  const char* bad[] = {
      "",
      "[]",
      "{",
      R"({"incarnation":1,"http_port":1})",
      R"({"address":"","incarnation":1,"http_port":1})",
      R"({"address":7,"incarnation":1,"http_port":1})",
      R"({"address":"a:1","incarnation":-1,"http_port":1})",
      R"({"address":"a:1","incarnation":1.5,"http_port":1})",
      R"({"address":"a:1","incarnation":1})",
      R"({"address":"a:1","incarnation":1,"http_port":65536})",
      R"({"address":"a:1","incarnation":1,"http_port":-2})",
  };
  for (const char* json : bad) {
    auto parsed = DecodeLeaderRecord(json);
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << json;
  }
  std::string long_address =
      R"({"address":")" + std::string(256, 'a') + R"(","incarnation":1,"http_port":1})";
  EXPECT_FALSE(DecodeLeaderRecord(long_address).ok());
  std::string huge = R"({"address":"a:1","incarnation":1,"http_port":1,"pad":")" +
                     std::string(kMaxLeaderRecordBytes, 'p') + R"("})";
  auto too_big = DecodeLeaderRecord(huge);
  EXPECT_EQ(too_big.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_big.status().message().find("exceeds"), std::string::npos);
}

}  // namespace
}  // namespace larder::etcd
