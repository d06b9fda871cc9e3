// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The shm handoff server against bad input (malformed, truncated, stalled and random requests
// each get a clear reply or a closed connection, and the server keeps serving), and the mutual
// token proof against impostor owners and relays.
#include "transfer/shm/shm_handoff.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/memory.h"
#include "larder/transfer_engine.h"
#include "transfer/segment_exports.h"
#include "transfer/testing/test_util.h"

namespace larder::transfer {
namespace {

using namespace std::chrono_literals;

// The identity a test's hand-rolled peer presents.
EngineContext PeerContext(const std::string& token) {
  EngineContext context;
  context.engine_id = "handoff-test-peer/" + std::to_string(getpid()) + "/0";
  context.auth_token = token;
  return context;
}

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
    ASSERT_NE(descriptor_.TransportBlob("shm"), nullptr);
  }

  Fd Connect() {
    auto fd = UnixConnectAbstract(descriptor_.transports.at("shm"), Clock::now() + 1s);
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
    auto fd = RequestSegmentFd(descriptor_, PeerContext(""), Clock::now() + 3s, &size, &owner);
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
  auto fd = RequestSegmentFd(unknown, PeerContext(""), Clock::now() + 3s, &size, &owner);
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), StatusCode::kNotFound) << fd.status();

  SegmentDescriptor stale = descriptor_;
  stale.epoch ^= 1;
  fd = RequestSegmentFd(stale, PeerContext(""), Clock::now() + 3s, &size, &owner);
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

// An owner served by a ShmHandoffServer of its own, with a chosen exchange timeout.
class HandoffOwner {
 public:
  explicit HandoffOwner(std::chrono::milliseconds timeout) {
    auto memory = AllocateMemfd("larder-handoff-test", 1 << 20, HugePages::kOff);
    EXPECT_TRUE(memory.ok()) << memory.status();
    if (!memory.ok()) return;
    descriptor_.segment_id = 1;
    descriptor_.epoch = 0x5eed;
    descriptor_.name = "kv";
    descriptor_.engine_id = "handoff-test-owner/" + std::to_string(getpid()) + "/0";
    descriptor_.host_id = "handoff-test-host";
    descriptor_.size = (*memory)->size();
    descriptor_.memory_kind = MemoryKind::kMemfd;
    exports_.Publish(descriptor_, static_cast<uint8_t*>((*memory)->data()), *memory);
    EngineContext context;
    context.engine_id = descriptor_.engine_id;
    context.host_id = descriptor_.host_id;
    context.exports = &exports_;
    server_ = std::make_unique<ShmHandoffServer>(context, std::vector<uint32_t>{}, timeout);
    const std::string socket =
        "larder-handoff-test/" + std::to_string(getpid()) + "/" + std::to_string(next_socket_++);
    Status started = server_->Start(socket);
    EXPECT_TRUE(started.ok()) << started;
    descriptor_.transports["shm"] = socket;
  }

  const SegmentDescriptor& descriptor() const { return descriptor_; }

  Result<Fd> Request() {
    uint64_t size = 0;
    pid_t owner = 0;
    return RequestSegmentFd(descriptor_, PeerContext(""), Clock::now() + 5s, &size, &owner);
  }

  // A connection that has read its greeting and then sends `bytes` of its request, no more.
  Fd Stall(size_t bytes) {
    auto fd = UnixConnectAbstract(descriptor_.transports.at("shm"), Clock::now() + 5s);
    EXPECT_TRUE(fd.ok()) << fd.status();
    if (!fd.ok()) return Fd();
    HandoffServerMessage hello;
    Fd passed;
    EXPECT_TRUE(
        RecvWithFd(fd->get(), &hello, sizeof(hello), &passed, Clock::now() + 5s, "owner").ok());
    EXPECT_EQ(hello.type, HandoffServerMessage::kHello);
    std::vector<uint8_t> part(bytes, 0);
    if (bytes > 0) {
      EXPECT_TRUE(SendAll(fd->get(), part.data(), part.size(), Clock::now() + 5s, "owner").ok());
    }
    return std::move(fd).value();
  }

 private:
  static inline std::atomic<int> next_socket_{0};
  SegmentExports exports_;
  SegmentDescriptor descriptor_;
  std::unique_ptr<ShmHandoffServer> server_;
};

// True when the owner has neither written to nor closed `fd` (after the greeting it read).
bool StillWaiting(int fd) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, 0) == 0;
}

TEST(ShmHandoffServerTest, StalledPeersDoNotDelayOthers) {
  // Exchanges time out only after a minute: a peer served now was served beside the stalled
  // ones, not after they timed out.
  HandoffOwner owner(60s);
  std::vector<Fd> stalled;
  for (size_t bytes : {size_t{0}, size_t{0}, size_t{1}, size_t{20}, sizeof(HandoffRequest) - 1}) {
    stalled.push_back(owner.Stall(bytes));
  }
  for (int i = 0; i < 3; ++i) {
    auto fd = owner.Request();
    ASSERT_TRUE(fd.ok()) << fd.status();
  }
  for (const Fd& fd : stalled) EXPECT_TRUE(StillWaiting(fd.get()));
}

TEST(ShmHandoffServerTest, AStalledPeerIsDroppedAtItsDeadline) {
  HandoffOwner owner(100ms);
  Fd stalled = owner.Stall(20);
  // The owner closes the connection without a reply once the exchange's time is up.
  HandoffServerMessage reply;
  Fd passed;
  Status read =
      RecvWithFd(stalled.get(), &reply, sizeof(reply), &passed, Clock::now() + 10s, "owner");
  EXPECT_EQ(read.code(), StatusCode::kUnavailable) << read;
  EXPECT_FALSE(passed.valid());
  EXPECT_TRUE(owner.Request().ok());
}

TEST(ShmHandoffServerTest, BeyondTheCapAPeerIsToldToRetry) {
  HandoffOwner owner(60s);
  std::vector<Fd> stalled;
  for (size_t i = 0; i < kMaxPendingHandoffs; ++i) stalled.push_back(owner.Stall(0));
  auto refused = owner.Request();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable) << refused.status();
  EXPECT_NE(refused.status().message().find("shm handoffs already; retry"), std::string::npos)
      << refused.status();
  // One stalled peer leaves: its place goes to the next peer.
  stalled.pop_back();
  EXPECT_TRUE(testutil::WaitUntil([&] { return owner.Request().ok(); }, 10s));
  for (const Fd& fd : stalled) EXPECT_TRUE(StillWaiting(fd.get()));
}

TEST_F(ShmHandoffTest, RandomBytesNeverCrashTheServer) {
  std::mt19937_64 rng(1234);
  for (int i = 0; i < 200; ++i) {
    Fd conn = Connect();
    HandoffServerMessage hello;
    Fd passed;
    if (!ReadMessage(conn.get(), &hello, &passed)) continue;
    // Up to beyond a whole request, so that complete random requests get checked too.
    std::vector<uint8_t> junk(rng() % (sizeof(HandoffRequest) + 100));
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

TEST_F(ShmHandoffTest, OverlongFieldLengthsGetInvalidArgumentAndNoFd) {
  Fd conn = Connect();
  HandoffServerMessage hello;
  Fd passed;
  ASSERT_TRUE(ReadMessage(conn.get(), &hello, &passed));
  HandoffRequest request;
  request.segment_id = descriptor_.segment_id;
  request.epoch = descriptor_.epoch;
  request.socket_len = static_cast<uint8_t>(kHandoffMaxSocketName + 1);
  ASSERT_TRUE(SendAll(conn.get(), &request, sizeof(request), Clock::now() + 1s, "server").ok());
  HandoffServerMessage reply;
  ASSERT_TRUE(ReadMessage(conn.get(), &reply, &passed));
  EXPECT_EQ(static_cast<StatusCode>(reply.code), StatusCode::kInvalidArgument);
  EXPECT_FALSE(passed.valid());
  ExpectServing();
}

TEST(ShmHandoffProofTest, ProofsBindEveryField) {
  uint8_t owner_nonce[kHandoffNonceBytes] = {1};
  uint8_t peer_nonce[kHandoffNonceBytes] = {2};
  uint8_t other_nonce[kHandoffNonceBytes] = {3};
  HandoffBinding base{owner_nonce, peer_nonce, "owner", "larder-shm/owner", "peer", 7, 9};
  const auto reference = HandoffPeerMac("token", base);
  std::vector<HandoffBinding> changed(7, base);
  changed[0].owner_nonce = other_nonce;
  changed[1].peer_nonce = other_nonce;
  changed[2].owner_engine_id = "owner2";
  changed[3].socket_name = "larder-shm/relay";
  changed[4].peer_engine_id = "peer2";
  changed[5].segment_id = 8;
  changed[6].epoch = 10;
  for (size_t i = 0; i < changed.size(); ++i) {
    EXPECT_FALSE(DigestEqual(HandoffPeerMac("token", changed[i]).data(), reference.data()))
        << "field " << i << " is not bound";
  }
  EXPECT_FALSE(DigestEqual(HandoffPeerMac("other", base).data(), reference.data()));
  // The owner's proof is never the peer's proof reflected back, and binds its reply.
  const auto owner = HandoffOwnerMac("token", base, 0, 4096);
  EXPECT_FALSE(DigestEqual(owner.data(), reference.data()));
  EXPECT_FALSE(DigestEqual(HandoffOwnerMac("token", base, 0, 8192).data(), owner.data()));
  EXPECT_FALSE(DigestEqual(HandoffOwnerMac("token", base, 7, 4096).data(), owner.data()));
}

// ---- Mutual authentication: impostor owners and relays ----

constexpr char kToken[] = "shm-handoff-test-token";
constexpr uint64_t kSegmentBytes = 1 << 20;
constexpr uint8_t kPlantedByte = 0x5a;

// A unique abstract socket name for a server written in a test.
std::string TestSocketName(const std::string& role) {
  static std::atomic<int> counter{0};
  return "larder-test/" + std::to_string(getpid()) + "/" + std::to_string(counter++) + "/" + role;
}

// A handoff server written by a test, playing an attacker: it runs `serve` on each connection it
// accepts on the abstract socket `name`, one at a time, until Stop.
class FakeHandoffServer {
 public:
  FakeHandoffServer(const std::string& name, std::function<void(int conn)> serve)
      : name_(name), serve_(std::move(serve)) {
    auto listener = UnixListenAbstract(name);
    EXPECT_TRUE(listener.ok()) << listener.status();
    if (listener.ok()) listener_ = std::move(listener).value();
    thread_ = std::thread([this] {
      while (!stopping_.load() && listener_.valid()) {
        pollfd p{listener_.get(), POLLIN, 0};
        if (poll(&p, 1, 50) <= 0) continue;
        Fd conn(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
        if (!conn.valid()) continue;
        serve_(conn.get());
        connections_.fetch_add(1);
      }
    });
  }
  ~FakeHandoffServer() { Stop(); }

  const std::string& name() const { return name_; }
  // Connections served to the end so far.
  int connections() const { return connections_.load(); }
  // Joins the serving thread, so that whatever `serve` recorded is final.
  void Stop() {
    stopping_.store(true);
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::string name_;
  std::function<void(int)> serve_;
  Fd listener_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> connections_{0};
  std::thread thread_;
};

// A memfd of kSegmentBytes filled with kPlantedByte: what an impostor would like a victim to map.
struct PlantedMemfd {
  PlantedMemfd() {
    fd = Fd(memfd_create("planted", MFD_CLOEXEC));
    EXPECT_TRUE(fd.valid());
    EXPECT_EQ(ftruncate(fd.get(), kSegmentBytes), 0);
    void* p = mmap(nullptr, kSegmentBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    EXPECT_NE(p, MAP_FAILED);
    bytes = static_cast<uint8_t*>(p);
    std::memset(bytes, kPlantedByte, kSegmentBytes);
  }
  ~PlantedMemfd() { munmap(bytes, kSegmentBytes); }
  bool Untouched() const {
    for (uint64_t i = 0; i < kSegmentBytes; ++i) {
      if (bytes[i] != kPlantedByte) return false;
    }
    return true;
  }
  Fd fd;
  uint8_t* bytes = nullptr;
};

std::unique_ptr<TransferEngine> MakeEngine(const std::string& protocol, const std::string& token) {
  TransferEngineOptions options;
  options.protocol = protocol;
  options.auth_token = token;
  auto engine = TransferEngine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(engine).value() : nullptr;
}

// Opens `descriptor` through `engine` and moves `buffer` to (kWrite) or from (kRead) the start of
// the segment; the first failure.
Status TransferThrough(TransferEngine& engine, const SegmentDescriptor& descriptor, TransferOp op,
                       std::vector<uint8_t>* buffer) {
  LARDER_ASSIGN_OR_RETURN(SegmentHandle handle, engine.OpenSegment(descriptor));
  TransferRequest r{op, buffer->data(), handle, 0, buffer->size()};
  auto results = engine.TransferSync({&r, 1}, 5s);
  engine.CloseSegment(handle).IgnoreError();
  if (!results.ok()) return results.status();
  return (*results)[0].status;
}

// An owner engine with the token, exporting one patterned memfd segment.
class ShmHandoffAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    owner_ = MakeEngine("auto", kToken);
    ASSERT_TRUE(owner_);
    auto memory = owner_->AllocateSegmentMemory(kSegmentBytes);
    ASSERT_TRUE(memory.ok()) << memory.status();
    memory_ = *memory;
    testutil::FillPattern(memory_->data(), memory_->size(), 42);
    ASSERT_TRUE(owner_->RegisterSegment("s", memory_).ok());
    descriptor_ = owner_->ListSegments().front();
    ASSERT_NE(descriptor_.TransportBlob("shm"), nullptr);
  }

  bool OwnerBytesUnchanged() const {
    std::vector<uint8_t> expected(memory_->size());
    testutil::FillPattern(expected.data(), expected.size(), 42);
    return std::memcmp(expected.data(), memory_->data(), expected.size()) == 0;
  }

  // A token-holding peer engine maps the real segment over shm and reads the right bytes.
  void ExpectHonestPeerServed() {
    auto peer = MakeEngine("shm", kToken);
    ASSERT_TRUE(peer);
    std::vector<uint8_t> buffer(kSegmentBytes);
    Status read = TransferThrough(*peer, descriptor_, TransferOp::kRead, &buffer);
    ASSERT_TRUE(read.ok()) << read;
    EXPECT_EQ(std::memcmp(buffer.data(), memory_->data(), buffer.size()), 0);
  }

  // What a token-holding victim gets from `descriptor`: its read and its write must both fail
  // with PermissionDenied, without planted bytes reaching its buffer.
  void ExpectVictimRefuses(const SegmentDescriptor& descriptor, const std::string& why) {
    auto victim = MakeEngine("shm", kToken);
    ASSERT_TRUE(victim);
    std::vector<uint8_t> buffer(kSegmentBytes, 0);
    Status read = TransferThrough(*victim, descriptor, TransferOp::kRead, &buffer);
    EXPECT_EQ(read.code(), StatusCode::kPermissionDenied) << read;
    EXPECT_NE(read.message().find(why), std::string::npos) << read;
    EXPECT_EQ(std::count(buffer.begin(), buffer.end(), 0), static_cast<long>(buffer.size()))
        << "the victim's buffer received bytes";
    std::vector<uint8_t> secret(kSegmentBytes, 0xc3);
    Status write = TransferThrough(*victim, descriptor, TransferOp::kWrite, &secret);
    EXPECT_EQ(write.code(), StatusCode::kPermissionDenied) << write;
  }

  std::unique_ptr<TransferEngine> owner_;
  std::shared_ptr<MemoryRegion> memory_;
  SegmentDescriptor descriptor_;
};

TEST_F(ShmHandoffAuthTest, PeersThatBothHoldTheTokenHandOver) {
  uint64_t size = 0;
  pid_t owner_pid = 0;
  auto fd =
      RequestSegmentFd(descriptor_, PeerContext(kToken), Clock::now() + 3s, &size, &owner_pid);
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(size, kSegmentBytes);
  EXPECT_EQ(owner_pid, getpid());
  ExpectHonestPeerServed();
}

TEST_F(ShmHandoffAuthTest, WrongTokenIsRefused) {
  uint64_t size = 0;
  pid_t owner_pid = 0;
  auto fd = RequestSegmentFd(descriptor_, PeerContext("not-the-token"), Clock::now() + 3s, &size,
                             &owner_pid);
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), StatusCode::kPermissionDenied) << fd.status();
  EXPECT_NE(fd.status().message().find("wrong cluster token"), std::string::npos) << fd.status();

  auto peer = MakeEngine("shm", "not-the-token");
  ASSERT_TRUE(peer);
  auto handle = peer->OpenSegment(descriptor_);
  ASSERT_FALSE(handle.ok());
  EXPECT_EQ(handle.status().code(), StatusCode::kPermissionDenied) << handle.status();
  ExpectHonestPeerServed();
}

TEST_F(ShmHandoffAuthTest, PeerWithoutTokenIsRefused) {
  auto peer = MakeEngine("shm", "");
  ASSERT_TRUE(peer);
  auto handle = peer->OpenSegment(descriptor_);
  ASSERT_FALSE(handle.ok());
  EXPECT_EQ(handle.status().code(), StatusCode::kPermissionDenied) << handle.status();
  EXPECT_NE(handle.status().message().find("requires a cluster token"), std::string::npos)
      << handle.status();
  ExpectHonestPeerServed();
}

// Attack (a): a rogue process serves a socket named in a descriptor, asks for no proof and hands
// over a planted memfd. Without the owner's proof the victim must never use that fd: reading it
// would return the planted bytes as cache content, writing it would give the rogue the data.
TEST_F(ShmHandoffAuthTest, TokenHolderRefusesAnOwnerThatAsksNoProof) {
  PlantedMemfd planted;
  std::atomic<int> requests{0};
  FakeHandoffServer rogue(TestSocketName("rogue"), [&](int conn) {
    HandoffServerMessage hello;
    hello.type = HandoffServerMessage::kHello;
    hello.need_auth = 0;
    std::memcpy(hello.engine_id, descriptor_.engine_id.data(), descriptor_.engine_id.size());
    hello.engine_id_len = static_cast<uint8_t>(descriptor_.engine_id.size());
    if (!SendWithFd(conn, &hello, sizeof(hello), -1).ok()) return;
    HandoffRequest request;
    if (!RecvAll(conn, &request, sizeof(request), Clock::now() + 2s, "victim").ok()) return;
    requests.fetch_add(1);
    HandoffServerMessage reply;
    reply.type = HandoffServerMessage::kReply;
    reply.size = kSegmentBytes;
    SendWithFd(conn, &reply, sizeof(reply), planted.fd.get()).IgnoreError();
  });
  SegmentDescriptor impostor = descriptor_;
  impostor.transports["shm"] = rogue.name();
  ExpectVictimRefuses(impostor, "asks for no proof");
  rogue.Stop();
  EXPECT_GE(rogue.connections(), 2) << "the victim never dialed the rogue; the test proved nothing";
  EXPECT_EQ(requests.load(), 0) << "the victim sent a request to an owner that proved nothing";
  EXPECT_TRUE(planted.Untouched()) << "the victim's write landed in the planted memfd";
  EXPECT_TRUE(OwnerBytesUnchanged());
}

// The same rogue asking for a proof: it cannot answer with the owner's, so its fd is closed unused.
TEST_F(ShmHandoffAuthTest, TokenHolderRefusesAnOwnerReplyWithoutProof) {
  PlantedMemfd planted;
  FakeHandoffServer rogue(TestSocketName("rogue"), [&](int conn) {
    HandoffServerMessage hello;
    hello.type = HandoffServerMessage::kHello;
    hello.need_auth = 1;
    RandomBytes(hello.nonce, sizeof(hello.nonce));
    std::memcpy(hello.engine_id, descriptor_.engine_id.data(), descriptor_.engine_id.size());
    hello.engine_id_len = static_cast<uint8_t>(descriptor_.engine_id.size());
    if (!SendWithFd(conn, &hello, sizeof(hello), -1).ok()) return;
    HandoffRequest request;
    if (!RecvAll(conn, &request, sizeof(request), Clock::now() + 2s, "victim").ok()) return;
    HandoffServerMessage reply;
    reply.type = HandoffServerMessage::kReply;
    reply.size = kSegmentBytes;
    std::memcpy(reply.mac, request.mac, sizeof(reply.mac));  // the victim's own proof, reflected
    SendWithFd(conn, &reply, sizeof(reply), planted.fd.get()).IgnoreError();
  });
  SegmentDescriptor impostor = descriptor_;
  impostor.transports["shm"] = rogue.name();
  ExpectVictimRefuses(impostor, "without proof of the cluster token");
  rogue.Stop();
  EXPECT_GE(rogue.connections(), 2);
  EXPECT_TRUE(planted.Untouched()) << "the victim's write landed in the planted memfd";
}

TEST_F(ShmHandoffAuthTest, SocketServedByAnotherEngineIsRefused) {
  FakeHandoffServer rogue(TestSocketName("rogue"), [&](int conn) {
    HandoffServerMessage hello;
    hello.type = HandoffServerMessage::kHello;
    hello.need_auth = 1;
    std::string other = "some-other-engine";
    std::memcpy(hello.engine_id, other.data(), other.size());
    hello.engine_id_len = static_cast<uint8_t>(other.size());
    SendWithFd(conn, &hello, sizeof(hello), -1).IgnoreError();
  });
  SegmentDescriptor impostor = descriptor_;
  impostor.transports["shm"] = rogue.name();
  ExpectVictimRefuses(impostor, "is served by engine some-other-engine");
}

// Attack (b): a rogue relay without the token, which the victim dialed, talks to the real owner
// on the victim's behalf to obtain the owner's memfd (and then read or write it at will).
struct RelayMode {
  const char* name;
  // Passes the owner's greeting, nonce and all, to the victim; else greets with a nonce of its own.
  bool forward_nonce;
  // Claims in the forwarded request that the victim dialed the owner's socket.
  bool rewrite_socket;
};

void PrintTo(const RelayMode& mode, std::ostream* os) { *os << mode.name; }

class ShmHandoffRelayTest : public ShmHandoffAuthTest,
                            public ::testing::WithParamInterface<RelayMode> {};

TEST_P(ShmHandoffRelayTest, RelayNeverObtainsTheFd) {
  const RelayMode mode = GetParam();
  std::atomic<int> fds_obtained{0};
  std::atomic<int> owner_replies{0};
  std::atomic<int> owner_refusals{0};
  FakeHandoffServer relay(TestSocketName("relay"), [&](int victim) {
    Deadline deadline = Clock::now() + 2s;
    auto owner = UnixConnectAbstract(descriptor_.transports.at("shm"), deadline);
    if (!owner.ok()) return;
    HandoffServerMessage owner_hello;
    Fd none;
    if (!RecvWithFd(owner->get(), &owner_hello, sizeof(owner_hello), &none, deadline, "owner")
             .ok()) {
      return;
    }
    HandoffServerMessage hello = owner_hello;
    if (!mode.forward_nonce) RandomBytes(hello.nonce, sizeof(hello.nonce));
    if (!SendWithFd(victim, &hello, sizeof(hello), -1).ok()) return;
    HandoffRequest request;
    if (!RecvAll(victim, &request, sizeof(request), deadline, "victim").ok()) return;
    if (mode.rewrite_socket) {
      std::memset(request.socket, 0, sizeof(request.socket));
      std::memcpy(request.socket, descriptor_.transports.at("shm").data(),
                  descriptor_.transports.at("shm").size());
      request.socket_len = static_cast<uint8_t>(descriptor_.transports.at("shm").size());
    }
    if (!SendAll(owner->get(), &request, sizeof(request), deadline, "owner").ok()) return;
    HandoffServerMessage reply;
    Fd obtained;
    if (!RecvWithFd(owner->get(), &reply, sizeof(reply), &obtained, deadline, "owner").ok()) return;
    owner_replies.fetch_add(1);
    if (static_cast<StatusCode>(reply.code) == StatusCode::kPermissionDenied) {
      owner_refusals.fetch_add(1);
    }
    if (obtained.valid()) {
      fds_obtained.fetch_add(1);
      // What a relay would do with it: overwrite the owner's segment.
      void* p = mmap(nullptr, kSegmentBytes, PROT_READ | PROT_WRITE, MAP_SHARED, obtained.get(), 0);
      if (p != MAP_FAILED) {
        std::memset(p, 0x66, kSegmentBytes);
        munmap(p, kSegmentBytes);
      }
    }
    SendWithFd(victim, &reply, sizeof(reply), obtained.get()).IgnoreError();
  });
  SegmentDescriptor relayed = descriptor_;
  relayed.transports["shm"] = relay.name();
  ExpectVictimRefuses(relayed, "");
  relay.Stop();
  EXPECT_EQ(owner_replies.load(), 2)
      << "the relay did not reach the owner; the test proved nothing";
  EXPECT_EQ(owner_refusals.load(), 2);
  EXPECT_EQ(fds_obtained.load(), 0) << "the owner handed its memfd to a relay";
  EXPECT_TRUE(OwnerBytesUnchanged());
  ExpectHonestPeerServed();
}

INSTANTIATE_TEST_SUITE_P(Modes, ShmHandoffRelayTest,
                         ::testing::Values(RelayMode{"OwnNonce", false, false},
                                           RelayMode{"ForwardNonce", true, false},
                                           RelayMode{"OwnNonceRewriteSocket", false, true},
                                           RelayMode{"ForwardNonceRewriteSocket", true, true}),
                         [](const ::testing::TestParamInfo<RelayMode>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace larder::transfer
