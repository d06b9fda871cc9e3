// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// StoreClient's scatter-gather, ranged and allocated reads, object info, upserts, soft pins,
// forced and pattern removals, and tenants, against a real larder-master in this process.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "larder/store_client.h"
#include "master/master_server.h"

namespace larder {
namespace {

class StoreClientApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    master::MasterServerOptions server;
    server.listen_host = "127.0.0.1";
    server.port = 0;
    server.http_port = -1;
    auto started = master::MasterServer::Start(server);
    ASSERT_TRUE(started.ok()) << started.status();
    master_ = std::move(*started);
    client_ = Client("");
    ASSERT_NE(client_, nullptr);
    pool_.resize(1 << 20);
    ASSERT_TRUE(client_->RegisterBuffer(pool_.data(), pool_.size()).ok());
  }

  std::unique_ptr<StoreClient> Client(const std::string& tenant) {
    StoreClientOptions options;
    options.master_address = master_->address();
    options.global_segment_size = 16ull << 20;
    options.tenant_id = tenant;
    auto client = StoreClient::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  std::byte* At(size_t offset) { return pool_.data() + offset; }
  std::string Text(size_t offset, size_t n) {
    return std::string(reinterpret_cast<const char*>(At(offset)), n);
  }
  void Fill(size_t offset, size_t n, char c) { std::memset(At(offset), c, n); }
  static std::span<const std::byte> AsBytes(std::string_view s) {
    return std::as_bytes(std::span(s.data(), s.size()));
  }

  std::unique_ptr<master::MasterServer> master_;
  std::unique_ptr<StoreClient> client_;
  std::vector<std::byte> pool_;
};

TEST_F(StoreClientApiTest, SlicesConcatenateOnPutAndScatterOnGet) {
  Fill(0, 100, 'a');
  Fill(4096, 50, 'b');
  Fill(8192, 10, 'c');
  std::vector<std::string> keys = {"s/1"};
  std::vector<std::vector<BufferSlice>> put = {{{At(0), 100}, {At(4096), 50}, {At(8192), 10}}};
  ASSERT_TRUE(client_->BatchPutFromSlices(keys, put)[0].ok());
  auto value = client_->Get("s/1");
  ASSERT_TRUE(value.ok());
  EXPECT_EQ(*value, std::string(100, 'a') + std::string(50, 'b') + std::string(10, 'c'));

  // Read back over two slices that split it unevenly; the second is larger than needed.
  std::vector<std::vector<BufferSlice>> get = {{{At(20000), 120}, {At(30000), 100}}};
  auto read = client_->BatchGetIntoSlices(keys, get);
  ASSERT_TRUE(read[0].ok()) << read[0].status();
  EXPECT_EQ(*read[0], 160u);
  EXPECT_EQ(Text(20000, 120), std::string(100, 'a') + std::string(20, 'b'));
  EXPECT_EQ(Text(30000, 40), std::string(30, 'b') + std::string(10, 'c'));

  // Too small in total, unregistered, a missing key, mismatched lengths.
  std::vector<std::vector<BufferSlice>> small = {{{At(40000), 100}}};
  EXPECT_EQ(client_->BatchGetIntoSlices(keys, small)[0].status().code(),
            StatusCode::kInvalidArgument);
  std::vector<std::byte> outside(200);
  std::vector<std::vector<BufferSlice>> unregistered = {{{outside.data(), 200}}};
  EXPECT_EQ(client_->BatchGetIntoSlices(keys, unregistered)[0].status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(client_->BatchPutFromSlices(std::vector<std::string>{"s/2"}, unregistered)[0].code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(client_->BatchGetIntoSlices(std::vector<std::string>{"s/none"}, get)[0].status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(
      client_->BatchGetIntoSlices(std::vector<std::string>{"s/1", "s/x"}, get)[1].status().code(),
      StatusCode::kInvalidArgument);
}

TEST_F(StoreClientApiTest, RangesReadPartsOfValuesEachWithItsResult) {
  std::string value(1000, '\0');
  std::iota(value.begin(), value.end(), '\0');
  ASSERT_TRUE(client_->Put("r/1", AsBytes(value)).ok());
  std::vector<ObjectRange> ranges = {
      {"r/1", 10, At(0), 20},                            // inside
      {"r/1", 990, At(100), 20},                         // runs past the end
      {"r/none", 0, At(200), 5},                         // missing key
      {"r/1", 500, At(300), 500},                        // up to the last byte
      {"r/1", 0, pool_.data() + pool_.size() - 10, 20},  // outside the registered buffer
  };
  auto results = client_->BatchGetRanges(ranges);
  ASSERT_EQ(results.size(), 5u);
  ASSERT_TRUE(results[0].ok());
  EXPECT_EQ(*results[0], 20u);
  EXPECT_EQ(Text(0, 20), value.substr(10, 20));
  EXPECT_EQ(results[1].status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(results[2].status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(results[3].ok());
  EXPECT_EQ(Text(300, 500), value.substr(500));
  EXPECT_EQ(results[4].status().code(), StatusCode::kFailedPrecondition);
}

TEST_F(StoreClientApiTest, AllocatedReadsAskForMemoryOnceTheSizeIsKnown) {
  ASSERT_TRUE(client_->Put("a/1", AsBytes("hello")).ok());
  std::vector<std::string> keys = {"a/1", "a/none", "a/1"};
  std::vector<std::string> out(keys.size());
  std::vector<uint64_t> asked;
  auto results = client_->BatchGetAllocated(keys, [&](size_t i, uint64_t size) -> Result<void*> {
    asked.push_back(size);
    if (i == 2) return ResourceExhaustedError("no memory for this one");
    out[i].resize(size);
    return static_cast<void*>(out[i].data());
  });
  ASSERT_TRUE(results[0].ok());
  EXPECT_EQ(out[0], "hello");
  EXPECT_EQ(results[1].status().code(), StatusCode::kNotFound);
  EXPECT_EQ(results[2].status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(asked, (std::vector<uint64_t>{5, 5}));
}

TEST_F(StoreClientApiTest, ObjectInfoNamesTheSegmentAndAddress) {
  ASSERT_TRUE(client_->Put("i/1", AsBytes("0123456789")).ok());
  auto infos = client_->BatchGetObjectInfo(std::vector<std::string>{"i/1", "i/none"});
  ASSERT_TRUE(infos[0].ok()) << infos[0].status();
  EXPECT_EQ(infos[0]->size, 10u);
  ASSERT_EQ(infos[0]->replicas.size(), 1u);
  const ReplicaInfo& replica = infos[0]->replicas[0];
  EXPECT_EQ(replica.segment_name, client_->segment_name());
  EXPECT_EQ(replica.endpoint, client_->segment_name());  // "ip:port" of its data server
  // The address is in the owner's (here: this process's) segment memory: the bytes are there.
  EXPECT_EQ(std::memcmp(reinterpret_cast<const void*>(replica.address), "0123456789", 10), 0);
  EXPECT_EQ(infos[1].status().code(), StatusCode::kNotFound);
}

TEST_F(StoreClientApiTest, OverwriteReplacesAndPutLeavesAlone) {
  ASSERT_TRUE(client_->Put("o/1", AsBytes("first")).ok());
  ASSERT_TRUE(client_->Put("o/1", AsBytes("second")).ok());
  EXPECT_EQ(*client_->Get("o/1"), "first");
  PutConfig upsert;
  upsert.overwrite = true;
  ASSERT_TRUE(client_->Put("o/1", AsBytes("a longer third value"), upsert).ok());
  EXPECT_EQ(*client_->Get("o/1"), "a longer third value");
  ASSERT_TRUE(client_->Put("o/new", AsBytes("n"), upsert).ok());
  EXPECT_EQ(*client_->Get("o/new"), "n");
}

TEST_F(StoreClientApiTest, SoftPinRequestsAreCheckedByTheMaster) {
  PutConfig ttl_without_enable;
  ttl_without_enable.soft_pin_ttl = std::chrono::milliseconds(1000);
  EXPECT_EQ(client_->Put("p/1", AsBytes("v"), ttl_without_enable).code(),
            StatusCode::kInvalidArgument);
  PutConfig enable = ttl_without_enable;
  enable.soft_pin_action = SoftPinAction::kEnable;
  EXPECT_TRUE(client_->Put("p/1", AsBytes("v"), enable).ok());
  enable.soft_pin_ttl = std::chrono::hours(24 * 365);
  EXPECT_EQ(client_->Put("p/2", AsBytes("v"), enable).code(), StatusCode::kInvalidArgument);
}

TEST_F(StoreClientApiTest, RemovalsByForceAndPattern) {
  for (const char* key : {"x/1", "x/2", "x/3", "y/1"}) {
    ASSERT_TRUE(client_->Put(key, AsBytes("v")).ok());
  }
  // A read finished just now: its lease is released before the next call needs the key.
  ASSERT_TRUE(client_->Get("x/1").ok());
  auto removed = client_->RemoveByRegex("x/[12]");
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 2u);
  EXPECT_EQ(client_->RemoveByRegex("(unclosed").status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(client_->Remove("x/3", /*force=*/true).ok());
  EXPECT_EQ(client_->Remove("x/3", true).code(), StatusCode::kNotFound);
  auto all = client_->RemoveAll(/*force=*/true);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, 1u);
}

TEST_F(StoreClientApiTest, TenantsAreNamespaces) {
  auto a = Client("tenant-a");
  auto b = Client("tenant-b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(a->Put("k", AsBytes("A")).ok());
  ASSERT_TRUE(b->Put("k", AsBytes("B")).ok());
  ASSERT_TRUE(client_->Put("k", AsBytes("D")).ok());
  // A default-tenant key that spells another tenant's prefix stays the default tenant's.
  const std::string spoof = std::string("\0tenant-a\0k", 11);
  ASSERT_TRUE(client_->Put(spoof, AsBytes("S")).ok());
  EXPECT_EQ(*a->Get("k"), "A");
  EXPECT_EQ(*b->Get("k"), "B");
  EXPECT_EQ(*client_->Get("k"), "D");
  EXPECT_EQ(*client_->Get(spoof), "S");
  EXPECT_EQ(*a->RemoveAll(), 1u);
  EXPECT_EQ(a->Get("k").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(*b->Get("k"), "B");
  EXPECT_EQ(*b->RemoveByRegex(".*"), 1u);
  EXPECT_EQ(*client_->RemoveAll(), 2u);  // "k" and the spoof: its own two
  StoreClientOptions bad;
  bad.master_address = master_->address();
  bad.tenant_id = std::string("a\0b", 3);
  EXPECT_EQ(StoreClient::Create(bad).status().code(), StatusCode::kInvalidArgument);
  bad.tenant_id = std::string(129, 't');
  EXPECT_EQ(StoreClient::Create(bad).status().code(), StatusCode::kInvalidArgument);
}

// A master address without a port is refused with what to write, not dialed (gRPC alone would
// dial port 443 and the call would wait out its whole deadline, then say Unavailable).
TEST(StoreClientAddressTest, AMasterAddressWithoutAPortIsRefusedSayingWhatToWrite) {
  for (const char* address :
       {"127.0.0.1", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:70000", "localhost:http", ":50051"}) {
    StoreClientOptions options;
    options.master_address = address;
    auto created = StoreClient::Create(options);
    ASSERT_FALSE(created.ok()) << address;
    EXPECT_EQ(created.status().code(), StatusCode::kInvalidArgument) << created.status();
    EXPECT_NE(created.status().message().find("needs a port"), std::string::npos)
        << created.status();
  }
}

}  // namespace
}  // namespace larder
