// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The HTTP gate (http_server.h) against clients that stall, crowd or overflow, over real sockets:
// on its own with short limits, and in a real MasterServer with its defaults.
#include "master/http_server.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/net.h"
#include "master/master_server.h"
#include "master/master_server_testing.h"
#include "transfer/testing/test_util.h"

namespace larder::master {
namespace {

using namespace std::chrono_literals;

Fd Connect(int port) {
  auto fd = TcpConnect(HostPort{"127.0.0.1", static_cast<uint16_t>(port)}, Clock::now() + 5s);
  EXPECT_TRUE(fd.ok()) << fd.status();
  return fd.ok() ? std::move(fd).value() : Fd();
}

void Send(const Fd& fd, std::string_view bytes) {
  ASSERT_TRUE(SendAll(fd.get(), bytes.data(), bytes.size(), Clock::now() + 5s, "test").ok());
}

// Everything the server sends until it closes, or until the deadline; `closed` says which.
std::string ReadUntilClosed(const Fd& fd, std::chrono::milliseconds timeout, bool* closed) {
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  *closed = false;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd.get(), POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char chunk[4096];
    ssize_t n = recv(fd.get(), chunk, sizeof(chunk), 0);
    if (n <= 0) {
      *closed = true;
      break;
    }
    out.append(chunk, static_cast<size_t>(n));
  }
  return out;
}

// Closed by the server: recv sees the end (or a reset) without blocking.
bool ClosedByServer(const Fd& fd) {
  pollfd p{fd.get(), POLLIN, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  char byte;
  return recv(fd.get(), &byte, 1, MSG_DONTWAIT) <= 0;
}

class GuardedServer {
 public:
  explicit GuardedServer(HttpServerLimits limits) : server_(limits) {
    server_.Get("/ping", [](const httplib::Request&, httplib::Response& response) {
      response.set_content("pong", "text/plain");
    });
    server_.Post("/echo", [](const httplib::Request& request, httplib::Response& response) {
      response.set_content(request.body, "text/plain");
    });
    port_ = server_.BindToAnyPort("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    EXPECT_TRUE(testutil::WaitUntil([this] { return server_.is_running(); }, 10s));
  }
  ~GuardedServer() {
    server_.stop();
    thread_.join();
  }
  int port() const { return port_; }
  GuardedHttpServer& server() { return server_; }

 private:
  GuardedHttpServer server_;
  int port_ = 0;
  std::thread thread_;
};

TEST(GuardedHttpServerTest, ServesWholeRequestsOneAConnection) {
  GuardedServer guarded(HttpServerLimits{});
  httplib::Client http("127.0.0.1", guarded.port());
  auto ping = http.Get("/ping");
  ASSERT_TRUE(ping);
  EXPECT_EQ(ping->status, 200);
  EXPECT_EQ(ping->body, "pong");
  EXPECT_EQ(ping->get_header_value("Connection"), "close");
  // A body that arrives in pieces is read whole before the handler runs.
  Fd fd = Connect(guarded.port());
  Send(fd,
       "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n\r\n");
  Send(fd, "01234");
  // The rest comes once the gate holds the connection.
  ASSERT_TRUE(testutil::WaitUntil([&] { return guarded.server().waiting() == 1; }, 10s));
  Send(fd, "56789");
  bool closed = false;
  std::string reply = ReadUntilClosed(fd, 10s, &closed);
  EXPECT_TRUE(closed);
  EXPECT_NE(reply.find("200 OK"), std::string::npos) << reply;
  EXPECT_NE(reply.find("\r\n\r\n0123456789"), std::string::npos) << reply;
  // Chunked bodies too.
  Fd chunked = Connect(guarded.port());
  Send(chunked,
       "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
       "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
  reply = ReadUntilClosed(chunked, 10s, &closed);
  EXPECT_NE(reply.find("\r\n\r\nabcde"), std::string::npos) << reply;
  EXPECT_EQ(guarded.server().refused(), 0u);
}

TEST(GuardedHttpServerTest, RequestNotWholeByTheDeadlineIsClosedUnanswered) {
  HttpServerLimits limits;
  limits.request_deadline = 300ms;
  GuardedServer guarded(limits);
  Fd header = Connect(guarded.port());
  Send(header, "GET /ping HTTP/1.1\r\nHost: x\r\n");  // no empty line: the header never ends
  Fd body = Connect(guarded.port());
  Send(body, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nshort");
  // A client that trickles a byte now and then gains nothing: the deadline is on the request.
  Fd trickle = Connect(guarded.port());
  std::string request = "GET /ping HTTP/1.1\r\nHost: x\r\n\r\n";
  size_t sent = 0;
  bool closed = false;
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < until && sent + 1 < request.size()) {
    if (send(trickle.get(), &request[sent], 1, MSG_NOSIGNAL) != 1) break;
    ++sent;
    // The next byte comes 50 ms later, unless the server closes the connection first.
    if (testutil::WaitUntil([&] { return ClosedByServer(trickle); }, 50ms)) {
      closed = true;
      break;
    }
  }
  EXPECT_TRUE(closed) << "the trickling connection sent " << sent << " bytes and is still open";
  for (const Fd* fd : {&header, &body}) {
    std::string reply = ReadUntilClosed(*fd, 10s, &closed);
    EXPECT_TRUE(closed);
    EXPECT_EQ(reply, "");
  }
  EXPECT_TRUE(testutil::WaitUntil([&] { return guarded.server().refused() == 3; }, 10s))
      << guarded.server().refused();
}

TEST(GuardedHttpServerTest, PeerOverItsShareLosesItsOldestStalledConnection) {
  HttpServerLimits limits;
  limits.connections_per_peer = 4;
  limits.request_deadline = 60s;
  GuardedServer guarded(limits);
  std::vector<Fd> stalled;
  for (int i = 0; i < 4; ++i) {
    stalled.push_back(Connect(guarded.port()));
    Send(stalled.back(), "GET /ping HTTP/1.1\r\n");
  }
  // The gate admits connections as its threads take them up: all four are in before the fifth.
  ASSERT_TRUE(testutil::WaitUntil([&] { return guarded.server().waiting() == 4; }, 10s));
  httplib::Client http("127.0.0.1", guarded.port());
  http.set_read_timeout(5s);
  auto ping = http.Get("/ping");
  ASSERT_TRUE(ping) << "a whole request from a peer at its share is served";
  EXPECT_EQ(ping->body, "pong");
  // One stalled connection (the oldest in the gate) went to make room; the others wait on.
  std::vector<bool> closed(stalled.size(), false);
  auto count_closed = [&] {
    size_t n = 0;
    for (size_t i = 0; i < stalled.size(); ++i) {
      if (!closed[i]) closed[i] = ClosedByServer(stalled[i]);
      n += closed[i] ? 1 : 0;
    }
    return n;
  };
  EXPECT_TRUE(testutil::WaitUntil([&] { return count_closed() >= 1; }, 10s));
  EXPECT_EQ(count_closed(), 1u);
  // Counted by the evicted connection's thread once it sees the hang-up.
  EXPECT_TRUE(testutil::WaitUntil([&] { return guarded.server().refused() >= 1; }, 10s));
  EXPECT_EQ(guarded.server().refused(), 1u);
}

TEST(GuardedHttpServerTest, OversizeHeaderAndBodyAreRefusedWithTheirStatus) {
  GuardedServer guarded(HttpServerLimits{});
  Fd header = Connect(guarded.port());
  Send(header, "GET /ping HTTP/1.1\r\nX-Filler: " + std::string(9000, 'a') + "\r\n\r\n");
  bool closed = false;
  std::string reply = ReadUntilClosed(header, 10s, &closed);
  EXPECT_NE(reply.find("431"), std::string::npos) << reply.substr(0, 200);
  Fd body = Connect(guarded.port());
  Send(body, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n");
  reply = ReadUntilClosed(body, 10s, &closed);
  EXPECT_NE(reply.find("413"), std::string::npos) << reply.substr(0, 200);
  // Still serving.
  httplib::Client http("127.0.0.1", guarded.port());
  auto ping = http.Get("/ping");
  ASSERT_TRUE(ping);
  EXPECT_EQ(ping->status, 200);
}

// The master's defaults: /health is answered while 64 connections hold half a request each.
TEST(GuardedHttpServerTest, MasterAnswersHealthWhileSixtyFourConnectionsStall) {
  MasterServerOptions options = LoopbackServerOptions();
  auto server = MasterServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<Fd> stalled;
  for (int i = 0; i < 64; ++i) {
    stalled.push_back(Connect((*server)->http_port()));
    Send(stalled.back(), "GET /health HTTP/1.1\r\nHost: x\r\n");
  }
  // All from this one peer: once its threads have taken them up, the gate holds the peer's share
  // of them and has closed the rest. (A probe that came in while they were still being taken up
  // would be one of the peer's waiting connections, and could lose its place to a later one.)
  const GuardedHttpServer* gate = (*server)->http_server();
  ASSERT_NE(gate, nullptr);
  ASSERT_TRUE(testutil::WaitUntil([&] { return gate->waiting() + gate->refused() == 64; }, 10s))
      << gate->waiting() << " waiting, " << gate->refused() << " refused";
  EXPECT_EQ(gate->waiting(), HttpServerLimits{}.connections_per_peer);
  httplib::Client http("127.0.0.1", (*server)->http_port());
  // Well inside the request deadline (5 s) that would otherwise free the workers.
  http.set_connection_timeout(2s);
  http.set_read_timeout(2s);
  for (int i = 0; i < 8; ++i) {
    auto health = http.Get("/health");
    ASSERT_TRUE(health) << "probe " << i << ": " << httplib::to_string(health.error());
    EXPECT_EQ(health->status, 200);
    EXPECT_EQ(health->body, "ok\n");
  }
  (*server)->Shutdown();
}

}  // namespace
}  // namespace larder::master
