// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The LSC1 codec against good, truncated, oversized and random payloads, and the socket address
// forms.
#include "standalone/protocol.h"

#include <gtest/gtest.h>

#include <random>

#include "standalone/frame_io.h"

namespace larder::standalone {
namespace {

PutConfig SampleConfig() {
  PutConfig config;
  config.replica_num = 2;
  config.preferred_segments = {"a:1", "b:2"};
  config.pin = true;
  config.soft_pin_action = SoftPinAction::kEnable;
  config.soft_pin_ttl = std::chrono::milliseconds(1500);
  config.overwrite = true;
  return config;
}

std::string EncodedPut() {
  PayloadWriter out;
  out.PutConfig(SampleConfig());
  std::vector<KeyedBuffer> items = {{"k1", {0x1000, 10}}, {std::string("k\0two", 5), {0x2000, 7}}};
  EncodeKeyedBuffers(items, &out);
  return out.Take();
}

TEST(WireTest, PutFromRoundTrips) {
  std::string payload = EncodedPut();
  PayloadReader in(payload);
  PutConfig config = in.PutConfig();
  std::vector<KeyedBuffer> items = DecodeKeyedBuffers(&in);
  ASSERT_TRUE(in.Finish().ok()) << in.Finish();
  EXPECT_EQ(config.replica_num, 2u);
  EXPECT_EQ(config.preferred_segments, (std::vector<std::string>{"a:1", "b:2"}));
  EXPECT_TRUE(config.pin);
  EXPECT_EQ(config.soft_pin_action, SoftPinAction::kEnable);
  ASSERT_TRUE(config.soft_pin_ttl.has_value());
  EXPECT_EQ(config.soft_pin_ttl->count(), 1500);
  EXPECT_TRUE(config.overwrite);
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[1].key, std::string("k\0two", 5));
  EXPECT_EQ(items[1].buffer.address, 0x2000u);
  EXPECT_EQ(items[1].buffer.size, 7u);
}

TEST(WireTest, EveryTruncationIsMalformed) {
  std::string payload = EncodedPut();
  for (size_t n = 0; n < payload.size(); ++n) {
    PayloadReader in(std::string_view(payload).substr(0, n));
    in.PutConfig();
    DecodeKeyedBuffers(&in);
    EXPECT_EQ(in.Finish().code(), StatusCode::kInvalidArgument) << "prefix of " << n << " bytes";
  }
  const std::string longer = payload + "x";
  PayloadReader trailing(longer);
  trailing.PutConfig();
  DecodeKeyedBuffers(&trailing);
  EXPECT_NE(trailing.Finish().message().find("trailing"), std::string::npos);
}

TEST(WireTest, CountsCannotPromiseMoreThanTheBytesHold) {
  PayloadWriter out;
  out.U32(kMaxBatchKeys);  // 65536 keys in 8 bytes
  out.U64(0);
  PayloadReader in(out.data());
  std::vector<std::string> keys = in.Keys();
  EXPECT_TRUE(keys.empty());
  EXPECT_NE(in.Finish().message().find("cannot fit"), std::string::npos) << in.Finish();

  PayloadWriter many;
  many.U32(kMaxBatchKeys + 1);
  PayloadReader over(many.data());
  over.Keys();
  EXPECT_NE(over.Finish().message().find("split the batch"), std::string::npos) << over.Finish();
}

TEST(WireTest, OversizedStringsAndBadEnumsAreRefused) {
  {
    PayloadWriter out;
    out.U32(1);
    out.U32(kMaxKeyBytes + 1);  // the length alone; no bytes follow
    PayloadReader in(out.data());
    in.Keys();
    EXPECT_NE(in.Finish().message().find("exceeds the limit"), std::string::npos) << in.Finish();
  }
  {
    PutConfig config;
    PayloadWriter out;
    out.PutConfig(config);
    std::string bytes = out.Take();
    bytes[4 + 4 + 1] = 7;  // soft pin action after replica_num, count, pin
    PayloadReader in(bytes);
    in.PutConfig();
    EXPECT_NE(in.Finish().message().find("soft pin action"), std::string::npos) << in.Finish();
  }
  {
    PayloadWriter out;
    out.U8(200);  // no such status code
    PayloadReader in(out.data());
    Status status = in.GetStatus();
    EXPECT_TRUE(status.ok());
    EXPECT_FALSE(in.Finish().ok());
  }
}

TEST(WireTest, StatusDetailRoundTripsAndAnUnknownOneReadsAsNone) {
  PayloadWriter out;
  out.PutStatus(UnavailableError("key 'k' is leased").WithDetail(ErrorDetail::kLeased));
  out.PutStatus(FailedPreconditionError("gone").WithDetail(ErrorDetail::kRemountRequired));
  out.PutStatus(NotFoundError("plain"));
  PayloadReader in(out.data());
  Status leased = in.GetStatus();
  EXPECT_EQ(leased.code(), StatusCode::kUnavailable);
  EXPECT_EQ(leased.detail(), ErrorDetail::kLeased);
  EXPECT_EQ(leased.message(), "key 'k' is leased");
  EXPECT_EQ(in.GetStatus().detail(), ErrorDetail::kRemountRequired);
  EXPECT_EQ(in.GetStatus().detail(), ErrorDetail::kNone);
  EXPECT_TRUE(in.Finish().ok()) << in.Finish();

  PayloadWriter future;
  future.PutStatus(UnavailableError("x"));
  std::string bytes = future.Take();
  bytes.back() = static_cast<char>(200);  // a detail from a newer build
  PayloadReader read(bytes);
  Status status = read.GetStatus();
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(status.detail(), ErrorDetail::kNone);
  EXPECT_TRUE(read.Finish().ok());
}

TEST(WireTest, RepliesRoundTrip) {
  PayloadWriter out;
  std::vector<Result<size_t>> sizes = {size_t{5}, NotFoundError("gone"), size_t{0}};
  EncodeSizes(sizes, &out);
  ObjectInfo info;
  info.size = 9;
  info.replicas.push_back(ReplicaInfo{"seg", 64, 0x7000, "127.0.0.1:9"});
  std::vector<Result<ObjectInfo>> infos = {info, UnavailableError("writing")};
  EncodeObjectInfos(infos, &out);
  std::vector<StagedItem> staged(3);
  staged[0] = StagedItem{StagedItem::kPlaced, Status(), 10, 64};
  staged[1] = StagedItem{StagedItem::kFailed, InvalidArgumentError("too big"), 0, 0};
  staged[2] = StagedItem{StagedItem::kDeferred, Status(), 0, 0};
  EncodeStagedItems(staged, &out);

  PayloadReader in(out.data());
  auto got_sizes = DecodeSizes(&in, 3);
  auto got_infos = DecodeObjectInfos(&in, 2);
  auto got_staged = DecodeStagedItems(&in, 3);
  ASSERT_TRUE(in.Finish().ok()) << in.Finish();
  EXPECT_EQ(*got_sizes[0], 5u);
  EXPECT_EQ(got_sizes[1].status().code(), StatusCode::kNotFound);
  EXPECT_EQ(got_sizes[1].status().message(), "gone");
  EXPECT_EQ(got_infos[0]->replicas[0].endpoint, "127.0.0.1:9");
  EXPECT_EQ(got_infos[1].status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(got_staged[0].offset, 64u);
  EXPECT_EQ(got_staged[1].status.message(), "too big");
  EXPECT_EQ(got_staged[2].kind, StagedItem::kDeferred);

  PayloadReader wrong_count(out.data());
  DecodeSizes(&wrong_count, 4);
  EXPECT_FALSE(wrong_count.Finish().ok());
}

// Random payloads through every request and reply decoder: they must fail cleanly (ASan and
// UBSan watch), never crash or allocate what the bytes cannot hold.
TEST(WireTest, RandomPayloadsNeverCrashTheDecoders) {
  std::mt19937_64 rng(42);
  std::string valid = EncodedPut();
  for (int round = 0; round < 20000; ++round) {
    std::string bytes;
    if (round % 2 == 0) {
      bytes.resize(rng() % 96);
      for (char& c : bytes) c = static_cast<char>(rng());
    } else {
      bytes = valid;  // a valid payload with a few bytes changed
      for (int flips = 0; flips < 3; ++flips)
        bytes[rng() % bytes.size()] = static_cast<char>(rng());
    }
    auto run = [&](auto decode) {
      PayloadReader in(bytes);
      decode(&in);
      in.Finish().IgnoreError();
    };
    run([](PayloadReader* in) { DecodeHelloRequest(in); });
    run([](PayloadReader* in) { DecodeHelloReply(in); });
    run([](PayloadReader* in) { DecodeRegisterShared(in); });
    run([](PayloadReader* in) {
      in->PutConfig();
      DecodeKeyedBuffers(in);
    });
    run([](PayloadReader* in) {
      in->PutConfig();
      DecodeSlicedKeys(in);
    });
    run([](PayloadReader* in) { DecodeRanges(in); });
    run([](PayloadReader* in) { DecodeStagedGet(in); });
    run([](PayloadReader* in) { in->Keys(); });
    run([](PayloadReader* in) { DecodeStatuses(in, 3); });
    run([](PayloadReader* in) { DecodeSizes(in, 2); });
    run([](PayloadReader* in) { DecodeBools(in, 2); });
    run([](PayloadReader* in) { DecodeObjectInfos(in, 1); });
    run([](PayloadReader* in) { DecodeStagedItems(in, 2); });
  }
}

TEST(FrameTest, HeadersAreChecked) {
  MessageHeader header;
  header.type = static_cast<uint16_t>(MessageType::kHello);
  EXPECT_TRUE(CheckHeader(header, kMaxFrameBytes).ok());
  MessageHeader magic = header;
  magic.magic = 0x12345678;
  EXPECT_NE(CheckHeader(magic, kMaxFrameBytes).message().find("magic"), std::string::npos);
  MessageHeader flags = header;
  flags.flags = 1;
  EXPECT_FALSE(CheckHeader(flags, kMaxFrameBytes).ok());
  MessageHeader big = header;
  big.length = kMaxFrameBytes + 1;
  EXPECT_NE(CheckHeader(big, kMaxFrameBytes).message().find("exceeds the limit"),
            std::string::npos);
  EXPECT_TRUE(IsRequestType(static_cast<uint16_t>(MessageType::kBatchGetObjectInfo)));
  EXPECT_FALSE(IsRequestType(0));
  EXPECT_FALSE(IsRequestType(static_cast<uint16_t>(MessageType::kGoodbye)));
  EXPECT_FALSE(IsRequestType(static_cast<uint16_t>(MessageType::kHello) | kReplyBit));
}

TEST(SocketAddressTest, Forms) {
  auto abstract = ResolveSocketAddress("@larder-client-50052");
  ASSERT_TRUE(abstract.ok());
  EXPECT_TRUE(abstract->abstract);
  EXPECT_EQ(abstract->name, "larder-client-50052");
  EXPECT_EQ(abstract->display, "@larder-client-50052");

  auto mooncake = ResolveSocketAddress("127.0.0.1:50052");
  ASSERT_TRUE(mooncake.ok());
  EXPECT_EQ(mooncake->display, "@larder-client-50052");
  auto named_host = ResolveSocketAddress("localhost:7");
  ASSERT_TRUE(named_host.ok());
  EXPECT_EQ(named_host->display, "@larder-client-7");

  auto path = ResolveSocketAddress("/run/larder/client.sock");
  ASSERT_TRUE(path.ok());
  EXPECT_FALSE(path->abstract);
  EXPECT_EQ(path->display, "/run/larder/client.sock");
  auto relative = ResolveSocketAddress("./client.sock");
  ASSERT_TRUE(relative.ok());
  EXPECT_FALSE(relative->abstract);

  for (const char* bad : {"", "@", "larder", "host:0", "host:65536", "host:123456"}) {
    EXPECT_EQ(ResolveSocketAddress(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(ResolveSocketAddress("@" + std::string(200, 'x')).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace larder::standalone
