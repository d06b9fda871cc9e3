// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Attacks on the tcp data plane, and TLS. A token-holding engine must refuse a data server that
// does not prove the token (it would capture writes and plant read bytes), and a relay between it
// and the real owner must gain nothing: neither a transparent proxy nor one that answers the hello
// itself with the owner's nonce. TLS moves bytes between engines with certificates from
// WriteTestCertificates, refuses a certificate from another CA, and mismatched configurations get
// clear errors.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/net.h"
#include "common/test_certs.h"
#include "larder/transfer_engine.h"
#include "transfer/testing/test_util.h"
#include "transfer/wire/auth.h"
#include "transfer/wire/frame.h"
#include "transfer/wire/stream.h"

namespace larder::transfer::tcp {
namespace {

using namespace wire;  // NOLINT: these tests speak the frame protocol

using std::chrono::seconds;
using testutil::FillPattern;
using testutil::ScopedEnv;

constexpr uint64_t kSegmentBytes = 4 << 20;
constexpr uint8_t kPlanted = 0xab;

Deadline Soon() { return Clock::now() + seconds(10); }

// Accepts connections on a loopback port and runs `handler` for each on its own thread. The
// destructor shuts every connection down and joins the threads.
class FakeServer {
 public:
  using Handler = std::function<void(Fd)>;

  explicit FakeServer(Handler handler) : handler_(std::move(handler)) {
    auto listener = TcpListen({"127.0.0.1", 0});
    EXPECT_TRUE(listener.ok()) << listener.status();
    if (!listener.ok()) return;
    listener_ = std::move(listener).value();
    address_ = "127.0.0.1:" + std::to_string(BoundPort(listener_.get()).value_or(0));
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }

  ~FakeServer() {
    stopping_ = true;
    if (accept_thread_.joinable()) accept_thread_.join();
    MutexLock lock(mu_);
    for (int fd : sockets_) shutdown(fd, SHUT_RDWR);
    for (auto& t : threads_) t.join();
    for (int fd : sockets_) close(fd);
  }

  const std::string& address() const { return address_; }

 private:
  void AcceptLoop() {
    while (!stopping_) {
      pollfd p{listener_.get(), POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      int fd = accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      MutexLock lock(mu_);
      // The handler gets its own descriptor of the socket; this one stays for the shutdown.
      sockets_.push_back(fd);
      threads_.emplace_back([this, fd] {
        handler_(Fd(dup(fd)));
        shutdown(fd, SHUT_RDWR);  // the peer sees the end even while our descriptor stays open
      });
    }
  }

  Handler handler_;
  Fd listener_;
  std::string address_;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  Mutex mu_;
  std::vector<int> sockets_ LARDER_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ LARDER_GUARDED_BY(mu_);
};

struct Frame {
  FrameHeader header;
  std::string payload;
};

Status SendFrame(TcpStream& stream, FrameHeader header, const std::string& payload = "") {
  header.length = header.type == FrameType::kRead ? header.length : payload.size();
  uint8_t raw[kFrameHeaderSize];
  EncodeHeader(header, raw);
  LARDER_RETURN_IF_ERROR(stream.SendAll(raw, sizeof(raw), Soon()));
  return stream.SendAll(payload.data(), payload.size(), Soon());
}

// Reads one frame; `from_client` says which side sent it (a client's kRead has a length but no
// payload).
Result<Frame> ReadFrame(TcpStream& stream, bool from_client) {
  uint8_t raw[kFrameHeaderSize];
  LARDER_RETURN_IF_ERROR(stream.RecvAll(raw, sizeof(raw), Soon()));
  Frame frame;
  LARDER_RETURN_IF_ERROR(DecodeHeader(raw, &frame.header));
  bool has_payload = !from_client || frame.header.type == FrameType::kWrite ||
                     frame.header.type == FrameType::kAuth;
  if (!has_payload) return frame;
  if (frame.header.length > kMaxFramePayload) return DataLossError("oversized frame");
  frame.payload.resize(frame.header.length);
  LARDER_RETURN_IF_ERROR(stream.RecvAll(frame.payload.data(), frame.payload.size(), Soon()));
  return frame;
}

// What a rogue data server saw and did.
struct RogueLog {
  std::atomic<int> auth_frames{0};
  std::atomic<int> data_frames{0};
  std::atomic<uint64_t> captured_bytes{0};
};

// Serves reads with planted bytes and swallows writes, like a data server without the token
// would. With `fake_proof` its hello asks for a proof (accepting any) and it answers with an
// AuthOk whose mac it cannot compute.
void ServeAsRogue(Fd fd, bool fake_proof, RogueLog* log) {
  TcpStream stream(std::move(fd), "client");
  FrameHeader hello;
  hello.type = FrameType::kHello;
  std::string payload;
  if (fake_proof) {
    AuthNonce nonce;
    RandomBytes(nonce.data(), nonce.size());
    hello.flags = kFlagNeedAuth;
    payload = EncodeHello(nonce, "rogue/1/0");
  }
  if (!SendFrame(stream, hello, payload).ok()) return;
  for (;;) {
    auto frame = ReadFrame(stream, /*from_client=*/true);
    if (!frame.ok()) return;
    FrameHeader reply;
    reply.request_id = frame->header.request_id;
    std::string body;
    switch (frame->header.type) {
      case FrameType::kAuth: {
        ++log->auth_frames;
        AuthMac guess;
        RandomBytes(guess.data(), guess.size());
        reply.type = FrameType::kAuthOk;
        body = EncodeAuthOk(guess);
        break;
      }
      case FrameType::kRead:
        ++log->data_frames;
        reply.type = FrameType::kReadReply;
        body.assign(frame->header.length, static_cast<char>(kPlanted));
        break;
      case FrameType::kWrite:
        ++log->data_frames;
        log->captured_bytes += frame->payload.size();
        reply.type = FrameType::kWriteReply;
        break;
      case FrameType::kDescribe:
        ++log->data_frames;
        reply.type = FrameType::kDescribeReply;
        body = "[]";
        break;
      default:
        return;
    }
    if (!SendFrame(stream, reply, body).ok()) return;
  }
}

// Copies bytes both ways between `a` and `b` until either side ends.
void Pump(int a, int b) {
  std::vector<char> buffer(1 << 16);
  int fds[2] = {a, b};
  for (;;) {
    pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
    if (poll(p, 2, 10'000) <= 0) return;
    for (int i = 0; i < 2; ++i) {
      if (p[i].revents == 0) continue;
      ssize_t n = recv(fds[i], buffer.data(), buffer.size(), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return;
      if (n > 0 && !SendAll(fds[1 - i], buffer.data(), n, Soon(), "relay").ok()) return;
    }
  }
}

// What a smart relay saw of the owner.
struct RelayLog {
  std::atomic<int> relayed_auths{0};
  std::atomic<bool> owner_accepted{false};     // the owner answered the relayed proof with AuthOk
  std::atomic<bool> owner_served_data{false};  // the owner answered the relay's own data frame
  std::atomic<int> client_data_frames{0};      // data frames the client sent the relay
};

struct SmartRelayOptions {
  HostPort owner;
  SegmentId segment_id = 0;
  bool forge_auth_ok = false;  // answer the client with a made-up AuthOk instead of the owner's
  // TLS towards the client (a certificate from the cluster's CA) and towards the owner.
  std::shared_ptr<const TlsContext> server_tls;
  std::shared_ptr<const TlsContext> client_tls;
};

// A relay without the token that answers the client's hello itself, with the owner's nonce and
// engine id, forwards the client's proof to the owner and then tries to use the owner's segment.
void ServeAsSmartRelay(Fd fd, const SmartRelayOptions& options, RelayLog* log) {
  TcpStream client(std::move(fd), "client");
  auto up = TcpConnect(options.owner, Soon());
  if (!up.ok()) return;
  TcpStream owner(std::move(up).value(), "owner");
  auto hello = ReadFrame(owner, /*from_client=*/false);
  if (!hello.ok() || !SendFrame(client, hello->header, hello->payload).ok()) return;
  if (hello->header.flags & kFlagTls) {
    if (!options.server_tls || !options.client_tls) return;
    if (!owner.StartTls(*options.client_tls, Soon()).ok()) return;
    if (!client.StartTls(*options.server_tls, Soon()).ok()) return;
  }
  auto auth = ReadFrame(client, /*from_client=*/true);
  if (!auth.ok() || auth->header.type != FrameType::kAuth) return;
  ++log->relayed_auths;
  if (!SendFrame(owner, auth->header, auth->payload).ok()) return;
  auto verdict = ReadFrame(owner, /*from_client=*/false);
  log->owner_accepted = verdict.ok() && verdict->header.type == FrameType::kAuthOk;
  if (options.forge_auth_ok || !verdict.ok()) {
    AuthMac guess;
    RandomBytes(guess.data(), guess.size());
    FrameHeader ok;
    ok.type = FrameType::kAuthOk;
    if (!SendFrame(client, ok, EncodeAuthOk(guess)).ok()) return;
  } else if (!SendFrame(client, verdict->header, verdict->payload).ok()) {
    return;
  }
  // Whatever the owner said, try to overwrite its segment.
  FrameHeader write;
  write.type = FrameType::kWrite;
  write.request_id = 99;
  write.segment_id = options.segment_id;
  if (SendFrame(owner, write, std::string(4096, static_cast<char>(kPlanted))).ok()) {
    auto reply = ReadFrame(owner, /*from_client=*/false);
    if (reply.ok() && reply->header.type != FrameType::kError) log->owner_served_data = true;
  }
  for (;;) {
    auto frame = ReadFrame(client, /*from_client=*/true);
    if (!frame.ok()) return;
    ++log->client_data_frames;
  }
}

// Keeps the engines of a test from seeing a token or TLS files from the environment.
class TcpSecurityTest : public ::testing::Test {
 protected:
  struct Owner {
    std::unique_ptr<TransferEngine> engine;
    std::shared_ptr<MemoryRegion> memory;
    SegmentId id = 0;
    std::vector<uint8_t> snapshot;  // the segment's bytes as filled

    SegmentDescriptor descriptor() const { return engine->ListSegments().at(0); }
    uint8_t* bytes() const { return static_cast<uint8_t*>(memory->data()); }
    bool Unchanged() const { return std::memcmp(bytes(), snapshot.data(), snapshot.size()) == 0; }
  };

  static TransferEngineOptions Options(const std::string& token) {
    TransferEngineOptions options;
    options.protocol = "tcp";
    options.auth_token = token;
    return options;
  }

  static std::unique_ptr<TransferEngine> Engine(const TransferEngineOptions& options) {
    auto engine = TransferEngine::Create(options);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? std::move(engine).value() : nullptr;
  }

  static Owner StartOwner(TransferEngineOptions options) {
    Owner owner;
    owner.engine = Engine(options);
    if (!owner.engine) return owner;
    auto memory = owner.engine->AllocateSegmentMemory(kSegmentBytes);
    EXPECT_TRUE(memory.ok()) << memory.status();
    if (!memory.ok()) return owner;
    owner.memory = std::move(memory).value();
    FillPattern(owner.bytes(), kSegmentBytes, 42);
    owner.snapshot.assign(owner.bytes(), owner.bytes() + kSegmentBytes);
    auto id = owner.engine->RegisterSegment("kv", owner.memory);
    EXPECT_TRUE(id.ok()) << id.status();
    owner.id = id.value_or(0);
    return owner;
  }

  // `descriptor` with its tcp endpoint replaced: what a client is told when someone points it
  // elsewhere (a stale or poisoned descriptor).
  static SegmentDescriptor PointedAt(SegmentDescriptor descriptor, const std::string& endpoint) {
    descriptor.transports["tcp"] = endpoint;
    descriptor.transports.erase("shm");
    return descriptor;
  }

  // One request through `engine` to the segment `descriptor` describes.
  static Status Transfer(TransferEngine* engine, const SegmentDescriptor& descriptor, TransferOp op,
                         void* buffer, uint64_t length, uint64_t offset = 0) {
    auto handle = engine->OpenSegment(descriptor);
    if (!handle.ok()) return handle.status();
    TransferRequest request{op, buffer, *handle, offset, length};
    auto results = engine->TransferSync({&request, 1}, seconds(10));
    if (!results.ok()) return results.status();
    return (*results)[0].status;
  }

  // Writes a fresh pattern through `engine` and reads it back, checking both the owner's memory
  // and the bytes read, byte for byte.
  static ::testing::AssertionResult RoundTrip(TransferEngine* engine, const Owner& owner,
                                              uint64_t offset, uint64_t length) {
    static uint64_t seed = 100;
    std::vector<uint8_t> source(length), destination(length, 0);
    FillPattern(source.data(), length, ++seed);
    SegmentDescriptor d = owner.descriptor();
    Status wrote = Transfer(engine, d, TransferOp::kWrite, source.data(), length, offset);
    if (!wrote.ok()) return ::testing::AssertionFailure() << "write: " << wrote;
    if (std::memcmp(owner.bytes() + offset, source.data(), length) != 0) {
      return ::testing::AssertionFailure() << "the owner's memory does not hold the written bytes";
    }
    Status read = Transfer(engine, d, TransferOp::kRead, destination.data(), length, offset);
    if (!read.ok()) return ::testing::AssertionFailure() << "read: " << read;
    if (destination != source) return ::testing::AssertionFailure() << "read back other bytes";
    return ::testing::AssertionSuccess();
  }

  ScopedEnv no_token_{"LARDER_AUTH_TOKEN", std::nullopt};
  ScopedEnv no_cert_{"LARDER_TLS_CERT", std::nullopt};
  ScopedEnv no_key_{"LARDER_TLS_KEY", std::nullopt};
  ScopedEnv no_ca_{"LARDER_TLS_CA", std::nullopt};
};

::testing::AssertionResult IsPermissionDenied(const Status& status, const std::string& says) {
  if (status.code() != StatusCode::kPermissionDenied) {
    return ::testing::AssertionFailure() << "want PermissionDenied, got " << status;
  }
  if (status.message().find(says) == std::string::npos) {
    return ::testing::AssertionFailure() << "message lacks '" << says << "': " << status;
  }
  return ::testing::AssertionSuccess() << status;
}

TEST_F(TcpSecurityTest, CorrectTokenPairReadsWritesAndDescribes) {
  Owner owner = StartOwner(Options("secret"));
  ASSERT_TRUE(owner.engine);
  auto client = Engine(Options("secret"));
  ASSERT_TRUE(client);
  auto listed = client->ListPeerSegments(owner.engine->address(), seconds(5));
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].name, "kv");
  EXPECT_EQ((*listed)[0].engine_id, owner.engine->id());
  EXPECT_TRUE(RoundTrip(client.get(), owner, 4096, 1 << 20));
}

// A descriptor that names one engine but leads to another's data server (another owner's
// descriptor copied and relabelled, or an endpoint that now belongs to someone else): the server
// proves the token, but as the other engine, and serves nothing of the segment.
TEST_F(TcpSecurityTest, AServerOfAnotherEngineThanTheDescriptorsServesNothing) {
  Owner a = StartOwner(Options("secret"));
  Owner b = StartOwner(Options("secret"));
  ASSERT_TRUE(a.engine && b.engine);
  auto client = Engine(Options("secret"));
  ASSERT_TRUE(client);
  SegmentDescriptor relabelled = a.descriptor();
  relabelled.engine_id = b.engine->id();
  SegmentDescriptor redirected = PointedAt(b.descriptor(), *a.descriptor().TransportBlob("tcp"));
  for (const SegmentDescriptor& d : {relabelled, redirected}) {
    std::vector<uint8_t> junk(4096, 0xEE), read(4096);
    EXPECT_TRUE(IsPermissionDenied(Transfer(client.get(), d, TransferOp::kWrite, junk.data(), 4096),
                                   "that the segment's descriptor names as its owner"));
    EXPECT_TRUE(IsPermissionDenied(Transfer(client.get(), d, TransferOp::kRead, read.data(), 4096),
                                   "that the segment's descriptor names as its owner"));
  }
  EXPECT_TRUE(a.Unchanged());
  EXPECT_TRUE(b.Unchanged());
  // Each owner's own descriptor works, from the same client.
  EXPECT_TRUE(RoundTrip(client.get(), a, 0, 64 << 10));
  EXPECT_TRUE(RoundTrip(client.get(), b, 0, 64 << 10));
}

TEST_F(TcpSecurityTest, TokenHoldingClientRefusesAServerThatProvesNoToken) {
  for (bool fake_proof : {false, true}) {
    SCOPED_TRACE(fake_proof ? "rogue answers with a made-up proof" : "rogue asks for no proof");
    RogueLog log;
    FakeServer rogue([&](Fd fd) { ServeAsRogue(std::move(fd), fake_proof, &log); });
    SegmentDescriptor d;
    d.segment_id = 1;
    d.name = "kv";
    d.epoch = 1;
    d.engine_id = "rogue/1/0";
    d.host_id = "rogue-host";
    d.transports["tcp"] = rogue.address();
    d.size = kSegmentBytes;
    const std::string says =
        fake_proof ? "failed to prove the cluster token" : "does not prove the cluster token";
    // A fresh client per request, so that each one really connects (no backoff in between).
    {
      auto client = Engine(Options("secret"));
      ASSERT_TRUE(client);
      std::vector<uint8_t> buffer(64 * 1024, 0);
      EXPECT_TRUE(IsPermissionDenied(
          Transfer(client.get(), d, TransferOp::kRead, buffer.data(), buffer.size()), says));
      EXPECT_EQ(std::count(buffer.begin(), buffer.end(), kPlanted), 0);
      EXPECT_EQ(buffer, std::vector<uint8_t>(buffer.size(), 0));
    }
    {
      auto client = Engine(Options("secret"));
      ASSERT_TRUE(client);
      std::vector<uint8_t> secret(64 * 1024);
      FillPattern(secret.data(), secret.size(), 7);
      EXPECT_TRUE(IsPermissionDenied(
          Transfer(client.get(), d, TransferOp::kWrite, secret.data(), secret.size()), says));
    }
    {
      auto client = Engine(Options("secret"));
      ASSERT_TRUE(client);
      EXPECT_TRUE(
          IsPermissionDenied(client->ListPeerSegments(rogue.address(), seconds(5)).status(), says));
    }
    EXPECT_EQ(log.data_frames.load(), 0);
    EXPECT_EQ(log.captured_bytes.load(), 0u);
    EXPECT_EQ(log.auth_frames.load() > 0, fake_proof);
  }
}

TEST_F(TcpSecurityTest, TransparentRelayGainsNothing) {
  Owner owner = StartOwner(Options("secret"));
  ASSERT_TRUE(owner.engine);
  auto owner_address = ParseHostPort(owner.engine->address());
  ASSERT_TRUE(owner_address.ok());
  std::atomic<int> relayed{0};
  FakeServer relay([&](Fd fd) {
    auto up = TcpConnect(*owner_address, Soon());
    if (!up.ok()) return;
    ++relayed;
    Pump(fd.get(), up->get());
  });
  SegmentDescriptor d = PointedAt(owner.descriptor(), relay.address());
  {
    auto client = Engine(Options("secret"));
    ASSERT_TRUE(client);
    std::vector<uint8_t> buffer(64 * 1024, 0);
    EXPECT_TRUE(IsPermissionDenied(
        Transfer(client.get(), d, TransferOp::kRead, buffer.data(), buffer.size()),
        "refusing a relayed proof"));
    EXPECT_EQ(buffer, std::vector<uint8_t>(buffer.size(), 0));
  }
  {
    auto client = Engine(Options("secret"));
    ASSERT_TRUE(client);
    std::vector<uint8_t> source(64 * 1024, 0x5a);
    EXPECT_TRUE(IsPermissionDenied(
        Transfer(client.get(), d, TransferOp::kWrite, source.data(), source.size()),
        "refusing a relayed proof"));
  }
  EXPECT_GE(relayed.load(), 2);
  EXPECT_TRUE(owner.Unchanged());
  // The owner still serves a client that dials it directly.
  auto direct = Engine(Options("secret"));
  ASSERT_TRUE(direct);
  EXPECT_TRUE(RoundTrip(direct.get(), owner, 0, 256 * 1024));
}

TEST_F(TcpSecurityTest, RelayAnsweringTheHelloItselfGainsNothing) {
  Owner owner = StartOwner(Options("secret"));
  ASSERT_TRUE(owner.engine);
  for (bool forge : {false, true}) {
    SCOPED_TRACE(forge ? "relay forges the AuthOk" : "relay forwards the owner's verdict");
    RelayLog log;
    SmartRelayOptions options;
    options.owner = ParseHostPort(owner.engine->address()).value();
    options.segment_id = owner.id;
    options.forge_auth_ok = forge;
    FakeServer relay([&](Fd fd) { ServeAsSmartRelay(std::move(fd), options, &log); });
    SegmentDescriptor d = PointedAt(owner.descriptor(), relay.address());
    {
      auto client = Engine(Options("secret"));
      ASSERT_TRUE(client);
      std::vector<uint8_t> buffer(64 * 1024, 0);
      Status read = Transfer(client.get(), d, TransferOp::kRead, buffer.data(), buffer.size());
      EXPECT_TRUE(IsPermissionDenied(
          read, forge ? "failed to prove the cluster token" : "refusing a relayed proof"));
      EXPECT_EQ(buffer, std::vector<uint8_t>(buffer.size(), 0));
    }
    {
      auto client = Engine(Options("secret"));
      ASSERT_TRUE(client);
      std::vector<uint8_t> source(64 * 1024, 0x5a);
      EXPECT_EQ(Transfer(client.get(), d, TransferOp::kWrite, source.data(), source.size()).code(),
                StatusCode::kPermissionDenied);
    }
    EXPECT_GE(log.relayed_auths.load(), 2);
    EXPECT_FALSE(log.owner_accepted.load());
    EXPECT_FALSE(log.owner_served_data.load());
    EXPECT_EQ(log.client_data_frames.load(), 0);
    EXPECT_TRUE(owner.Unchanged());
  }
  auto direct = Engine(Options("secret"));
  ASSERT_TRUE(direct);
  EXPECT_TRUE(RoundTrip(direct.get(), owner, 0, 256 * 1024));
}

TEST_F(TcpSecurityTest, ClientWithoutTokenIsRefusedByATokenServer) {
  Owner owner = StartOwner(Options("secret"));
  ASSERT_TRUE(owner.engine);
  auto tokenless = Engine(Options(""));
  ASSERT_TRUE(tokenless);
  std::vector<uint8_t> buffer(4096);
  EXPECT_TRUE(IsPermissionDenied(Transfer(tokenless.get(), owner.descriptor(), TransferOp::kRead,
                                          buffer.data(), buffer.size()),
                                 "requires a cluster token and none is configured"));
  auto wrong = Engine(Options("wrong"));
  ASSERT_TRUE(wrong);
  EXPECT_TRUE(IsPermissionDenied(
      Transfer(wrong.get(), owner.descriptor(), TransferOp::kWrite, buffer.data(), buffer.size()),
      "wrong cluster token"));
  EXPECT_TRUE(owner.Unchanged());
}

class TcpTlsTest : public TcpSecurityTest {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "larder-tcp-tls-XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    auto certs = larder::testing::WriteTestCertificates(dir_);
    ASSERT_TRUE(certs.ok()) << certs.status();
    certs_ = *certs;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  TransferEngineOptions TlsOptions(const std::string& token) const {
    TransferEngineOptions options = Options(token);
    options.tls_cert_file = certs_.cert_file;
    options.tls_key_file = certs_.key_file;
    options.tls_ca_file = certs_.ca_file;
    return options;
  }

  std::string dir_;
  larder::testing::TestCertificates certs_;
};

TEST_F(TcpTlsTest, EnginesMoveBytesOverTls) {
  for (const std::string token : {"secret", ""}) {
    SCOPED_TRACE(token.empty() ? "TLS without a token" : "TLS and a token");
    Owner owner = StartOwner(TlsOptions(token));
    ASSERT_TRUE(owner.engine);
    // The owner's hello offers TLS.
    auto raw = TcpConnect(ParseHostPort(owner.engine->address()).value(), Soon());
    ASSERT_TRUE(raw.ok()) << raw.status();
    TcpStream probe(std::move(raw).value(), "owner");
    auto hello = ReadFrame(probe, /*from_client=*/false);
    ASSERT_TRUE(hello.ok()) << hello.status();
    EXPECT_NE(hello->header.flags & kFlagTls, 0);

    auto client = Engine(TlsOptions(token));
    ASSERT_TRUE(client);
    auto listed = client->ListPeerSegments(owner.engine->address(), seconds(5));
    ASSERT_TRUE(listed.ok()) << listed.status();
    ASSERT_EQ(listed->size(), 1u);
    // Several slices over several connections, written and read back byte for byte.
    EXPECT_TRUE(RoundTrip(client.get(), owner, 12345, 3 << 20));
    EXPECT_TRUE(RoundTrip(client.get(), owner, 0, 100));
  }
}

TEST_F(TcpTlsTest, ClientTrustingAnotherCaFailsTheHandshake) {
  Owner owner = StartOwner(TlsOptions("secret"));
  ASSERT_TRUE(owner.engine);
  TransferEngineOptions options = TlsOptions("secret");
  options.tls_ca_file = certs_.other_ca_file;
  auto client = Engine(options);
  ASSERT_TRUE(client);
  std::vector<uint8_t> buffer(4096, 0);
  EXPECT_TRUE(IsPermissionDenied(
      Transfer(client.get(), owner.descriptor(), TransferOp::kRead, buffer.data(), buffer.size()),
      "does not verify"));
  EXPECT_TRUE(IsPermissionDenied(
      client->ListPeerSegments(owner.engine->address(), seconds(5)).status(), "does not verify"));
  EXPECT_EQ(buffer, std::vector<uint8_t>(buffer.size(), 0));
}

TEST_F(TcpTlsTest, TlsClientRefusesAPlainServer) {
  Owner owner = StartOwner(Options("secret"));
  ASSERT_TRUE(owner.engine);
  TransferEngineOptions options = Options("secret");
  options.tls_ca_file = certs_.ca_file;
  auto client = Engine(options);
  ASSERT_TRUE(client);
  std::vector<uint8_t> source(4096, 0x77);
  EXPECT_TRUE(IsPermissionDenied(
      Transfer(client.get(), owner.descriptor(), TransferOp::kWrite, source.data(), source.size()),
      "does not offer TLS"));
  EXPECT_TRUE(owner.Unchanged());
}

TEST_F(TcpTlsTest, PlainClientGetsAClearErrorFromATlsServer) {
  Owner owner = StartOwner(TlsOptions("secret"));
  ASSERT_TRUE(owner.engine);
  auto client = Engine(Options("secret"));
  ASSERT_TRUE(client);
  EXPECT_TRUE(
      IsPermissionDenied(client->ListPeerSegments(owner.engine->address(), seconds(5)).status(),
                         "requires TLS; set LARDER_TLS_CA"));
  std::vector<uint8_t> buffer(4096);
  EXPECT_TRUE(IsPermissionDenied(
      Transfer(client.get(), owner.descriptor(), TransferOp::kRead, buffer.data(), buffer.size()),
      "requires TLS; set LARDER_TLS_CA"));
  // The owner is unharmed and serves a TLS client.
  auto tls_client = Engine(TlsOptions("secret"));
  ASSERT_TRUE(tls_client);
  EXPECT_TRUE(RoundTrip(tls_client.get(), owner, 0, 4096));
}

TEST_F(TcpTlsTest, RelaysGainNothingOverTls) {
  Owner owner = StartOwner(TlsOptions("secret"));
  ASSERT_TRUE(owner.engine);
  HostPort owner_address = ParseHostPort(owner.engine->address()).value();
  {
    SCOPED_TRACE("transparent relay");
    FakeServer relay([&](Fd fd) {
      auto up = TcpConnect(owner_address, Soon());
      if (up.ok()) Pump(fd.get(), up->get());
    });
    auto client = Engine(TlsOptions("secret"));
    ASSERT_TRUE(client);
    std::vector<uint8_t> buffer(4096, 0);
    EXPECT_TRUE(
        IsPermissionDenied(Transfer(client.get(), PointedAt(owner.descriptor(), relay.address()),
                                    TransferOp::kRead, buffer.data(), buffer.size()),
                           "refusing a relayed proof"));
  }
  {
    // The relay even holds a certificate of the cluster's CA: it terminates the client's TLS and
    // opens its own to the owner. The proof is bound to the client's TLS session, so the owner
    // refuses it.
    SCOPED_TRACE("relay with a valid certificate");
    RelayLog log;
    SmartRelayOptions options;
    options.owner = owner_address;
    options.segment_id = owner.id;
    options.server_tls = TlsContext::ForServer(certs_.cert_file, certs_.key_file).value();
    options.client_tls = TlsContext::ForClient(certs_.ca_file).value();
    FakeServer relay([&](Fd fd) { ServeAsSmartRelay(std::move(fd), options, &log); });
    auto client = Engine(TlsOptions("secret"));
    ASSERT_TRUE(client);
    std::vector<uint8_t> source(4096, 0x5a);
    EXPECT_TRUE(
        IsPermissionDenied(Transfer(client.get(), PointedAt(owner.descriptor(), relay.address()),
                                    TransferOp::kWrite, source.data(), source.size()),
                           "wrong cluster token"));
    EXPECT_EQ(log.relayed_auths.load(), 1);
    EXPECT_FALSE(log.owner_accepted.load());
    EXPECT_FALSE(log.owner_served_data.load());
    EXPECT_EQ(log.client_data_frames.load(), 0);
  }
  EXPECT_TRUE(owner.Unchanged());
  auto direct = Engine(TlsOptions("secret"));
  ASSERT_TRUE(direct);
  EXPECT_TRUE(RoundTrip(direct.get(), owner, 0, 64 * 1024));
}

TEST_F(TcpTlsTest, BadTlsFilesAreInvalidArgumentAtCreation) {
  std::string garbage = dir_ + "/garbage.pem";
  std::ofstream(garbage) << "not a certificate\n";
  auto other = larder::testing::WriteTestCertificates(dir_ + "/other");
  ASSERT_TRUE(other.ok()) << other.status();
  auto expect_invalid = [](const TransferEngineOptions& options, const std::string& names) {
    auto engine = TransferEngine::Create(options);
    ASSERT_FALSE(engine.ok());
    EXPECT_EQ(engine.status().code(), StatusCode::kInvalidArgument) << engine.status();
    EXPECT_NE(engine.status().message().find(names), std::string::npos) << engine.status();
  };
  {
    TransferEngineOptions options = TlsOptions("secret");
    options.tls_cert_file = dir_ + "/missing-cert.pem";
    expect_invalid(options, "missing-cert.pem");
  }
  {
    TransferEngineOptions options = TlsOptions("secret");
    options.tls_key_file = garbage;
    expect_invalid(options, "garbage.pem");
  }
  {
    TransferEngineOptions options = TlsOptions("secret");
    options.tls_key_file = other->key_file;  // a key of another certificate
    expect_invalid(options, "does not match");
  }
  {
    TransferEngineOptions options = TlsOptions("secret");
    options.tls_key_file.clear();
    expect_invalid(options, "tls_key_file");
  }
  for (const std::string protocol : {"tcp", "shm"}) {
    // The CA is checked whatever the routes.
    TransferEngineOptions options = TlsOptions("secret");
    options.protocol = protocol;
    options.tls_ca_file = dir_ + "/missing-ca.pem";
    expect_invalid(options, "missing-ca.pem");
    options.tls_ca_file = garbage;
    expect_invalid(options, "garbage.pem");
  }
  {
    // From the environment too.
    ScopedEnv env_cert("LARDER_TLS_CERT", dir_ + "/env-cert.pem");
    ScopedEnv env_key("LARDER_TLS_KEY", certs_.key_file);
    expect_invalid(Options("secret"), "env-cert.pem");
  }
}

}  // namespace
}  // namespace larder::transfer::tcp
