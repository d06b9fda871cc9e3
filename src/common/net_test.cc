// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "common/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace larder {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

Deadline In(Clock::duration d) { return Clock::now() + d; }

TEST(ParseHostPortTest, AcceptsIpv4AndLocalhost) {
  Result<HostPort> ip = ParseHostPort("1.2.3.4:80");
  ASSERT_TRUE(ip.ok()) << ip.status();
  EXPECT_EQ(ip->host, "1.2.3.4");
  EXPECT_EQ(ip->port, 80);
  EXPECT_EQ(ip->ToString(), "1.2.3.4:80");

  Result<HostPort> local = ParseHostPort("localhost:1");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->host, "127.0.0.1");
  EXPECT_EQ(local->port, 1);

  Result<HostPort> any_port = ParseHostPort("0.0.0.0:0");
  ASSERT_TRUE(any_port.ok()) << any_port.status();
  EXPECT_EQ(any_port->port, 0);

  Result<HostPort> max_port = ParseHostPort("10.0.0.7:65535");
  ASSERT_TRUE(max_port.ok()) << max_port.status();
  EXPECT_EQ(max_port->port, 65535);
}

TEST(ParseHostPortTest, RejectsMalformedAddresses) {
  for (const char* bad :
       {"nohost", ":80", "1.2.3.4:", "1.2.3.4:99999", "1.2.3.4:65536", "a.b.c.d:1", "1.2.3:80",
        "1.2.3.4:8o", "1.2.3.4:-1", "", ":", "1.2.3.4:80:81", "1.2.3.4:99999999999999999999"}) {
    Result<HostPort> parsed = ParseHostPort(bad);
    ASSERT_FALSE(parsed.ok()) << "'" << bad << "' parsed as " << parsed->ToString();
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  // A NUL ends the string inet_pton sees; the host must not pass as its prefix.
  using std::string_literals::operator""s;
  EXPECT_EQ(ParseHostPort("1.2.3.4\0evil:80"s).status().code(), StatusCode::kInvalidArgument);
}

// A connected pair of TCP sockets on the loopback interface.
struct TcpPair {
  Fd client;
  Fd server;
};

TcpPair ConnectedPair() {
  TcpPair pair;
  Result<Fd> listener = TcpListen({"127.0.0.1", 0});
  EXPECT_TRUE(listener.ok()) << listener.status();
  if (!listener.ok()) return pair;
  Result<uint16_t> port = BoundPort(listener->get());
  EXPECT_TRUE(port.ok()) << port.status();
  EXPECT_NE(port.value_or(0), 0);
  Result<Fd> client = TcpConnect({"127.0.0.1", port.value_or(0)}, In(seconds(5)));
  EXPECT_TRUE(client.ok()) << client.status();
  if (!client.ok()) return pair;
  pair.client = std::move(client).value();
  pair.server = Fd(accept4(listener->get(), nullptr, nullptr, SOCK_CLOEXEC));
  EXPECT_TRUE(pair.server.valid()) << std::strerror(errno);
  return pair;
}

TEST(ResolveHostPortTest, NamesResolveAndAddressesStayAsTheyAre) {
  Result<HostPort> ip = ResolveHostPort("10.0.0.7:80");
  ASSERT_TRUE(ip.ok()) << ip.status();
  EXPECT_EQ(ip->host, "10.0.0.7");
  // The host's own name (in /etc/hosts on every Debian machine): an IPv4 address.
  char name[256] = {};
  ASSERT_EQ(gethostname(name, sizeof(name) - 1), 0);
  Result<HostPort> own = ResolveHostPort(std::string(name) + ":0");
  ASSERT_TRUE(own.ok()) << own.status();
  in_addr probe{};
  EXPECT_EQ(inet_pton(AF_INET, own->host.c_str(), &probe), 1) << own->host;
  EXPECT_EQ(own->port, 0);
  // A name nothing resolves is an error that says what to give instead.
  Result<HostPort> unknown = ResolveHostPort("no-such-host.invalid:1");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("give an IPv4 address"), std::string::npos)
      << unknown.status();
  // What is not a name is not looked up.
  EXPECT_EQ(ResolveHostPort("bad host:1").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveHostPort("host").status().code(), StatusCode::kInvalidArgument);
  // Peers' addresses are parsed without any lookup.
  EXPECT_EQ(ParseHostPort(std::string(name) + ":1").status().code(), StatusCode::kInvalidArgument);
}

TEST(TcpTest, SendAllAndRecvAllRoundTrip) {
  TcpPair pair = ConnectedPair();
  ASSERT_TRUE(pair.client.valid() && pair.server.valid());

  // Larger than the socket buffers, so both sides must loop over partial reads and writes.
  std::vector<uint8_t> sent(8 << 20);
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<uint8_t>(i * 131 + (i >> 12));
  Status send_status;
  std::thread sender([&] {
    send_status = SendAll(pair.client.get(), sent.data(), sent.size(), In(seconds(20)), "server");
  });
  std::vector<uint8_t> received(sent.size());
  Status recv_status =
      RecvAll(pair.server.get(), received.data(), received.size(), In(seconds(20)), "client");
  sender.join();
  ASSERT_TRUE(send_status.ok()) << send_status;
  ASSERT_TRUE(recv_status.ok()) << recv_status;
  EXPECT_EQ(received, sent);
}

TEST(TcpTest, SendAllVGathersEveryBuffer) {
  TcpPair pair = ConnectedPair();
  ASSERT_TRUE(pair.client.valid() && pair.server.valid());
  char a[] = "header|";
  std::vector<char> b(300000, 'x');
  char c[] = "|trailer";
  iovec iov[3] = {{a, 7}, {b.data(), b.size()}, {c, 8}};
  Status send_status;
  std::thread sender(
      [&] { send_status = SendAllV(pair.client.get(), iov, 3, In(seconds(10)), "server"); });
  std::string received(7 + b.size() + 8, '\0');
  Status recv_status =
      RecvAll(pair.server.get(), received.data(), received.size(), In(seconds(10)), "client");
  sender.join();
  ASSERT_TRUE(send_status.ok()) << send_status;
  ASSERT_TRUE(recv_status.ok()) << recv_status;
  EXPECT_EQ(received, "header|" + std::string(b.size(), 'x') + "|trailer");
}

TEST(TcpTest, RecvAllFromClosedPeerIsUnavailableAndNamesThePeer) {
  TcpPair pair = ConnectedPair();
  ASSERT_TRUE(pair.client.valid() && pair.server.valid());
  pair.server.Reset();
  char byte;
  Status status = RecvAll(pair.client.get(), &byte, 1, In(seconds(5)), "10.9.8.7:6543");
  EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("10.9.8.7:6543"), std::string::npos) << status;
}

TEST(TcpTest, RecvAllWithPastDeadlineIsDeadlineExceeded) {
  TcpPair pair = ConnectedPair();
  ASSERT_TRUE(pair.client.valid() && pair.server.valid());
  char byte;
  auto start = Clock::now();
  Status status = RecvAll(pair.client.get(), &byte, 1, Clock::now() - seconds(1), "server");
  EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded) << status;
  EXPECT_LT(Clock::now() - start, seconds(1));
}

TEST(TcpTest, RecvAllWithShortDeadlineWaitsThenFails) {
  TcpPair pair = ConnectedPair();
  ASSERT_TRUE(pair.client.valid() && pair.server.valid());
  // Part of the message arrives; the rest never does.
  ASSERT_TRUE(SendAll(pair.server.get(), "ab", 2, In(seconds(1)), "client").ok());
  char buf[4];
  auto start = Clock::now();
  Status status = RecvAll(pair.client.get(), buf, sizeof(buf), In(milliseconds(100)), "server");
  auto elapsed = Clock::now() - start;
  EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded) << status;
  EXPECT_GE(elapsed, milliseconds(90));
  EXPECT_LT(elapsed, seconds(3));
}

TEST(TcpTest, ConnectToClosedPortIsUnavailable) {
  uint16_t port = 0;
  {
    // Bind, learn the port, and close: nothing listens there afterwards.
    Result<Fd> listener = TcpListen({"127.0.0.1", 0});
    ASSERT_TRUE(listener.ok()) << listener.status();
    port = BoundPort(listener->get()).value_or(0);
    ASSERT_NE(port, 0);
  }
  Result<Fd> conn = TcpConnect({"127.0.0.1", port}, In(seconds(5)));
  ASSERT_FALSE(conn.ok());
  EXPECT_EQ(conn.status().code(), StatusCode::kUnavailable) << conn.status();
  EXPECT_NE(conn.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << conn.status();
}

TEST(TcpTest, ListenOnTakenPortFails) {
  Result<Fd> first = TcpListen({"127.0.0.1", 0});
  ASSERT_TRUE(first.ok()) << first.status();
  uint16_t port = BoundPort(first->get()).value_or(0);
  Result<Fd> second = TcpListen({"127.0.0.1", port});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists) << second.status();
}

TEST(UnixSocketTest, AbstractListenAndConnect) {
  std::string name = "larder-net-test/" + std::to_string(getpid());
  Result<Fd> listener = UnixListenAbstract(name);
  ASSERT_TRUE(listener.ok()) << listener.status();
  Result<Fd> client = UnixConnectAbstract(name, In(seconds(1)));
  ASSERT_TRUE(client.ok()) << client.status();
  Fd server(accept4(listener->get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(server.valid());
  ASSERT_TRUE(SendAll(client->get(), "ping", 4, In(seconds(1)), "server").ok());
  char buf[4];
  ASSERT_TRUE(RecvAll(server.get(), buf, 4, In(seconds(1)), "client").ok());
  EXPECT_EQ(std::string(buf, 4), "ping");

  Result<Fd> missing = UnixConnectAbstract(name + "-nobody", In(seconds(1)));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kUnavailable) << missing.status();
}

TEST(FdPassingTest, SendWithFdDeliversAUsableDescriptor) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  Fd left(sv[0]), right(sv[1]);

  Fd memfd(memfd_create("larder-net-test", MFD_CLOEXEC));
  ASSERT_TRUE(memfd.valid());
  const std::string content = "bytes behind the passed fd";
  ASSERT_EQ(pwrite(memfd.get(), content.data(), content.size(), 0),
            static_cast<ssize_t>(content.size()));

  const char message[] = "segment-7";
  ASSERT_TRUE(SendWithFd(left.get(), message, sizeof(message), memfd.get()).ok());
  char received_message[sizeof(message)] = {};
  Fd received;
  Status status = RecvWithFd(right.get(), received_message, sizeof(received_message), &received,
                             In(seconds(2)), "left");
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_STREQ(received_message, message);
  ASSERT_TRUE(received.valid());
  EXPECT_NE(received.get(), memfd.get());

  // The received fd refers to the same file: reads see what was written, writes are seen back.
  memfd.Reset();
  std::string read_back(content.size(), '\0');
  ASSERT_EQ(pread(received.get(), read_back.data(), read_back.size(), 0),
            static_cast<ssize_t>(read_back.size()));
  EXPECT_EQ(read_back, content);
  EXPECT_NE(fcntl(received.get(), F_GETFD) & FD_CLOEXEC, 0);  // MSG_CMSG_CLOEXEC
}

TEST(FdPassingTest, MessageWithoutFdReturnsInvalidFd) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  Fd left(sv[0]), right(sv[1]);
  ASSERT_TRUE(SendWithFd(left.get(), "hi", 2, -1).ok());
  char buf[2];
  Fd received(dup(left.get()));  // must be replaced by "no fd"
  ASSERT_TRUE(RecvWithFd(right.get(), buf, 2, &received, In(seconds(2)), "left").ok());
  EXPECT_FALSE(received.valid());
  EXPECT_EQ(std::string(buf, 2), "hi");
}

TEST(FdPassingTest, RecvWithFdFromClosedPeerIsUnavailable) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  Fd left(sv[0]), right(sv[1]);
  left.Reset();
  char buf[4];
  Fd received;
  Status status = RecvWithFd(right.get(), buf, sizeof(buf), &received, In(seconds(2)), "left");
  EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status;
}

std::string Hex(const std::array<uint8_t, 32>& digest) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : digest) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

TEST(HmacTest, Rfc4231TestCase2) {
  const std::string data = "what do ya want for nothing?";
  EXPECT_EQ(Hex(HmacSha256("Jefe", data.data(), data.size())),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

// Each thread reuses one HMAC context: a key longer than a block (hashed first) and a short one,
// one after the other, each give their own RFC 4231 digest.
TEST(HmacTest, Rfc4231TestCases6And2OnOneThread) {
  const std::string long_key(131, '\xaa');
  const std::string data = "Test Using Larger Than Block-Size Key - Hash Key First";
  EXPECT_EQ(Hex(HmacSha256(long_key, data.data(), data.size())),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  const std::string nothing = "what do ya want for nothing?";
  EXPECT_EQ(Hex(HmacSha256("Jefe", nothing.data(), nothing.size())),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(Sha256Test, PiecesHashAsTheirConcatenation) {
  const std::string_view abc = "abc";
  EXPECT_EQ(Hex(Sha256(std::span(&abc, 1))),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string_view pieces[] = {"a", "", "bc"};
  EXPECT_EQ(Sha256(pieces), Sha256(std::span(&abc, 1)));
  EXPECT_EQ(Hex(Sha256({})), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(HmacTest, DifferentKeysGiveDifferentDigests) {
  const std::string data = "nonce";
  EXPECT_NE(HmacSha256("secret", data.data(), data.size()),
            HmacSha256("wrong", data.data(), data.size()));
}

TEST(HmacTest, DigestEqualComparesAllBytes) {
  const std::string data = "nonce";
  std::array<uint8_t, 32> a = HmacSha256("secret", data.data(), data.size());
  std::array<uint8_t, 32> b = a;
  EXPECT_TRUE(DigestEqual(a.data(), b.data()));
  b[31] ^= 1;  // only the last byte differs
  EXPECT_FALSE(DigestEqual(a.data(), b.data()));
  b = a;
  b[0] ^= 0x80;
  EXPECT_FALSE(DigestEqual(a.data(), b.data()));
}

TEST(RandomBytesTest, FillsTheBuffer) {
  std::vector<uint8_t> a(64, 0), b(64, 0);
  RandomBytes(a.data(), a.size());
  RandomBytes(b.data(), b.size());
  EXPECT_NE(a, b);
  EXPECT_NE(a, std::vector<uint8_t>(64, 0));
}

}  // namespace
}  // namespace larder
