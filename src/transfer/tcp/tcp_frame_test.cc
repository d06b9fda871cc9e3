// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The tcp frame codec, and the data server's answers to hostile or broken clients: every bad frame
// gets an error frame, the connection survives whenever the next frame boundary is known, and no
// frame can reach memory outside a registered segment.
#include "transfer/wire/frame.h"

#include <sys/socket.h>

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/net.h"
#include "larder/transfer_engine.h"
#include "transfer/testing/test_util.h"
#include "transfer/wire/auth.h"
#include "transfer/wire/stream.h"

namespace larder::transfer::tcp {
namespace {

using namespace wire;  // NOLINT: these tests speak the frame protocol

using std::chrono::seconds;
using testutil::FillPattern;

TEST(TcpFrameTest, EncodeDecodeRoundTrip) {
  FrameHeader in;
  in.type = FrameType::kWrite;
  in.code = 9;
  in.flags = 0xbeef;
  in.request_id = 0x0102030405060708ULL;
  in.segment_id = 0x1112131415161718ULL;
  in.offset = 0x2122232425262728ULL;
  in.length = 0x3132333435363738ULL;
  uint8_t raw[kFrameHeaderSize];
  EncodeHeader(in, raw);
  // The wire format is fixed: "LRD2", then the fields in order, little-endian.
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(raw), 4), "LRD2");
  EXPECT_EQ(raw[4], static_cast<uint8_t>(FrameType::kWrite));
  EXPECT_EQ(raw[5], 9);
  EXPECT_EQ(raw[6], 0xef);
  EXPECT_EQ(raw[8], 0x08);
  EXPECT_EQ(raw[16], 0x18);
  EXPECT_EQ(raw[24], 0x28);
  EXPECT_EQ(raw[39], 0x31);

  FrameHeader out;
  ASSERT_TRUE(DecodeHeader(raw, &out).ok());
  EXPECT_EQ(out.magic, kFrameMagic);
  EXPECT_EQ(out.type, in.type);
  EXPECT_EQ(out.code, in.code);
  EXPECT_EQ(out.flags, in.flags);
  EXPECT_EQ(out.request_id, in.request_id);
  EXPECT_EQ(out.segment_id, in.segment_id);
  EXPECT_EQ(out.offset, in.offset);
  EXPECT_EQ(out.length, in.length);
}

TEST(TcpFrameTest, EveryKnownTypeDecodes) {
  for (uint8_t type = 1; type <= 10; ++type) {
    FrameHeader in;
    in.type = static_cast<FrameType>(type);
    uint8_t raw[kFrameHeaderSize];
    EncodeHeader(in, raw);
    FrameHeader out;
    EXPECT_TRUE(DecodeHeader(raw, &out).ok()) << int{type};
    EXPECT_EQ(static_cast<uint8_t>(out.type), type);
  }
}

TEST(TcpFrameTest, BadMagicIsRejected) {
  uint8_t raw[kFrameHeaderSize];
  EncodeHeader(FrameHeader{}, raw);
  for (int byte = 0; byte < 4; ++byte) {
    uint8_t corrupt[kFrameHeaderSize];
    std::memcpy(corrupt, raw, sizeof(raw));
    corrupt[byte] ^= 0x20;
    FrameHeader out;
    Status status = DecodeHeader(corrupt, &out);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status;
  }
}

TEST(TcpFrameTest, UnknownTypeIsRejected) {
  uint8_t raw[kFrameHeaderSize];
  EncodeHeader(FrameHeader{}, raw);
  for (int type : {0, 11, 12, 128, 255}) {
    raw[4] = static_cast<uint8_t>(type);
    FrameHeader out;
    Status status = DecodeHeader(raw, &out);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << type;
    EXPECT_NE(status.message().find(std::to_string(type)), std::string::npos) << status;
  }
}

TEST(TcpFrameTest, ErrorFrameStatusKeepsKnownCodesOnly) {
  EXPECT_EQ(ErrorFrameStatus(static_cast<uint8_t>(StatusCode::kNotFound), "m"), NotFoundError("m"));
  EXPECT_EQ(ErrorFrameStatus(static_cast<uint8_t>(StatusCode::kDataLoss), "m").code(),
            StatusCode::kDataLoss);
  EXPECT_EQ(ErrorFrameStatus(static_cast<uint8_t>(StatusCode::kUnauthenticated), "m").code(),
            StatusCode::kUnauthenticated);
  // An error frame can never mean OK, and unknown codes do not become out-of-range enums.
  EXPECT_EQ(ErrorFrameStatus(0, "m").code(), StatusCode::kInternal);
  EXPECT_EQ(ErrorFrameStatus(17, "m").code(), StatusCode::kInternal);
  EXPECT_EQ(ErrorFrameStatus(255, "m").code(), StatusCode::kInternal);
}

struct Frame {
  FrameHeader header;
  std::string payload;
};

// A hand-driven client of an engine's data server, for sending what a real client never would.
class RawConnection {
 public:
  // Connects and reads the server's hello (and its nonce, when the server wants a token).
  explicit RawConnection(const std::string& address) {
    auto host_port = ParseHostPort(address);
    EXPECT_TRUE(host_port.ok()) << host_port.status();
    if (!host_port.ok()) return;
    auto fd = TcpConnect(*host_port, Clock::now() + seconds(5));
    EXPECT_TRUE(fd.ok()) << fd.status();
    if (!fd.ok()) return;
    fd_ = std::move(fd).value();
    auto hello = Read();
    EXPECT_TRUE(hello.ok()) << hello.status();
    if (!hello.ok()) return;
    EXPECT_EQ(hello->header.type, FrameType::kHello);
    hello_ = std::move(hello).value();
  }

  bool connected() const { return fd_.valid() && hello_.header.type == FrameType::kHello; }
  const Frame& hello() const { return hello_; }
  int fd() const { return fd_.get(); }

  Status SendRaw(const void* data, size_t length) {
    return SendAll(fd_.get(), data, length, Clock::now() + seconds(10), "server");
  }

  Status Send(const FrameHeader& header, const void* payload = nullptr, size_t length = 0) {
    uint8_t raw[kFrameHeaderSize];
    EncodeHeader(header, raw);
    LARDER_RETURN_IF_ERROR(SendRaw(raw, sizeof(raw)));
    if (length > 0) LARDER_RETURN_IF_ERROR(SendRaw(payload, length));
    return Status();
  }

  // Reads one frame from the server; its payload is `length` bytes for every server frame.
  Result<Frame> Read(Clock::duration timeout = seconds(10)) {
    Deadline deadline = Clock::now() + timeout;
    uint8_t raw[kFrameHeaderSize];
    LARDER_RETURN_IF_ERROR(RecvAll(fd_.get(), raw, sizeof(raw), deadline, "server"));
    Frame frame;
    LARDER_RETURN_IF_ERROR(DecodeHeader(raw, &frame.header));
    if (frame.header.length > kMaxFramePayload) return DataLossError("oversized server frame");
    frame.payload.resize(frame.header.length);
    LARDER_RETURN_IF_ERROR(
        RecvAll(fd_.get(), frame.payload.data(), frame.payload.size(), deadline, "server"));
    return frame;
  }

  // True when the server closes its end (reads see end-of-stream) before `timeout`.
  bool ClosedByServer(Clock::duration timeout = seconds(5)) {
    char byte;
    Status status = RecvAll(fd_.get(), &byte, 1, Clock::now() + timeout, "server");
    return status.code() == StatusCode::kUnavailable;
  }

 private:
  Fd fd_;
  Frame hello_;
};

// Asserts that `frame` is an error frame with `code` answering request `request_id`.
::testing::AssertionResult IsError(const Result<Frame>& frame, StatusCode code,
                                   uint64_t request_id) {
  if (!frame.ok()) return ::testing::AssertionFailure() << "no frame: " << frame.status();
  if (frame->header.type != FrameType::kError) {
    return ::testing::AssertionFailure()
           << "frame type " << static_cast<int>(frame->header.type) << ", not an error";
  }
  Status status = ErrorFrameStatus(frame->header.code, frame->payload);
  if (status.code() != code) return ::testing::AssertionFailure() << "got " << status;
  if (frame->header.request_id != request_id) {
    return ::testing::AssertionFailure() << "answers request " << frame->header.request_id;
  }
  if (frame->payload.empty()) return ::testing::AssertionFailure() << "no message";
  return ::testing::AssertionSuccess() << status;
}

class DataServerTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kSegmentBytes = 4 << 20;

  void SetUp() override { StartEngine(""); }

  void StartEngine(const std::string& token) {
    TransferEngineOptions options;
    options.protocol = "auto";
    options.auth_token = token;
    auto engine = TransferEngine::Create(options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(engine).value();
    auto memory = engine_->AllocateSegmentMemory(kSegmentBytes);
    ASSERT_TRUE(memory.ok()) << memory.status();
    memory_ = std::move(memory).value();
    FillPattern(memory_->data(), memory_->size(), 42);
    snapshot_.assign(bytes(), bytes() + memory_->size());
    auto id = engine_->RegisterSegment("kv", memory_);
    ASSERT_TRUE(id.ok()) << id.status();
    segment_id_ = *id;
  }

  uint8_t* bytes() const { return static_cast<uint8_t*>(memory_->data()); }

  FrameHeader ReadFrame(uint64_t request_id, uint64_t segment_id, uint64_t offset,
                        uint64_t length) const {
    FrameHeader h;
    h.type = FrameType::kRead;
    h.request_id = request_id;
    h.segment_id = segment_id;
    h.offset = offset;
    h.length = length;
    return h;
  }

  // Sends a valid read on `conn` and checks that the reply holds the segment's bytes.
  void ExpectValidReadWorks(RawConnection& conn, uint64_t request_id) {
    ASSERT_TRUE(conn.Send(ReadFrame(request_id, segment_id_, 100, 5000)).ok());
    auto reply = conn.Read();
    ASSERT_TRUE(reply.ok()) << reply.status();
    ASSERT_EQ(reply->header.type, FrameType::kReadReply)
        << ErrorFrameStatus(reply->header.code, reply->payload);
    EXPECT_EQ(reply->header.request_id, request_id);
    ASSERT_EQ(reply->payload.size(), 5000u);
    EXPECT_EQ(std::memcmp(reply->payload.data(), bytes() + 100, 5000), 0);
  }

  std::unique_ptr<TransferEngine> engine_;
  std::shared_ptr<MemoryRegion> memory_;
  std::vector<uint8_t> snapshot_;  // the segment's content as filled in SetUp
  SegmentId segment_id_ = 0;
};

TEST_F(DataServerTest, HelloWithoutTokenCarriesNoNonce) {
  RawConnection conn(engine_->address());
  ASSERT_TRUE(conn.connected());
  EXPECT_EQ(conn.hello().header.flags & kFlagNeedAuth, 0);
  EXPECT_TRUE(conn.hello().payload.empty());
  ExpectValidReadWorks(conn, 1);
}

TEST_F(DataServerTest, RandomBytesInsteadOfAHeaderGetAnErrorAndAClose) {
  RawConnection conn(engine_->address());
  ASSERT_TRUE(conn.connected());
  uint8_t garbage[kFrameHeaderSize];
  std::mt19937 rng(7);
  for (uint8_t& b : garbage) b = static_cast<uint8_t>(rng());
  garbage[0] = 'X';  // never the magic by accident
  ASSERT_TRUE(conn.SendRaw(garbage, sizeof(garbage)).ok());
  EXPECT_TRUE(IsError(conn.Read(), StatusCode::kInvalidArgument, 0));
  EXPECT_TRUE(conn.ClosedByServer());
}

TEST_F(DataServerTest, UnknownSegmentIsNotFoundAndTheConnectionStaysUsable) {
  RawConnection conn(engine_->address());
  ASSERT_TRUE(conn.connected());
  ASSERT_TRUE(conn.Send(ReadFrame(17, segment_id_ + 999, 0, 64)).ok());
  EXPECT_TRUE(IsError(conn.Read(), StatusCode::kNotFound, 17));
  ExpectValidReadWorks(conn, 18);
}

TEST_F(DataServerTest, OverflowingReadIsOutOfRange) {
  RawConnection conn(engine_->address());
  ASSERT_TRUE(conn.connected());
  ASSERT_TRUE(conn.Send(ReadFrame(1, segment_id_, UINT64_MAX - 10, 100)).ok());
  EXPECT_TRUE(IsError(conn.Read(), StatusCode::kOutOfRange, 1));
  ASSERT_TRUE(conn.Send(ReadFrame(2, segment_id_, memory_->size() - 10, 11)).ok());
  EXPECT_TRUE(IsError(conn.Read(), StatusCode::kOutOfRange, 2));
  ASSERT_TRUE(conn.Send(ReadFrame(3, segment_id_, 0, 0)).ok());
  EXPECT_TRUE(IsError(conn.Read(), StatusCode::kInvalidArgument, 3));
  // A read larger than any frame may carry is refused before the segment is looked up.
  ASSERT_TRUE(conn.Send(ReadFrame(4, segment_id_, 0, kMaxFramePayload + 1)).ok());
  EXPECT_TRUE(IsError(conn.Read(), StatusCode::kInvalidArgument, 4));
  ExpectValidReadWorks(conn, 5);
}

TEST_F(DataServerTest, OutOfRangeWriteSkipsItsPayloadAndKeepsTheConnection) {
  RawConnection conn(engine_->address());
  ASSERT_TRUE(conn.connected());
  FrameHeader write;
  write.type = FrameType::kWrite;
  write.request_id = 5;
  write.segment_id = segment_id_;
  write.offset = memory_->size() - 10;  // 100 bytes from here run 90 past the end
  write.length = 100;
  std::vector<uint8_t> payload(100, 0xff);
  ASSERT_TRUE(conn.Send(write, payload.data(), payload.size()).ok());
  EXPECT_TRUE(IsError(conn.Read(), StatusCode::kOutOfRange, 5));
  // Not even the in-range part was written.
  EXPECT_EQ(
      std::memcmp(bytes() + memory_->size() - 10, snapshot_.data() + memory_->size() - 10, 10), 0);

  // The payload was consumed: the next frame on the same connection is read as a frame.
  write.request_id = 6;
  write.offset = 0;
  write.length = 16;
  std::vector<uint8_t> good(16, 0x3c);
  ASSERT_TRUE(conn.Send(write, good.data(), good.size()).ok());
  auto reply = conn.Read();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->header.type, FrameType::kWriteReply)
      << ErrorFrameStatus(reply->header.code, reply->payload);
  EXPECT_EQ(reply->header.request_id, 6u);
  EXPECT_EQ(std::memcmp(bytes(), good.data(), good.size()), 0);
  ExpectValidReadWorks(conn, 7);
}

TEST_F(DataServerTest, WriteToUnknownSegmentSkipsItsPayload) {
  RawConnection conn(engine_->address());
  ASSERT_TRUE(conn.connected());
  FrameHeader write;
  write.type = FrameType::kWrite;
  write.request_id = 8;
  write.segment_id = segment_id_ + 1;
  write.length = 3 << 20;  // larger than the server's skip buffer
  std::vector<uint8_t> payload(write.length, 0x11);
  ASSERT_TRUE(conn.Send(write, payload.data(), payload.size()).ok());
  EXPECT_TRUE(IsError(conn.Read(), StatusCode::kNotFound, 8));
  ExpectValidReadWorks(conn, 9);
}

TEST_F(DataServerTest, OversizedWriteGetsAnErrorAndAClose) {
  RawConnection conn(engine_->address());
  ASSERT_TRUE(conn.connected());
  FrameHeader write;
  write.type = FrameType::kWrite;
  write.request_id = 11;
  write.segment_id = segment_id_;
  write.length = kMaxFramePayload + 1;
  ASSERT_TRUE(conn.Send(write).ok());  // the payload never follows; the server must not wait for it
  auto frame = conn.Read();
  ASSERT_TRUE(frame.ok()) << frame.status();
  EXPECT_EQ(frame->header.type, FrameType::kError);
  EXPECT_NE(frame->header.code, 0);
  EXPECT_TRUE(conn.ClosedByServer());
}

TEST_F(DataServerTest, TruncatedHeaderDoesNotStopTheServer) {
  {
    RawConnection conn(engine_->address());
    ASSERT_TRUE(conn.connected());
    uint8_t raw[kFrameHeaderSize];
    EncodeHeader(ReadFrame(1, segment_id_, 0, 8), raw);
    ASSERT_TRUE(conn.SendRaw(raw, 20).ok());
  }  // closes mid-header
  RawConnection next(engine_->address());
  ASSERT_TRUE(next.connected());
  ExpectValidReadWorks(next, 2);
}

TEST_F(DataServerTest, ResponseTypesFromAClientAreRefused) {
  for (FrameType type : {FrameType::kHello, FrameType::kAuthOk, FrameType::kReadReply,
                         FrameType::kWriteReply, FrameType::kDescribeReply, FrameType::kError}) {
    RawConnection conn(engine_->address());
    ASSERT_TRUE(conn.connected());
    FrameHeader h;
    h.type = type;
    h.request_id = 3;
    ASSERT_TRUE(conn.Send(h).ok());
    EXPECT_TRUE(IsError(conn.Read(), StatusCode::kInvalidArgument, 3)) << static_cast<int>(type);
    EXPECT_TRUE(conn.ClosedByServer());
  }
}

TEST_F(DataServerTest, DescribeListsTheSegments) {
  RawConnection conn(engine_->address());
  ASSERT_TRUE(conn.connected());
  FrameHeader describe;
  describe.type = FrameType::kDescribe;
  describe.request_id = 4;
  ASSERT_TRUE(conn.Send(describe).ok());
  auto reply = conn.Read();
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->header.type, FrameType::kDescribeReply);
  auto list = nlohmann::json::parse(reply->payload, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(list.is_array()) << reply->payload;
  ASSERT_EQ(list.size(), 1u);
  auto descriptor = SegmentDescriptor::FromJson(list[0].dump());
  ASSERT_TRUE(descriptor.ok()) << descriptor.status();
  EXPECT_EQ(descriptor->name, "kv");
  EXPECT_EQ(descriptor->segment_id, segment_id_);
  EXPECT_EQ(descriptor->size, memory_->size());
  ExpectValidReadWorks(conn, 5);
}

TEST_F(DataServerTest, DataFrameBeforeAuthIsPermissionDenied) {
  engine_.reset();
  StartEngine("secret");
  RawConnection conn(engine_->address());
  ASSERT_TRUE(conn.connected());
  EXPECT_NE(conn.hello().header.flags & kFlagNeedAuth, 0);
  EXPECT_EQ(conn.hello().header.flags & kFlagTls, 0);
  AuthNonce nonce;
  std::string server_id;
  ASSERT_TRUE(DecodeHello(conn.hello().payload, &nonce, &server_id).ok());
  EXPECT_EQ(server_id, engine_->id());
  ASSERT_TRUE(conn.Send(ReadFrame(21, segment_id_, 0, 64)).ok());
  EXPECT_TRUE(IsError(conn.Read(), StatusCode::kPermissionDenied, 21));
  EXPECT_TRUE(conn.ClosedByServer());
}

// The proof a client holding `token` would send on `conn`, naming `dialed` as the endpoint it
// dialed (by default the address `conn` really reached).
struct ClientProof {
  TcpAuthBinding binding;
  AuthRequest request;
};

ClientProof MakeProof(const RawConnection& conn, const std::string& token,
                      std::string dialed = "") {
  ClientProof proof;
  EXPECT_TRUE(DecodeHello(conn.hello().payload, &proof.binding.server_nonce,
                          &proof.binding.server_engine_id)
                  .ok());
  if (dialed.empty()) dialed = SocketEndpoint(conn.fd(), /*local=*/false).value_or("?");
  RandomBytes(proof.binding.client_nonce.data(), proof.binding.client_nonce.size());
  proof.binding.dialed_endpoint = dialed;
  proof.binding.client_engine_id = "test-client/1/0";
  proof.request.client_nonce = proof.binding.client_nonce;
  proof.request.client_engine_id = proof.binding.client_engine_id;
  proof.request.dialed_endpoint = dialed;
  proof.request.mac = TcpClientMac(token, proof.binding);
  return proof;
}

Status SendAuth(RawConnection& conn, uint64_t request_id, const std::string& payload) {
  FrameHeader auth;
  auth.type = FrameType::kAuth;
  auth.request_id = request_id;
  auth.length = payload.size();
  return conn.Send(auth, payload.data(), payload.size());
}

TEST_F(DataServerTest, WrongMacIsPermissionDeniedAndTheRightOneOpensTheConnection) {
  engine_.reset();
  StartEngine("secret");
  {
    RawConnection conn(engine_->address());
    ASSERT_TRUE(conn.connected());
    ASSERT_TRUE(SendAuth(conn, 1, EncodeAuth(MakeProof(conn, "wrong").request)).ok());
    EXPECT_TRUE(IsError(conn.Read(), StatusCode::kPermissionDenied, 1));
    EXPECT_TRUE(conn.ClosedByServer());
  }
  RawConnection conn(engine_->address());
  ASSERT_TRUE(conn.connected());
  ClientProof proof = MakeProof(conn, "secret");
  ASSERT_TRUE(SendAuth(conn, 2, EncodeAuth(proof.request)).ok());
  auto ok = conn.Read();
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->header.type, FrameType::kAuthOk) << ErrorFrameStatus(ok->header.code, ok->payload);
  EXPECT_EQ(ok->header.request_id, 2u);
  // The server proves the token back, over the same binding.
  AuthMac server_mac;
  ASSERT_TRUE(DecodeAuthOk(ok->payload, &server_mac).ok());
  EXPECT_EQ(server_mac, TcpServerMac("secret", proof.binding));
  EXPECT_NE(server_mac, TcpServerMac("wrong", proof.binding));
  ExpectValidReadWorks(conn, 3);
}

TEST_F(DataServerTest, ProofForAnotherEngineOrEndpointIsPermissionDenied) {
  engine_.reset();
  StartEngine("secret");
  {
    // A proof naming another endpoint is what a relay forwards: the client dialed the relay.
    RawConnection conn(engine_->address());
    ASSERT_TRUE(conn.connected());
    ASSERT_TRUE(
        SendAuth(conn, 1, EncodeAuth(MakeProof(conn, "secret", "10.9.8.7:1234").request)).ok());
    auto reply = conn.Read();
    EXPECT_TRUE(IsError(reply, StatusCode::kPermissionDenied, 1));
    if (reply.ok()) {
      EXPECT_NE(reply->payload.find("10.9.8.7:1234"), std::string::npos);
    }
    EXPECT_TRUE(conn.ClosedByServer());
  }
  {
    // A proof made for another server engine id (the server checks with its own).
    RawConnection conn(engine_->address());
    ASSERT_TRUE(conn.connected());
    ClientProof proof = MakeProof(conn, "secret");
    proof.binding.server_engine_id = "some-other-engine";
    proof.request.mac = TcpClientMac("secret", proof.binding);
    ASSERT_TRUE(SendAuth(conn, 2, EncodeAuth(proof.request)).ok());
    EXPECT_TRUE(IsError(conn.Read(), StatusCode::kPermissionDenied, 2));
    EXPECT_TRUE(conn.ClosedByServer());
  }
  {
    // A proof taken from another connection (its nonce) does not open this one.
    RawConnection first(engine_->address());
    RawConnection second(engine_->address());
    ASSERT_TRUE(first.connected() && second.connected());
    ASSERT_TRUE(SendAuth(second, 3, EncodeAuth(MakeProof(first, "secret").request)).ok());
    EXPECT_TRUE(IsError(second.Read(), StatusCode::kPermissionDenied, 3));
  }
  // Dialing the advertised endpoint works (the server's local address is the same here).
  RawConnection conn(engine_->address());
  ASSERT_TRUE(conn.connected());
  ASSERT_TRUE(
      SendAuth(conn, 4, EncodeAuth(MakeProof(conn, "secret", engine_->address()).request)).ok());
  auto ok = conn.Read();
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->header.type, FrameType::kAuthOk) << ErrorFrameStatus(ok->header.code, ok->payload);
  ExpectValidReadWorks(conn, 5);
}

TEST_F(DataServerTest, MalformedAuthIsInvalidArgumentAndCloses) {
  engine_.reset();
  StartEngine("secret");
  auto expect_refused = [&](const std::string& payload, const std::string& what) {
    SCOPED_TRACE(what);
    RawConnection conn(engine_->address());
    ASSERT_TRUE(conn.connected());
    ASSERT_TRUE(SendAuth(conn, 7, payload).ok());
    auto reply = conn.Read();
    EXPECT_TRUE(IsError(reply, StatusCode::kInvalidArgument, 7));
    if (reply.ok()) {
      EXPECT_NE(reply->payload.find(what), std::string::npos) << reply->payload;
    }
    EXPECT_TRUE(conn.ClosedByServer());
  };
  RawConnection probe(engine_->address());
  ASSERT_TRUE(probe.connected());
  AuthRequest good = MakeProof(probe, "secret").request;
  std::string encoded = EncodeAuth(good);
  expect_refused("", "client nonce is missing");
  expect_refused(encoded.substr(0, encoded.size() - 1), "mac runs past the payload");
  expect_refused(encoded + "x", "trailing bytes");
  AuthRequest long_id = good;
  long_id.client_engine_id.assign(kMaxEngineIdBytes + 1, 'e');
  expect_refused(EncodeAuth(long_id), "client engine id has 257 bytes");
  AuthRequest no_endpoint = good;
  no_endpoint.dialed_endpoint.clear();
  expect_refused(EncodeAuth(no_endpoint), "dialed endpoint has 0 bytes");
  // An oversized payload is refused before the server reads it.
  {
    RawConnection conn(engine_->address());
    ASSERT_TRUE(conn.connected());
    FrameHeader auth;
    auth.type = FrameType::kAuth;
    auth.request_id = 8;
    auth.length = kMaxAuthPayload + 1;
    ASSERT_TRUE(conn.Send(auth).ok());
    EXPECT_TRUE(IsError(conn.Read(), StatusCode::kInvalidArgument, 8));
    EXPECT_TRUE(conn.ClosedByServer());
  }
}

TEST_F(DataServerTest, AuthIsRefusedWhenNotExpected) {
  {
    // This server has no token: there is nothing to prove.
    RawConnection conn(engine_->address());
    ASSERT_TRUE(conn.connected());
    ASSERT_TRUE(SendAuth(conn, 1, "").ok());
    EXPECT_TRUE(IsError(conn.Read(), StatusCode::kInvalidArgument, 1));
    EXPECT_TRUE(conn.ClosedByServer());
  }
  engine_.reset();
  StartEngine("secret");
  RawConnection conn(engine_->address());
  ASSERT_TRUE(conn.connected());
  ASSERT_TRUE(SendAuth(conn, 2, EncodeAuth(MakeProof(conn, "secret").request)).ok());
  auto ok = conn.Read();
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->header.type, FrameType::kAuthOk);
  // A second proof on an authenticated connection is refused.
  ASSERT_TRUE(SendAuth(conn, 3, EncodeAuth(MakeProof(conn, "secret").request)).ok());
  EXPECT_TRUE(IsError(conn.Read(), StatusCode::kInvalidArgument, 3));
  EXPECT_TRUE(conn.ClosedByServer());
}

TEST(TcpAuthTest, EveryBoundFieldChangesTheMacs) {
  TcpAuthBinding base;
  base.server_nonce.fill(1);
  base.client_nonce.fill(2);
  base.server_engine_id = "server";
  base.dialed_endpoint = "10.0.0.1:7000";
  base.client_engine_id = "client";
  std::vector<TcpAuthBinding> variants(7, base);
  variants[0].server_nonce[31] ^= 1;
  variants[1].client_nonce[0] ^= 1;
  variants[2].server_engine_id = "server2";
  variants[3].dialed_endpoint = "10.0.0.1:7001";
  variants[4].client_engine_id = "client2";
  variants[5].channel_binding = std::string(32, 'x');
  // Length prefixes: moving a byte from one field to the next changes the input.
  variants[6].server_engine_id = "serve";
  variants[6].dialed_endpoint = "r10.0.0.1:7000";
  for (const auto& v : variants) {
    EXPECT_NE(TcpClientMac("t", v), TcpClientMac("t", base));
    EXPECT_NE(TcpServerMac("t", v), TcpServerMac("t", base));
  }
  // The two directions never accept each other's proof, and the token matters.
  EXPECT_NE(TcpClientMac("t", base), TcpServerMac("t", base));
  EXPECT_NE(TcpClientMac("t", base), TcpClientMac("u", base));
}

TEST(TcpAuthTest, PayloadsRoundTripAndBoundTheirFields) {
  AuthNonce nonce;
  nonce.fill(7);
  AuthNonce decoded_nonce;
  std::string id;
  ASSERT_TRUE(DecodeHello(EncodeHello(nonce, "engine-1"), &decoded_nonce, &id).ok());
  EXPECT_EQ(decoded_nonce, nonce);
  EXPECT_EQ(id, "engine-1");
  EXPECT_EQ(DecodeHello(EncodeHello(nonce, ""), &decoded_nonce, &id).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      DecodeHello(EncodeHello(nonce, std::string(kMaxEngineIdBytes + 1, 'x')), &decoded_nonce, &id)
          .code(),
      StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      DecodeHello(EncodeHello(nonce, std::string(kMaxEngineIdBytes, 'x')), &decoded_nonce, &id)
          .ok());

  AuthRequest request;
  request.client_nonce.fill(3);
  request.client_engine_id = "client";
  request.dialed_endpoint = "127.0.0.1:9";
  request.mac.fill(9);
  AuthRequest decoded;
  ASSERT_TRUE(DecodeAuth(EncodeAuth(request), &decoded).ok());
  EXPECT_EQ(decoded.client_nonce, request.client_nonce);
  EXPECT_EQ(decoded.client_engine_id, request.client_engine_id);
  EXPECT_EQ(decoded.dialed_endpoint, request.dialed_endpoint);
  EXPECT_EQ(decoded.mac, request.mac);
  request.dialed_endpoint.assign(kMaxEndpointBytes + 1, '1');
  EXPECT_EQ(DecodeAuth(EncodeAuth(request), &decoded).code(), StatusCode::kInvalidArgument);

  AuthMac mac, decoded_mac;
  mac.fill(5);
  ASSERT_TRUE(DecodeAuthOk(EncodeAuthOk(mac), &decoded_mac).ok());
  EXPECT_EQ(decoded_mac, mac);
  EXPECT_EQ(DecodeAuthOk("", &decoded_mac).code(), StatusCode::kInvalidArgument);
}

TEST_F(DataServerTest, RandomFramesNeitherCrashNorCorruptTheServer) {
  constexpr int kIterations = 300;
  constexpr uint64_t kMaxLength = 1 << 20;
  std::mt19937_64 rng(0x5eed);
  const uint64_t size = memory_->size();
  int read_replies = 0, errors = 0;
  for (int i = 0; i < kIterations; ++i) {
    SCOPED_TRACE("iteration " + std::to_string(i));
    FrameHeader h;
    h.magic = rng() % 16 == 0 ? static_cast<uint32_t>(rng()) : kFrameMagic;
    uint8_t type = static_cast<uint8_t>(rng() % 13);  // 0..12: every type and a few unknown ones
    h.code = static_cast<uint8_t>(rng());
    h.flags = static_cast<uint16_t>(rng());
    h.request_id = rng();
    h.length = rng() % (kMaxLength + 1);
    bool real_segment = rng() % 3 == 0;
    if (real_segment && type == static_cast<uint8_t>(FrameType::kRead)) {
      h.segment_id = segment_id_;
      h.offset = rng() % (size - h.length + 1);  // in range
    } else if (real_segment && type == static_cast<uint8_t>(FrameType::kWrite)) {
      // The real segment, but never a range the server may write: past the end or wrapping.
      h.segment_id = segment_id_;
      h.offset = rng() % 2 == 0 ? size + rng() % kMaxLength : UINT64_MAX - rng() % 4096;
    } else {
      do {
        h.segment_id = rng();
      } while (h.segment_id == segment_id_);
      h.offset = rng() % 2 == 0 ? rng() : rng() % size;
    }
    // Written byte by byte so that the unknown types 0, 11 and 12 can be encoded too.
    uint8_t raw[kFrameHeaderSize];
    EncodeHeader(h, raw);
    raw[4] = type;
    bool sends_payload = h.magic == kFrameMagic && type == static_cast<uint8_t>(FrameType::kWrite);
    std::vector<uint8_t> payload(sends_payload ? h.length : 0);
    FillPattern(payload.data(), payload.size(), i);

    RawConnection conn(engine_->address());
    ASSERT_TRUE(conn.connected());
    ASSERT_TRUE(conn.SendRaw(raw, sizeof(raw)).ok());
    if (!payload.empty()) {
      ASSERT_TRUE(conn.SendRaw(payload.data(), payload.size()).ok());
    }
    // End of stream tells a server that waits for more (e.g. an auth frame's mac) to give up.
    shutdown(conn.fd(), SHUT_WR);
    // Every request frame, good or bad, is answered by exactly one frame.
    auto reply = conn.Read();
    ASSERT_TRUE(reply.ok()) << reply.status();
    switch (reply->header.type) {
      case FrameType::kError:
        ++errors;
        EXPECT_NE(reply->header.code, 0);
        break;
      case FrameType::kReadReply:
        ++read_replies;
        ASSERT_EQ(type, static_cast<uint8_t>(FrameType::kRead));
        ASSERT_EQ(h.segment_id, segment_id_);
        ASSERT_EQ(reply->payload.size(), h.length);
        EXPECT_EQ(std::memcmp(reply->payload.data(), bytes() + h.offset, h.length), 0);
        break;
      case FrameType::kDescribeReply:
        EXPECT_EQ(type, static_cast<uint8_t>(FrameType::kDescribe));
        break;
      default:
        ADD_FAILURE() << "unexpected reply type " << static_cast<int>(reply->header.type)
                      << " to type " << int{type};
    }
  }
  EXPECT_GT(read_replies, 0);
  EXPECT_GT(errors, kIterations / 2);
  // Nothing the fuzz sent may have changed the segment.
  ASSERT_EQ(std::memcmp(bytes(), snapshot_.data(), snapshot_.size()), 0);

  // And the server still serves a real engine.
  TransferEngineOptions options;
  options.protocol = "tcp";
  auto initiator = TransferEngine::Create(options);
  ASSERT_TRUE(initiator.ok()) << initiator.status();
  auto handle = (*initiator)->OpenSegment(engine_->address(), "kv");
  ASSERT_TRUE(handle.ok()) << handle.status();
  std::vector<uint8_t> source(300000), destination(300000, 0);
  FillPattern(source.data(), source.size(), 99);
  TransferRequest requests[] = {
      {TransferOp::kWrite, source.data(), *handle, 1000, source.size()},
  };
  auto wrote = (*initiator)->TransferSync(requests, seconds(10));
  ASSERT_TRUE(wrote.ok()) << wrote.status();
  ASSERT_TRUE((*wrote)[0].status.ok()) << (*wrote)[0].status;
  requests[0] = {TransferOp::kRead, destination.data(), *handle, 1000, destination.size()};
  auto read = (*initiator)->TransferSync(requests, seconds(10));
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_TRUE((*read)[0].status.ok()) << (*read)[0].status;
  EXPECT_EQ(destination, source);
  EXPECT_EQ(std::memcmp(bytes(), snapshot_.data(), 1000), 0);
  EXPECT_EQ(std::memcmp(bytes() + 1000 + source.size(), snapshot_.data() + 1000 + source.size(),
                        size - 1000 - source.size()),
            0);
}

}  // namespace
}  // namespace larder::transfer::tcp
