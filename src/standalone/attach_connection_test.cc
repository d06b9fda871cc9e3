// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The daemon's request handling (AttachConnection) on an in-memory StoreClient: what a hostile
// client can send (bad fds, bad ranges, random payloads) and that bytes reach the store through the
// shared mapping unchanged.
#include "standalone/attach_connection.h"

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>

#include "common/mutex.h"
#include "standalone/memory_store.h"
#include "standalone/standalone_testing.h"

namespace larder::standalone {
namespace {

using testing::MemoryStore;
using testing::SharedMemfd;

// Memory of "the client" (this test plays both sides), sealed as larder-client requires.
constexpr unsigned kSealed = F_SEAL_SHRINK | F_SEAL_GROW;

class AttachConnectionTest : public ::testing::Test {
 protected:
  AttachConnectionTest()
      : session_(&store_, AttachConnectionOptions{"tenant-a", 4, 8}, "test peer") {}

  // The reply's status; `body` receives the rest.
  Status Send(MessageType type, const PayloadWriter& request, Fd fd = Fd(),
              std::string* body = nullptr) {
    std::string reply = session_.Handle(static_cast<uint16_t>(type), request.data(), std::move(fd));
    PayloadReader in(reply);
    Status status = in.GetStatus();
    if (body != nullptr) {
      // Everything after the status (one byte when OK).
      *body = status.ok() ? reply.substr(1) : std::string();
    }
    return status;
  }

  Status Register(const SharedMemfd& memory, uint64_t address, uint64_t size,
                  uint64_t fd_offset = 0) {
    PayloadWriter request;
    Encode(RegisterSharedRequest{address, size, fd_offset}, &request);
    return Send(MessageType::kRegisterShared, request, memory.Dup());
  }

  MemoryStore store_;
  AttachConnection session_;
};

TEST_F(AttachConnectionTest, HelloAnnouncesTheDaemon) {
  PayloadWriter request;
  Encode(HelloRequest{kProtocolVersion, "unit"}, &request);
  std::string body;
  ASSERT_TRUE(Send(MessageType::kHello, request, Fd(), &body).ok());
  PayloadReader in(body);
  HelloReply reply = DecodeHelloReply(&in);
  ASSERT_TRUE(in.Finish().ok());
  EXPECT_EQ(reply.segment_name, "daemon-segment");
  EXPECT_EQ(reply.tenant_id, "tenant-a");
  EXPECT_EQ(reply.max_regions, 4u);

  PayloadWriter old;
  Encode(HelloRequest{kProtocolVersion + 1, "future"}, &old);
  EXPECT_EQ(Send(MessageType::kHello, old).code(), StatusCode::kFailedPrecondition);
}

TEST_F(AttachConnectionTest, RegisterSharedRefusesBadFds) {
  SharedMemfd good(1 << 16, kSealed);
  ASSERT_TRUE(good.status.ok()) << good.status;
  PayloadWriter request;
  Encode(RegisterSharedRequest{0x10000, 4096, 0}, &request);
  Status no_fd = Send(MessageType::kRegisterShared, request);
  EXPECT_NE(no_fd.message().find("carries no fd"), std::string::npos) << no_fd;

  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  Fd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  Status pipe_status = Send(MessageType::kRegisterShared, request, std::move(read_end));
  EXPECT_EQ(pipe_status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(pipe_status.message().find("not a memfd"), std::string::npos) << pipe_status;

  SharedMemfd unsealed(1 << 16, 0);
  ASSERT_TRUE(unsealed.status.ok()) << unsealed.status;
  Status unsealed_status = Register(unsealed, 0x10000, 4096);
  EXPECT_NE(unsealed_status.message().find("F_SEAL_SHRINK"), std::string::npos) << unsealed_status;

  Status small = Register(good, 0x10000, (1 << 16) + 1);
  EXPECT_NE(small.message().find("fewer than"), std::string::npos) << small;
  Status past = Register(good, 0x10000, 4096, 1 << 16);
  EXPECT_NE(past.message().find("fewer than"), std::string::npos) << past;
  Status misaligned = Register(good, 0x10000, 4096, 100);
  EXPECT_NE(misaligned.message().find("page size"), std::string::npos) << misaligned;
  EXPECT_EQ(Register(good, 0, 4096).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Register(good, 0x10000, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_NE(Register(good, UINT64_MAX - 100, 4096).message().find("wraps"), std::string::npos);
  EXPECT_NE(Register(good, 0x10000, 4096, UINT64_MAX - 4095).message().find("overflows"),
            std::string::npos);

  SharedMemfd write_sealed(1 << 16, kSealed);
  ASSERT_TRUE(write_sealed.status.ok()) << write_sealed.status;
  ASSERT_EQ(fcntl(write_sealed.fd.get(), F_ADD_SEALS, F_SEAL_FUTURE_WRITE), 0);
  Status sealed = Register(write_sealed, 0x10000, 4096);
  EXPECT_NE(sealed.message().find("against writes"), std::string::npos) << sealed;

  EXPECT_EQ(session_.region_count(), 0u);
  EXPECT_EQ(store_.registered(), 0u);

  // Only RegisterShared may carry an fd.
  PayloadWriter exist;
  exist.Keys(std::vector<std::string>{"k"});
  Status with_fd = Send(MessageType::kBatchExist, exist, good.Dup());
  EXPECT_NE(with_fd.message().find("file descriptor"), std::string::npos) << with_fd;
}

TEST_F(AttachConnectionTest, RegionsDoNotOverlapAndAreBounded) {
  SharedMemfd memory(1 << 20, kSealed);
  ASSERT_TRUE(memory.status.ok()) << memory.status;
  ASSERT_TRUE(Register(memory, 0x100000, 1 << 16).ok());
  EXPECT_NE(Register(memory, 0x100000 + 4096, 4096).message().find("overlaps"), std::string::npos);
  EXPECT_NE(Register(memory, 0x100000 - 4096, 8192).message().find("overlaps"), std::string::npos);
  ASSERT_TRUE(Register(memory, 0x200000, 4096, 4096).ok());
  ASSERT_TRUE(Register(memory, 0x300000, 4096, 8192).ok());
  ASSERT_TRUE(Register(memory, 0x400000, 4096).ok());
  EXPECT_EQ(Register(memory, 0x500000, 4096).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(store_.registered(), 4u);

  PayloadWriter unregister;
  unregister.U64(0x200000);
  EXPECT_TRUE(Send(MessageType::kUnregisterShared, unregister).ok());
  EXPECT_EQ(Send(MessageType::kUnregisterShared, unregister).code(), StatusCode::kNotFound);
  EXPECT_EQ(store_.registered(), 3u);
}

TEST_F(AttachConnectionTest, TranslateChecksEveryByte) {
  SharedMemfd memory(1 << 16, kSealed);
  ASSERT_TRUE(memory.status.ok()) << memory.status;
  ASSERT_TRUE(Register(memory, 0x100000, 8192, 4096).ok());
  RegionPins pins;
  EXPECT_TRUE(session_.Translate(0x100000, 8192, &pins).ok());
  EXPECT_TRUE(session_.Translate(0x100000 + 8192, 0, &pins).ok());
  EXPECT_TRUE(session_.Translate(0x100000 + 100, 8092, &pins).ok());
  for (auto [address, size] : std::vector<std::pair<uint64_t, uint64_t>>{
           {0x100000, 8193},
           {0x100000 + 8192, 1},
           {0x100000 - 1, 2},
           {0x100000 + 1, UINT64_MAX},
           {UINT64_MAX, 1},
           {0, 0},
       }) {
    Result<void*> translated = session_.Translate(address, size, &pins);
    EXPECT_EQ(translated.status().code(), StatusCode::kFailedPrecondition)
        << address << "+" << size;
  }
}

TEST_F(AttachConnectionTest, BytesCrossTheMappingUnchanged) {
  SharedMemfd memory(1 << 16, kSealed);
  ASSERT_TRUE(memory.status.ok()) << memory.status;
  const uint64_t base = memory.address();
  ASSERT_TRUE(Register(memory, base + 0, 1 << 15, 0).ok());
  for (size_t i = 0; i < 1000; ++i) memory.data[i] = static_cast<char>(i * 7);

  PayloadWriter put;
  put.PutConfig(PutConfig{});
  EncodeKeyedBuffers(std::vector<KeyedBuffer>{{"a", {base, 1000}}, {"out", {base + (1 << 15), 1}}},
                     &put);
  std::string body;
  ASSERT_TRUE(Send(MessageType::kBatchPutFrom, put, Fd(), &body).ok());
  PayloadReader statuses_in(body);
  auto statuses = DecodeStatuses(&statuses_in, 2);
  ASSERT_TRUE(statuses_in.Finish().ok());
  EXPECT_TRUE(statuses[0].ok()) << statuses[0];
  EXPECT_EQ(statuses[1].code(), StatusCode::kFailedPrecondition) << statuses[1];
  auto stored = store_.Get("a");
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(*stored, std::string(memory.data, 1000));

  PayloadWriter get;
  EncodeKeyedBuffers(std::vector<KeyedBuffer>{{"a", {base + 20000, 1000}}}, &get);
  ASSERT_TRUE(Send(MessageType::kBatchGetInto, get, Fd(), &body).ok());
  EXPECT_EQ(std::memcmp(memory.data + 20000, memory.data, 1000), 0);

  // The copying API's gets: a staging region of 1100 bytes holds one 1000-byte value per round.
  const std::string b(900, 'b'), huge(2000, 'h');
  ASSERT_TRUE(store_.Put("b", std::as_bytes(std::span(b)), {}).ok());
  ASSERT_TRUE(store_.Put("huge", std::as_bytes(std::span(huge)), {}).ok());
  PayloadWriter staged;
  Encode(StagedGetRequest{{base + 4096, 1100}, {"a", "b", "huge", "missing"}}, &staged);
  ASSERT_TRUE(Send(MessageType::kBatchGetStaged, staged, Fd(), &body).ok());
  PayloadReader items_in(body);
  auto items = DecodeStagedItems(&items_in, 4);
  ASSERT_TRUE(items_in.Finish().ok()) << items_in.Finish();
  EXPECT_EQ(items[0].kind, StagedItem::kPlaced);
  EXPECT_EQ(std::string(memory.data + 4096 + items[0].offset, 1000), *stored);
  EXPECT_EQ(items[1].kind, StagedItem::kDeferred);
  EXPECT_EQ(items[2].kind, StagedItem::kFailed);
  EXPECT_NE(items[2].status.message().find("staging_bytes"), std::string::npos);
  EXPECT_EQ(items[3].status.code(), StatusCode::kNotFound);

  // A staging region outside shared memory fails the whole request.
  PayloadWriter outside;
  Encode(StagedGetRequest{{base + (1 << 15), 64}, {"a"}}, &outside);
  EXPECT_EQ(Send(MessageType::kBatchGetStaged, outside).code(), StatusCode::kFailedPrecondition);
}

// Random bytes as every request type: an error reply, never a crash, and the connection still
// works.
TEST_F(AttachConnectionTest, RandomRequestsGetErrorsNotCrashes) {
  SharedMemfd memory(1 << 16, kSealed);
  ASSERT_TRUE(memory.status.ok()) << memory.status;
  const uint64_t base = memory.address();
  ASSERT_TRUE(Register(memory, base, 1 << 16).ok());
  std::mt19937_64 rng(7);
  for (int round = 0; round < 3000; ++round) {
    std::string bytes(rng() % 80, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() % 4 == 0 ? 0 : rng());
    // Sometimes aim the addresses into the region, where translation succeeds.
    if (bytes.size() >= 16 && round % 3 == 0) {
      uint64_t address = base + rng() % (1 << 16);
      std::memcpy(bytes.data() + bytes.size() - 16, &address, 8);
    }
    for (uint16_t type = 1; type <= static_cast<uint16_t>(MessageType::kBatchGetObjectInfo);
         ++type) {
      if (type == static_cast<uint16_t>(MessageType::kUnregisterShared)) continue;
      std::string reply = session_.Handle(type, bytes, Fd());
      ASSERT_FALSE(reply.empty());
    }
  }
  RegionPins pins;
  EXPECT_TRUE(session_.Translate(base, 1 << 16, &pins).ok());
}

}  // namespace
}  // namespace larder::standalone
