// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Traffic classes (TrafficClass): which class an engine's batches take, and that work of one class
// or deadline is not served behind queued work it should overtake.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "larder/transfer_engine.h"
#include "transfer/testing/engine_fixture.h"
#include "transfer/testing/test_util.h"

namespace larder {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testutil::CreateEngine;
using testutil::FillPattern;
using testutil::ScopedEnv;
using testutil::WithProtocol;

class TrafficClassTest : public ::testing::Test {
 protected:
  ScopedEnv class_{"LARDER_TRAFFIC_CLASS", std::nullopt};
};

TEST_F(TrafficClassTest, PdEnginesAreLatencyStoreEnginesBulkAndBothCanBeSet) {
  TransferEngineOptions pd = WithProtocol("tcp");
  TransferEngineOptions store = WithProtocol("tcp");
  store.role = EngineRole::kStore;
  EXPECT_EQ(CreateEngine(pd)->traffic_class(), TrafficClass::kLatency);
  EXPECT_EQ(CreateEngine(store)->traffic_class(), TrafficClass::kBulk);
  {
    ScopedEnv env("LARDER_TRAFFIC_CLASS", "bulk");
    EXPECT_EQ(CreateEngine(pd)->traffic_class(), TrafficClass::kBulk);
    pd.traffic_class = TrafficClass::kLatency;  // the option wins over the variable
    EXPECT_EQ(CreateEngine(pd)->traffic_class(), TrafficClass::kLatency);
  }
  ScopedEnv bad("LARDER_TRAFFIC_CLASS", "urgent");
  auto refused = TransferEngine::Create(store);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("LARDER_TRAFFIC_CLASS"), std::string::npos)
      << refused.status();
}

// The store's bulk writes fill every connection to a peer and queue far beyond; a read submitted
// behind them with `read_class` and `read_timeout` must complete while most of them still wait
// (served after the queue, it would find nearly all written).
void ExpectReadOvertakesQueuedBulkWrites(TrafficClass read_class, milliseconds read_timeout) {
  constexpr uint64_t kSlot = 1ULL << 20;
  constexpr int kSlots = 256;
  constexpr auto kBulkTimeout = seconds(120);
  auto target = CreateEngine(WithProtocol("tcp"));
  ASSERT_TRUE(target);
  auto memory = target->AllocateSegmentMemory((kSlots + 1) * kSlot);
  ASSERT_TRUE(memory.ok()) << memory.status();
  ASSERT_TRUE(target->RegisterSegment("kv", *memory).ok());
  auto* bytes = static_cast<uint8_t*>((*memory)->data());
  FillPattern(bytes, 64 * 1024, 5);

  TransferEngineOptions store = WithProtocol("tcp");
  store.role = EngineRole::kStore;
  auto engine = CreateEngine(store);
  ASSERT_TRUE(engine);
  auto handle = engine->OpenSegment(target->address(), "kv");
  ASSERT_TRUE(handle.ok()) << handle.status();
  std::vector<uint8_t> source(kSlot, 0x5a);
  std::vector<TransferRequest> bulk;
  for (int i = 1; i <= kSlots; ++i) {
    bulk.push_back({TransferOp::kWrite, source.data(), *handle, i * kSlot, kSlot});
  }
  auto written = [&] {
    int n = 0;
    for (int i = 1; i <= kSlots; ++i) {
      n += std::atomic_ref<uint8_t>(bytes[i * kSlot + kSlot - 1]).load() == 0x5a;
    }
    return n;
  };
  auto bulk_batch = engine->Submit(bulk, kBulkTimeout);
  ASSERT_TRUE(bulk_batch.ok()) << bulk_batch.status();

  std::vector<uint8_t> page(64 * 1024, 0);
  TransferRequest read{TransferOp::kRead, page.data(), *handle, 0, page.size()};
  auto read_batch = engine->Submit({&read, 1}, read_timeout, read_class);
  ASSERT_TRUE(read_batch.ok()) << read_batch.status();
  ASSERT_TRUE(engine->Wait(*read_batch, kBulkTimeout).ok());
  EXPECT_LT(written(), kSlots / 2) << "the read waited behind the bulk writes queued before it";
  EXPECT_TRUE(engine->BatchStatus(*read_batch).ok()) << engine->BatchStatus(*read_batch);
  EXPECT_EQ(std::memcmp(page.data(), bytes, page.size()), 0);
  ASSERT_TRUE(engine->Release(*read_batch).ok());

  ASSERT_TRUE(engine->Wait(*bulk_batch, kBulkTimeout).ok());
  EXPECT_TRUE(engine->BatchStatus(*bulk_batch).ok()) << engine->BatchStatus(*bulk_batch);
  ASSERT_TRUE(engine->Release(*bulk_batch).ok());
  EXPECT_EQ(written(), kSlots);
}

// A latency read goes on connections of its own, whatever its deadline.
TEST_F(TrafficClassTest, ALatencyReadOvertakesQueuedBulkWritesOverTcp) {
  ExpectReadOvertakesQueuedBulkWrites(TrafficClass::kLatency, seconds(600));
}

// Within a class, queued work is served earliest deadline first.
TEST_F(TrafficClassTest, AnEarlierDeadlineOvertakesQueuedBulkWritesOverTcp) {
  ExpectReadOvertakesQueuedBulkWrites(TrafficClass::kBulk, seconds(30));
}

}  // namespace
}  // namespace larder
