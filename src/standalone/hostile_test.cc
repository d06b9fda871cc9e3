// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Hostile peers of a real larder-client process: raw sockets that send garbage, oversized frames,
// out-of-range addresses and bad fds, stall mid-frame, or run as another uid. Each gets a clear
// error, and the daemon keeps serving a well-behaved attached client throughout.
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>

#include "larder/standalone.h"
#include "standalone/frame_io.h"
#include "standalone/standalone_testing.h"

namespace larder::standalone {
namespace {

using namespace std::chrono_literals;
using testing::SharedMemfd;

constexpr uid_t kUnprivilegedUid = 65534;  // nobody

// A peer that speaks the protocol by hand.
class RawPeer {
 public:
  static Result<RawPeer> Connect(const std::string& socket) {
    LARDER_ASSIGN_OR_RETURN(SocketAddress address, ResolveSocketAddress(socket));
    LARDER_ASSIGN_OR_RETURN(Fd fd, ConnectTo(address));
    RawPeer peer;
    peer.fd_ = std::move(fd);
    return peer;
  }

  Status SendBytes(std::string_view bytes) {
    return SendAll(fd_.get(), bytes.data(), bytes.size(), Clock::now() + 5s, "daemon");
  }
  Status Send(MessageType type, std::string_view payload, int pass_fd = -1) {
    return SendFrame(fd_.get(), static_cast<uint16_t>(type), next_id_++, payload, pass_fd,
                     Clock::now() + 5s, "daemon");
  }
  Result<Frame> Read() {
    Frame frame;
    LARDER_RETURN_IF_ERROR(
        RecvFrame(fd_.get(), kMaxFrameBytes, Clock::now() + 20s, "daemon", &frame));
    return frame;
  }
  // The status a reply or Goodbye starts with; `body` gets the rest of the payload.
  static Status StatusOf(const Frame& frame, std::string* body = nullptr) {
    PayloadReader in(frame.payload);
    Status status = in.GetStatus();
    if (body != nullptr) *body = status.ok() ? frame.payload.substr(1) : "";
    return status;
  }
  // The reply to the request just sent (a Goodbye fails the test).
  Status Call(MessageType type, std::string_view payload, std::string* body = nullptr,
              int pass_fd = -1) {
    Status sent = Send(type, payload, pass_fd);
    if (!sent.ok()) return sent;
    auto frame = Read();
    if (!frame.ok()) return frame.status();
    EXPECT_EQ(frame->header.type, static_cast<uint16_t>(type) | kReplyBit);
    return StatusOf(*frame, body);
  }
  Status Hello() {
    PayloadWriter hello;
    Encode(HelloRequest{kProtocolVersion, "raw peer"}, &hello);
    return Call(MessageType::kHello, hello.data());
  }
  // True when the daemon closes the connection within `timeout`.
  bool ClosedWithin(std::chrono::milliseconds timeout) {
    const Deadline deadline = Clock::now() + timeout;
    for (;;) {
      Frame frame;
      Status read = RecvFrame(fd_.get(), kMaxFrameBytes, deadline, "daemon", &frame);
      if (read.code() == StatusCode::kUnavailable) return true;
      if (!read.ok()) return false;
    }
  }
  // The Goodbye the daemon sent before closing.
  Status Goodbye() {
    auto frame = Read();
    if (!frame.ok()) return frame.status();
    EXPECT_EQ(frame->header.type, static_cast<uint16_t>(MessageType::kGoodbye));
    EXPECT_EQ(frame->header.request_id, 0u);
    Status why = StatusOf(*frame);
    EXPECT_TRUE(ClosedWithin(5s));
    return why;
  }

 private:
  Fd fd_;
  uint64_t next_id_ = 1;
};

std::string Header(uint32_t magic, uint16_t type, uint32_t length) {
  MessageHeader header;
  header.magic = magic;
  header.type = type;
  header.length = length;
  return std::string(reinterpret_cast<const char*>(&header), sizeof(header));
}

class HostileTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Status started = suite_.Start("hostile", {"--frame-timeout", "2s", "--log-level", "error"});
    ASSERT_TRUE(started.ok()) << started;
  }
  static void TearDownTestSuite() { suite_.Stop(); }

  void SetUp() override {
    ASSERT_TRUE(suite_.started());
    auto store = AttachedStoreClient::Attach(testing::AttachTo(suite_.daemon().socket));
    ASSERT_TRUE(store.ok()) << store.status();
    good_ = std::move(*store);
  }

  // The well-behaved client still gets served, and the daemon process still runs.
  void ExpectServing() {
    std::string value = "still here";
    ASSERT_TRUE(good_->Put("hostile/probe", std::as_bytes(std::span(value))).ok());
    auto got = good_->Get("hostile/probe");
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, value);
    EXPECT_EQ(waitpid(suite_.daemon().process.pid(), nullptr, WNOHANG), 0) << "the daemon exited";
  }

  RawPeer Connect() {
    auto peer = RawPeer::Connect(suite_.daemon().socket);
    EXPECT_TRUE(peer.ok()) << peer.status();
    return peer.ok() ? std::move(*peer) : RawPeer();
  }

  static inline testing::SuiteDeployment suite_;
  std::unique_ptr<AttachedStoreClient> good_;
};

TEST_F(HostileTest, GarbageHeaderGetsAGoodbye) {
  RawPeer peer = Connect();
  ASSERT_TRUE(peer.SendBytes(std::string(24, 'G')).ok());
  Status why = peer.Goodbye();
  EXPECT_EQ(why.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(why.message().find("magic"), std::string::npos) << why;
  ExpectServing();
}

TEST_F(HostileTest, OversizedFrameIsRefusedBeforeItsPayload) {
  RawPeer peer = Connect();
  ASSERT_TRUE(peer.Hello().ok());
  // 1 GiB announced, nothing sent: the daemon must refuse without reading or allocating it.
  ASSERT_TRUE(peer.SendBytes(Header(kMessageMagic, static_cast<uint16_t>(MessageType::kBatchExist),
                                    1u << 30))
                  .ok());
  Status why = peer.Goodbye();
  EXPECT_EQ(why.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(why.message().find("exceeds the limit of 67108864"), std::string::npos) << why;
  ExpectServing();
}

TEST_F(HostileTest, TheFirstRequestMustBeHello) {
  RawPeer peer = Connect();
  PayloadWriter keys;
  keys.Keys(std::vector<std::string>{"k"});
  ASSERT_TRUE(peer.Send(MessageType::kBatchExist, keys.data()).ok());
  Status why = peer.Goodbye();
  EXPECT_EQ(why.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(why.message().find("must be Hello"), std::string::npos) << why;

  RawPeer version = Connect();
  PayloadWriter hello;
  Encode(HelloRequest{99, "future"}, &hello);
  EXPECT_EQ(version.Call(MessageType::kHello, hello.data()).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_TRUE(version.ClosedWithin(5s));
  ExpectServing();
}

TEST_F(HostileTest, UnknownTypesEndTheConnection) {
  for (uint16_t type :
       {uint16_t{0},
        static_cast<uint16_t>(static_cast<uint16_t>(MessageType::kBatchRemoveScoped) + 1),
        uint16_t{0x7fff}, static_cast<uint16_t>(0x8000 | 4)}) {
    RawPeer peer = Connect();
    ASSERT_TRUE(peer.Hello().ok());
    ASSERT_TRUE(peer.SendBytes(Header(kMessageMagic, type, 0)).ok());
    Status why = peer.Goodbye();
    EXPECT_EQ(why.code(), StatusCode::kInvalidArgument) << type;
    EXPECT_NE(why.message().find("unknown request"), std::string::npos) << why;
  }
  ExpectServing();
}

TEST_F(HostileTest, MalformedPayloadsGetErrorRepliesOnALiveConnection) {
  RawPeer peer = Connect();
  ASSERT_TRUE(peer.Hello().ok());
  PayloadWriter truncated;
  truncated.PutConfig(PutConfig{});
  truncated.U32(3);  // three items promised, none sent
  Status status = peer.Call(MessageType::kBatchPutFrom, truncated.data());
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("malformed payload"), std::string::npos) << status;

  PayloadWriter too_many;
  too_many.U32(kMaxBatchKeys + 1);
  status = peer.Call(MessageType::kBatchExist, too_many.data());
  EXPECT_NE(status.message().find("split the batch"), std::string::npos) << status;

  PayloadWriter long_key;
  long_key.U32(1);
  long_key.String(std::string(kMaxKeyBytes + 1, 'k'));
  status = peer.Call(MessageType::kBatchExist, long_key.data());
  EXPECT_NE(status.message().find("exceeds the limit"), std::string::npos) << status;

  status = peer.Call(MessageType::kGetSize, "\x01");
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);

  // The connection still works.
  PayloadWriter keys;
  keys.Keys(std::vector<std::string>{"hostile/none"});
  std::string body;
  ASSERT_TRUE(peer.Call(MessageType::kBatchExist, keys.data(), &body).ok());
  PayloadReader in(body);
  auto exists = DecodeBools(&in, 1);
  ASSERT_TRUE(in.Finish().ok());
  EXPECT_FALSE(*exists[0]);
  ExpectServing();
}

TEST_F(HostileTest, AddressesOutsideSharedRegionsFailPerItem) {
  RawPeer peer = Connect();
  ASSERT_TRUE(peer.Hello().ok());
  SharedMemfd memory(1 << 20, F_SEAL_SHRINK | F_SEAL_GROW);
  ASSERT_TRUE(memory.status.ok()) << memory.status;
  // Registered at a made-up client address: only translation decides what it names.
  const uint64_t base = 0x7000'0000'0000;
  PayloadWriter reg;
  Encode(RegisterSharedRequest{base, 1 << 20, 0}, &reg);
  ASSERT_TRUE(peer.Call(MessageType::kRegisterShared, reg.data(), nullptr, memory.fd.get()).ok());
  std::memset(memory.data, 'v', 1000);

  std::vector<KeyedBuffer> items = {
      {"hostile/in", {base, 1000}},         {"hostile/past-end", {base + (1 << 20) - 10, 11}},
      {"hostile/before", {base - 1, 10}},   {"hostile/wraps", {base + 10, UINT64_MAX - 5}},
      {"hostile/top", {UINT64_MAX - 3, 8}}, {"hostile/null", {0, 16}},
  };
  PayloadWriter put;
  put.PutConfig(PutConfig{});
  EncodeKeyedBuffers(items, &put);
  std::string body;
  ASSERT_TRUE(peer.Call(MessageType::kBatchPutFrom, put.data(), &body).ok());
  PayloadReader in(body);
  auto statuses = DecodeStatuses(&in, items.size());
  ASSERT_TRUE(in.Finish().ok());
  EXPECT_TRUE(statuses[0].ok()) << statuses[0];
  for (size_t i = 1; i < items.size(); ++i) {
    EXPECT_EQ(statuses[i].code(), StatusCode::kFailedPrecondition) << items[i].key;
    EXPECT_NE(statuses[i].message().find("not inside memory this client shares"), std::string::npos)
        << statuses[i];
  }
  // Gets into bad ranges fail the same way; nothing is written anywhere.
  std::vector<KeyedBuffer> gets = {{"hostile/in", {base + (1 << 20) - 500, 1000}}};
  PayloadWriter get;
  EncodeKeyedBuffers(gets, &get);
  ASSERT_TRUE(peer.Call(MessageType::kBatchGetInto, get.data(), &body).ok());
  PayloadReader get_in(body);
  auto sizes = DecodeSizes(&get_in, 1);
  ASSERT_TRUE(get_in.Finish().ok());
  EXPECT_EQ(sizes[0].status().code(), StatusCode::kFailedPrecondition);
  // A region of another connection is not this one's.
  RawPeer other = Connect();
  ASSERT_TRUE(other.Hello().ok());
  PayloadWriter foreign;
  EncodeKeyedBuffers(std::vector<KeyedBuffer>{{"hostile/in", {base, 1000}}}, &foreign);
  ASSERT_TRUE(other.Call(MessageType::kBatchGetInto, foreign.data(), &body).ok());
  PayloadReader foreign_in(body);
  auto foreign_sizes = DecodeSizes(&foreign_in, 1);
  ASSERT_TRUE(foreign_in.Finish().ok());
  EXPECT_EQ(foreign_sizes[0].status().code(), StatusCode::kFailedPrecondition);
  ExpectServing();
}

TEST_F(HostileTest, BadFdsAreRefused) {
  RawPeer peer = Connect();
  ASSERT_TRUE(peer.Hello().ok());
  const uint64_t base = 0x6000'0000'0000;
  PayloadWriter reg;
  Encode(RegisterSharedRequest{base, 1 << 16, 0}, &reg);

  Status none = peer.Call(MessageType::kRegisterShared, reg.data());
  EXPECT_NE(none.message().find("carries no fd"), std::string::npos) << none;

  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  Fd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  Status pipe_status = peer.Call(MessageType::kRegisterShared, reg.data(), nullptr, read_end.get());
  EXPECT_NE(pipe_status.message().find("not a memfd"), std::string::npos) << pipe_status;

  SharedMemfd unsealed(1 << 16, 0);
  ASSERT_TRUE(unsealed.status.ok()) << unsealed.status;
  Status unsealed_status =
      peer.Call(MessageType::kRegisterShared, reg.data(), nullptr, unsealed.fd.get());
  EXPECT_NE(unsealed_status.message().find("F_SEAL_SHRINK"), std::string::npos) << unsealed_status;

  SharedMemfd small(4096, F_SEAL_SHRINK);
  ASSERT_TRUE(small.status.ok()) << small.status;
  Status small_status =
      peer.Call(MessageType::kRegisterShared, reg.data(), nullptr, small.fd.get());
  EXPECT_NE(small_status.message().find("fewer than"), std::string::npos) << small_status;

  // A fd on a request that takes none.
  PayloadWriter keys;
  keys.Keys(std::vector<std::string>{"k"});
  Status stray = peer.Call(MessageType::kBatchExist, keys.data(), nullptr, small.fd.get());
  EXPECT_NE(stray.message().find("file descriptor"), std::string::npos) << stray;
  ExpectServing();
}

TEST_F(HostileTest, StalledAndFloodingPeersDoNotBlockOthers) {
  // One peer stops mid-header, others send random bytes as fast as they can.
  RawPeer stalled = Connect();
  ASSERT_TRUE(stalled.SendBytes(Header(kMessageMagic, 1, 0).substr(0, 10)).ok());
  std::vector<std::thread> floods;
  for (int t = 0; t < 4; ++t) {
    floods.emplace_back([t] {
      std::mt19937_64 rng(t);
      for (int round = 0; round < 25; ++round) {
        auto peer = RawPeer::Connect(suite_.daemon().socket);
        if (!peer.ok()) continue;
        if (round % 2 == 0) peer->Hello().IgnoreError();
        std::string junk(rng() % 4096, '\0');
        for (char& c : junk) c = static_cast<char>(rng());
        peer->SendBytes(junk).IgnoreError();
      }
    });
  }
  ExpectServing();
  for (std::thread& flood : floods) flood.join();
  ExpectServing();
  // The stalled frame is dropped after --frame-timeout (2 s).
  Status why = stalled.Goodbye();
  EXPECT_EQ(why.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(why.message().find("did not arrive whole"), std::string::npos) << why;
  ExpectServing();
}

TEST_F(HostileTest, APeerOfAnotherUidIsRefused) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "needs root to run a peer as uid " << kUnprivilegedUid;
  }
  auto address = ResolveSocketAddress(suite_.daemon().socket);
  ASSERT_TRUE(address.ok());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, address->name.data(), address->name.size());
  const auto len =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + address->name.size());
  int out[2];
  ASSERT_EQ(pipe2(out, O_CLOEXEC), 0);
  // The child only makes system calls (this process has threads): switch uid, connect, and
  // pass on whatever the daemon sends.
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(out[0]);
    if (setgroups(0, nullptr) != 0 ||
        setresgid(kUnprivilegedUid, kUnprivilegedUid, kUnprivilegedUid) != 0 ||
        setresuid(kUnprivilegedUid, kUnprivilegedUid, kUnprivilegedUid) != 0) {
      _exit(10);
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) _exit(11);
    static char buffer[8192];
    size_t got = 0;
    for (;;) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 10000) <= 0) break;
      ssize_t n = read(fd, buffer + got, sizeof(buffer) - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
      if (got == sizeof(buffer)) break;
    }
    _exit(write(out[1], buffer, got) == static_cast<ssize_t>(got) ? 0 : 12);
  }
  close(out[1]);
  Fd from_child(out[0]);
  std::string bytes;
  char chunk[4096];
  for (;;) {
    pollfd p{from_child.get(), POLLIN, 0};
    if (poll(&p, 1, 30000) <= 0) break;
    ssize_t n = read(from_child.get(), chunk, sizeof(chunk));
    if (n <= 0) break;
    bytes.append(chunk, static_cast<size_t>(n));
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  ASSERT_GE(bytes.size(), sizeof(MessageHeader));
  MessageHeader header;
  std::memcpy(&header, bytes.data(), sizeof(header));
  EXPECT_TRUE(CheckHeader(header, kMaxFrameBytes).ok());
  EXPECT_EQ(header.type, static_cast<uint16_t>(MessageType::kGoodbye));
  ASSERT_EQ(bytes.size(), sizeof(header) + header.length);
  PayloadReader in(std::string_view(bytes).substr(sizeof(header)));
  Status why = in.GetStatus();
  EXPECT_EQ(why.code(), StatusCode::kPermissionDenied) << why;
  EXPECT_NE(why.message().find("uid 65534 may not attach"), std::string::npos) << why;
  ExpectServing();
}

}  // namespace
}  // namespace larder::standalone
