// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Bad input against the shm handoff server: malformed, truncated, stalled and random requests
// each get a clear reply (or a closed connection) and the server keeps serving.
#include "transfer/shm/shm_handoff.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "larder/transfer_engine.h"

namespace larder::transfer {
namespace {

using namespace std::chrono_literals;

class ShmHandoffTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TransferEngineOptions options;
    options.protocol = "auto";
    auto engine = TransferEngine::Create(options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(engine).value();
    auto memory = engine_->AllocateSegmentMemory(1 << 20);
    ASSERT_TRUE(memory.ok());
    std::memset((*memory)->data(), 0xab, (*memory)->size());
    ASSERT_TRUE(engine_->RegisterSegment("s", *memory).ok());
    descriptor_ = engine_->ListSegments().front();
    ASSERT_EQ(descriptor_.memory_kind, MemoryKind::kMemfd);
    ASSERT_FALSE(descriptor_.shm_socket.empty());
  }

  Fd Connect() {
    auto fd = UnixConnectAbstract(descriptor_.shm_socket, Clock::now() + 1s);
    EXPECT_TRUE(fd.ok()) << fd.status();
    return fd.ok() ? std::move(fd).value() : Fd();
  }

  // Reads one server message; false when the server closed the connection instead.
  bool ReadMessage(int fd, HandoffServerMessage* m, Fd* passed) {
    return RecvWithFd(fd, m, sizeof(*m), passed, Clock::now() + 3s, "handoff server").ok();
  }

  // The server still hands out the real segment afterwards.
  void ExpectServing() {
    uint64_t size = 0;
    pid_t owner = 0;
    auto fd = RequestSegmentFd(descriptor_, "", Clock::now() + 3s, &size, &owner);
    ASSERT_TRUE(fd.ok()) << fd.status();
    EXPECT_EQ(size, descriptor_.size);
    EXPECT_EQ(owner, getpid());  // the kernel's word for who served it
  }

  std::unique_ptr<TransferEngine> engine_;
  SegmentDescriptor descriptor_;
};

TEST_F(ShmHandoffTest, BadMagicGetsInvalidArgumentAndNoFd) {
  Fd conn = Connect();
  HandoffServerMessage hello;
  Fd passed;
  ASSERT_TRUE(ReadMessage(conn.get(), &hello, &passed));
  EXPECT_EQ(hello.type, HandoffServerMessage::kHello);
  HandoffRequest request;
  request.magic = 0xdeadbeef;
  ASSERT_TRUE(SendAll(conn.get(), &request, sizeof(request), Clock::now() + 1s, "server").ok());
  HandoffServerMessage reply;
  ASSERT_TRUE(ReadMessage(conn.get(), &reply, &passed));
  EXPECT_EQ(reply.type, HandoffServerMessage::kReply);
  EXPECT_EQ(static_cast<StatusCode>(reply.code), StatusCode::kInvalidArgument);
  EXPECT_FALSE(passed.valid());
  ExpectServing();
}

TEST_F(ShmHandoffTest, UnknownSegmentAndStaleEpochAreNotFound) {
  SegmentDescriptor unknown = descriptor_;
  unknown.segment_id += 1000;
  uint64_t size = 0;
  pid_t owner = 0;
  auto fd = RequestSegmentFd(unknown, "", Clock::now() + 3s, &size, &owner);
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), StatusCode::kNotFound) << fd.status();

  SegmentDescriptor stale = descriptor_;
  stale.epoch ^= 1;
  fd = RequestSegmentFd(stale, "", Clock::now() + 3s, &size, &owner);
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), StatusCode::kNotFound) << fd.status();
  ExpectServing();
}

TEST_F(ShmHandoffTest, TruncatedRequestAndEarlyCloseLeaveTheServerServing) {
  {
    Fd conn = Connect();
    HandoffServerMessage hello;
    Fd passed;
    ASSERT_TRUE(ReadMessage(conn.get(), &hello, &passed));
    uint8_t half[20] = {};
    ASSERT_TRUE(SendAll(conn.get(), half, sizeof(half), Clock::now() + 1s, "server").ok());
  }                         // closed mid-request
  { Fd conn = Connect(); }  // closed before reading the greeting
  ExpectServing();
}

TEST_F(ShmHandoffTest, StalledPeerDelaysOthersOnlyBriefly) {
  Fd stalled = Connect();  // never sends its request
  auto start = std::chrono::steady_clock::now();
  ExpectServing();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

TEST_F(ShmHandoffTest, RandomBytesNeverCrashTheServer) {
  std::mt19937_64 rng(1234);
  for (int i = 0; i < 200; ++i) {
    Fd conn = Connect();
    HandoffServerMessage hello;
    Fd passed;
    if (!ReadMessage(conn.get(), &hello, &passed)) continue;
    std::vector<uint8_t> junk(rng() % 120);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    // Sometimes keep the right magic so that later fields get checked too.
    if (junk.size() >= 4 && rng() % 2 == 0) std::memcpy(junk.data(), &kHandoffMagic, 4);
    SendAll(conn.get(), junk.data(), junk.size(), Clock::now() + 1s, "server").IgnoreError();
    shutdown(conn.get(), SHUT_WR);
    HandoffServerMessage reply;
    if (ReadMessage(conn.get(), &reply, &passed)) {
      EXPECT_EQ(reply.type, HandoffServerMessage::kReply);
      // Random ids and epochs never name the real segment.
      EXPECT_NE(reply.code, 0) << "random bytes obtained a segment fd";
    }
  }
  ExpectServing();
}

}  // namespace
}  // namespace larder::transfer
