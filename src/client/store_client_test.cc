// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// StoreClient against a real larder-master (gRPC, in this process), within one process: the API
// contract, error paths, leases, and the store on the device protocol next to a PD engine on
// another protocol.
#include "larder/store_client.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "common/memory.h"
#include "master/master_server.h"
#include "transfer/device/emulated_device.h"
#include "transfer/testing/test_util.h"

namespace larder {
namespace {

using std::chrono::milliseconds;

class StoreClientTest : public ::testing::Test {
 protected:
  void StartMaster(master::MasterOptions options = {}) {
    master::MasterServerOptions server;
    server.listen_host = "127.0.0.1";
    server.port = 0;
    server.http_port = -1;
    server.master = std::move(options);
    auto started = master::MasterServer::Start(server);
    ASSERT_TRUE(started.ok()) << started.status();
    master_ = std::move(*started);
  }

  std::unique_ptr<StoreClient> Client(uint64_t segment_size = 64ull << 20,
                                      const std::string& protocol = "") {
    StoreClientOptions options;
    options.master_address = master_->address();
    options.global_segment_size = segment_size;
    options.protocol = protocol;
    auto client = StoreClient::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  static std::vector<std::byte> Bytes(size_t n, uint8_t seed) {
    std::vector<std::byte> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = std::byte(static_cast<uint8_t>(seed + i * 7));
    return v;
  }

  std::unique_ptr<master::MasterServer> master_;
};

TEST_F(StoreClientTest, CopyingApiRoundTripsAndObjectsAreImmutable) {
  StartMaster();
  auto client = Client();
  ASSERT_NE(client, nullptr);
  auto value = Bytes(100000, 1);
  ASSERT_TRUE(client->Put("k", value).ok());
  auto got = client->Get("k");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), value.size());
  EXPECT_EQ(std::memcmp(got->data(), value.data(), value.size()), 0);
  // A second put of the key succeeds and does not rewrite it.
  ASSERT_TRUE(client->Put("k", Bytes(10, 9)).ok());
  EXPECT_EQ(client->Get("k")->size(), value.size());
  EXPECT_EQ(*client->GetSize("k"), value.size());
  EXPECT_TRUE(*client->Exist("k"));
  EXPECT_FALSE(*client->Exist("other"));
  EXPECT_EQ(client->Get("other").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(client->Remove("other").code(), StatusCode::kNotFound);
  EXPECT_EQ(client->Put("", value).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client->Put("empty", {}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*client->RouteTo(client->segment_name()), RouteKind::kLocal);
}

TEST_F(StoreClientTest, BatchesKeepPerKeyResults) {
  StartMaster();
  auto client = Client();
  std::vector<std::string> keys = {"a", "b", "c"};
  auto va = Bytes(4096, 1), vb = Bytes(8192, 2), vc = Bytes(1, 3);
  std::vector<std::span<const std::byte>> values = {va, vb, vc};
  for (const Status& status : client->BatchPut(keys, values)) EXPECT_TRUE(status.ok()) << status;
  std::vector<std::string> wanted = {"c", "missing", "a"};
  auto got = client->BatchGet(wanted);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0]->size(), 1u);
  EXPECT_EQ(got[1].status().code(), StatusCode::kNotFound);
  EXPECT_EQ(std::memcmp(got[2]->data(), va.data(), va.size()), 0);
  auto exist = client->BatchExist(wanted);
  EXPECT_TRUE(*exist[0]);
  EXPECT_FALSE(*exist[1]);
  auto removed = client->BatchRemove(std::vector<std::string>{"b", "missing"});
  EXPECT_TRUE(removed[0].ok());
  EXPECT_EQ(removed[1].code(), StatusCode::kNotFound);
  // Mismatched lengths are refused, not read past.
  std::vector<std::span<const std::byte>> one = {va};
  for (const Status& status : client->BatchPut(keys, one)) {
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  }
}

TEST_F(StoreClientTest, ZeroCopyNeedsRegisteredBuffers) {
  StartMaster();
  auto client = Client();
  std::vector<std::byte> pool(1 << 20);
  auto value = Bytes(65536, 5);
  std::memcpy(pool.data(), value.data(), value.size());
  EXPECT_EQ(client->PutFrom("z", pool.data(), value.size()).code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(client->RegisterBuffer(pool.data(), pool.size()).ok());
  EXPECT_EQ(client->RegisterBuffer(pool.data() + 100, 10).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(client->PutFrom("z", pool.data(), value.size()).ok());
  auto n = client->GetInto("z", pool.data() + 65536, 65536);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 65536u);
  EXPECT_EQ(std::memcmp(pool.data() + 65536, value.data(), value.size()), 0);
  EXPECT_EQ(client->GetInto("z", pool.data(), 100).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client->GetInto("z", pool.data() + (1 << 20) - 10, 65536).status().code(),
            StatusCode::kFailedPrecondition);  // runs past the registered buffer
  ASSERT_TRUE(client->UnregisterBuffer(pool.data()).ok());
  EXPECT_EQ(client->UnregisterBuffer(pool.data()).code(), StatusCode::kNotFound);
}

TEST_F(StoreClientTest, GetWhoseLeaseRunsOutMidCopyFailsRetryably) {
  master::MasterOptions options;
  options.lease_ttl = milliseconds(1);
  StartMaster(options);
  auto client = Client(128ull << 20);
  auto big = Bytes(32 << 20, 3);
  ASSERT_TRUE(client->Put("big", big).ok());
  auto got = client->Get("big");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(got.status().message().find("lease expired"), std::string::npos) << got.status();
}

TEST_F(StoreClientTest, MasterDownGivesUnavailable) {
  StartMaster();
  auto client = Client();
  master_->Shutdown();
  EXPECT_EQ(client->Put("k", Bytes(10, 1)).code(), StatusCode::kUnavailable);
  EXPECT_EQ(client->Get("k").status().code(), StatusCode::kUnavailable);
  StoreClientOptions options;
  options.master_address = "127.0.0.1:1";
  options.rpc_timeout = milliseconds(500);
  options.master_connect_timeout = milliseconds(300);
  auto created = StoreClient::Create(options);
  EXPECT_EQ(created.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(created.status().message().find("no larder-master answered within 300 ms"),
            std::string::npos)
      << created.status();
}

// A segment the host cannot fill is a mistake the client names at once, not a process the kernel
// kills once the store has filled its memory.
TEST_F(StoreClientTest, SegmentLargerThanTheHostsMemoryIsRefusedUnlessSparse) {
  StartMaster();
  const uint64_t memory = HostMemoryBytes();
  ASSERT_GT(memory, 0u);
  StoreClientOptions options;
  options.master_address = master_->address();
  options.global_segment_size = RoundUp(memory + (1ull << 30), 1ull << 30);
  auto refused = StoreClient::Create(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("larger than the memory this process can fill"),
            std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("LARDER_SPARSE_SEGMENT=1"), std::string::npos);
  // Said on purpose, it is a sparse segment: only what is written costs memory.
  options.sparse_segment = true;
  auto sparse = StoreClient::Create(options);
  ASSERT_TRUE(sparse.ok()) << sparse.status();
  EXPECT_TRUE((*sparse)->Put("k", Bytes(4096, 3)).ok());
  {
    testutil::ScopedEnv env("LARDER_SPARSE_SEGMENT", "1");
    auto from_env = StoreClientOptions::FromEnvironment();
    ASSERT_TRUE(from_env.ok());
    EXPECT_TRUE(from_env->sparse_segment);
  }
  testutil::ScopedEnv bad("LARDER_SPARSE_SEGMENT", "yes");
  EXPECT_EQ(StoreClientOptions::FromEnvironment().status().code(), StatusCode::kInvalidArgument);
}

// A serving process started a moment before its master (as orchestrators start them) waits for
// it instead of failing.
TEST_F(StoreClientTest, CreationWaitsForAMasterStartedAfterIt) {
  StartMaster();
  const uint16_t port = master_->port();
  master_->Shutdown();
  master_.reset();
  Result<std::unique_ptr<StoreClient>> created = UnavailableError("not created yet");
  std::thread creator([&] {
    StoreClientOptions options;
    options.master_address = "127.0.0.1:" + std::to_string(port);
    options.global_segment_size = 16ull << 20;
    options.master_connect_timeout = milliseconds(30000);
    created = StoreClient::Create(options);
  });
  master::MasterServerOptions server;
  server.listen_host = "127.0.0.1";
  server.port = port;
  server.http_port = -1;
  auto started = master::MasterServer::Start(server);
  creator.join();
  ASSERT_TRUE(started.ok()) << started.status();
  ASSERT_TRUE(created.ok()) << created.status();
  auto value = Bytes(1000, 3);
  ASSERT_TRUE((*created)->Put("k", value).ok());
  auto got = (*created)->Get("k");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size(), value.size());
}

// A master restarted in place rebuilds the objects from the client's catalog: they stay readable,
// byte for byte, and the catalog is current again afterwards.
TEST_F(StoreClientTest, MasterRestartKeepsTheObjectsInTheCatalog) {
  StartMaster();
  const uint16_t port = master_->port();
  auto client = Client();
  ASSERT_NE(client, nullptr);
  constexpr int kObjects = 50;
  for (int i = 0; i < kObjects; ++i) {
    ASSERT_TRUE(client->Put("k" + std::to_string(i), Bytes(3000 + i, uint8_t(i))).ok());
  }
  testutil::WaitUntil([&] { return client->CatalogSize() >= kObjects; }, milliseconds(20000));
  ASSERT_EQ(client->CatalogSize(), uint64_t{kObjects});
  const uint64_t old_incarnation = master_->state().incarnation();
  master_->Shutdown();
  master_.reset();

  master::MasterServerOptions server;
  server.listen_host = "127.0.0.1";
  server.port = port;
  server.http_port = -1;
  auto restarted = master::MasterServer::Start(server);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  master_ = std::move(*restarted);
  ASSERT_NE(master_->state().incarnation(), old_incarnation);
  int readable = 0;
  for (int i = 0; i < kObjects; ++i) {
    Result<std::string> got = UnavailableError("not read yet");
    testutil::WaitUntil(
        [&] {
          got = client->Get("k" + std::to_string(i));
          return got.status().code() != StatusCode::kUnavailable;
        },
        milliseconds(30000));
    ASSERT_TRUE(got.ok()) << got.status();
    auto expected = Bytes(3000 + i, uint8_t(i));
    EXPECT_EQ(std::memcmp(got->data(), expected.data(), expected.size()), 0) << i;
    EXPECT_EQ(got->size(), expected.size());
    ++readable;
  }
  EXPECT_EQ(readable, kObjects);
  EXPECT_EQ(master_->state().Stats().objects, uint64_t{kObjects});
  // The new master's feed brings the catalog back to what it holds.
  testutil::WaitUntil([&] { return client->CatalogSize() == kObjects; }, milliseconds(20000));
  EXPECT_EQ(client->CatalogSize(), uint64_t{kObjects});
  ASSERT_TRUE(client->Remove("k0").ok());
  testutil::WaitUntil([&] { return client->CatalogSize() == kObjects - 1; }, milliseconds(20000));
  EXPECT_EQ(client->CatalogSize(), uint64_t{kObjects - 1});
}

// The store on the device protocol (its segment in emulated device memory, allocated by the
// device transport) beside a PD engine on shm/tcp: each role keeps its own transports.
TEST_F(StoreClientTest, StoreOnDeviceProtocolBesidePdEngineOnAnother) {
  testutil::ScopedEnv store_protocol("LARDER_STORE_PROTOCOL", "device");
  testutil::ScopedEnv pd_protocol("LARDER_PROTOCOL", "shm,tcp");
  // The device transport initializes on the caller's current device, as with a real GPU.
  transfer::EmulatedDevice device;
  ASSERT_TRUE(device.SetCurrentDevice(0).ok());
  StartMaster();
  auto client = Client(16ull << 20);
  ASSERT_NE(client, nullptr);
  auto segments = client->engine().ListSegments();
  ASSERT_EQ(segments.size(), 1u);
  EXPECT_EQ(segments[0].memory_kind, MemoryKind::kDevice);
  EXPECT_EQ(client->engine().routes(), std::vector<RouteKind>{RouteKind::kDevice});
  auto value = Bytes(3 << 20, 7);  // crosses 2 MiB registration boundaries
  ASSERT_TRUE(client->Put("dev", value).ok());
  auto got = client->Get("dev");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(std::memcmp(got->data(), value.data(), value.size()), 0);
  EXPECT_EQ(*client->RouteTo(client->segment_name()), RouteKind::kDevice);

  // The PD engine in the same process resolves LARDER_PROTOCOL, not the store's setting.
  auto pd = TransferEngine::Create(TransferEngineOptions{});
  ASSERT_TRUE(pd.ok()) << pd.status();
  auto routes = (*pd)->routes();
  EXPECT_EQ(std::count(routes.begin(), routes.end(), RouteKind::kDevice), 0);
  EXPECT_NE(std::count(routes.begin(), routes.end(), RouteKind::kTcp), 0);
  auto peer = TransferEngine::Create(TransferEngineOptions{});
  ASSERT_TRUE(peer.ok());
  auto memory = (*peer)->AllocateSegmentMemory(1 << 20);
  ASSERT_TRUE(memory.ok());
  ASSERT_TRUE((*peer)->RegisterSegment("pd", *memory).ok());
  auto handle = (*pd)->OpenSegment((*peer)->address(), "pd");
  ASSERT_TRUE(handle.ok()) << handle.status();
  std::vector<std::byte> out = Bytes(1 << 20, 2), in(1 << 20);
  TransferRequest write{TransferOp::kWrite, out.data(), *handle, 0, out.size()};
  TransferRequest read{TransferOp::kRead, in.data(), *handle, 0, in.size()};
  ASSERT_TRUE((*pd)->TransferSync(std::span(&write, 1)).ok());
  auto results = (*pd)->TransferSync(std::span(&read, 1));
  ASSERT_TRUE(results.ok());
  EXPECT_TRUE((*results)[0].status.ok());
  EXPECT_NE((*results)[0].route, RouteKind::kDevice);
  EXPECT_EQ(in, out);
  device.SetCurrentDevice(-1).IgnoreError();
}

// Store clients of two hosts on LARDER_STORE_PROTOCOL=device,tcp: each segment is device memory,
// and a get or put across the hosts goes over tcp through pinned staging on both ends
// ("tcp-staged"), into host buffers and into registered device buffers alike.
TEST_F(StoreClientTest, DeviceSegmentsOfAnotherHostOverTcpStaged) {
  testutil::ScopedEnv store_protocol("LARDER_STORE_PROTOCOL", "device,tcp");
  transfer::EmulatedDevice device;
  ASSERT_TRUE(device.SetCurrentDevice(0).ok());
  StartMaster();
  auto make = [&](const std::string& host) {
    StoreClientOptions options;
    options.master_address = master_->address();
    options.global_segment_size = 16ull << 20;
    options.host_id = host;
    options.segment_name = "seg-" + host;
    options.local_hostname = "127.0.0.1";
    auto client = StoreClient::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  };
  auto a = make("host-a");
  auto b = make("host-b");
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->engine().ListSegments().at(0).memory_kind, MemoryKind::kDevice);
  // A put into A's segment from B, a get of it from B: both cross the hosts.
  PutConfig on_a;
  on_a.preferred_segments = {"seg-host-a"};
  auto value = Bytes(3 << 20, 9);
  ASSERT_TRUE(b->Put("cross", value, on_a).ok());
  auto got = b->Get("cross");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), value.size());
  EXPECT_EQ(std::memcmp(got->data(), value.data(), value.size()), 0);
  EXPECT_EQ(*b->RouteTo("seg-host-a"), RouteKind("tcp-staged"));
  // Into a device buffer of B's registered with the store: staged on B's side too.
  auto buffer = b->engine().AllocateSegmentMemory(4 << 20);
  ASSERT_TRUE(buffer.ok());
  ASSERT_EQ((*buffer)->kind(), MemoryKind::kDevice);
  Status registered = b->RegisterBuffer((*buffer)->data(), (*buffer)->size());
  ASSERT_TRUE(registered.ok()) << registered;
  auto read = b->GetInto("cross", (*buffer)->data(), (*buffer)->size());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, value.size());
  EXPECT_EQ(std::memcmp((*buffer)->data(), value.data(), value.size()), 0);
  EngineStats stats = b->engine().Stats();
  EXPECT_GE(stats.ByRoute(RouteKind("tcp-staged")).bytes, 3 * value.size());
  EXPECT_GT(stats.staged_to_device_bytes, 0u);
  EXPECT_GT(a->engine().Stats().staged_to_host_bytes, 0u);
  EXPECT_TRUE(b->UnregisterBuffer((*buffer)->data()).ok());
  device.SetCurrentDevice(-1).IgnoreError();
}

}  // namespace
}  // namespace larder
