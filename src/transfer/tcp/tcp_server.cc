// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/tcp/tcp_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <nlohmann/json.hpp>
#include <vector>

#include "common/logging.h"
#include "transfer/segment_exports.h"
#include "transfer/tcp/tcp_frame.h"

namespace larder::transfer::tcp {
namespace {

// Once a frame has started, the rest of it must arrive within this time.
constexpr auto kFrameTimeout = std::chrono::seconds(30);

Deadline FrameDeadline() { return Clock::now() + kFrameTimeout; }

}  // namespace

TcpDataServer::TcpDataServer(const EngineContext& context) : context_(context) {}

TcpDataServer::~TcpDataServer() { Stop(); }

Status TcpDataServer::Start(const HostPort& listen) {
  LARDER_ASSIGN_OR_RETURN(listener_, TcpListen(listen));
  LARDER_ASSIGN_OR_RETURN(port_, BoundPort(listener_.get()));
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  return Status();
}

void TcpDataServer::Stop() {
  if (stopping_.exchange(true)) return;
  if (listener_.valid()) shutdown(listener_.get(), SHUT_RDWR);
  if (accept_thread_.joinable()) accept_thread_.join();
  std::list<std::unique_ptr<Connection>> connections;
  {
    std::lock_guard lock(mu_);
    connections.swap(connections_);
  }
  for (auto& c : connections) shutdown(c->fd.get(), SHUT_RDWR);
  for (auto& c : connections) c->thread.join();
  listener_.Reset();
}

void TcpDataServer::ReapFinished() {
  std::list<std::unique_ptr<Connection>> finished;
  {
    std::lock_guard lock(mu_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      if ((*it)->done.load()) {
        finished.push_back(std::move(*it));
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : finished) c->thread.join();
}

void TcpDataServer::AcceptLoop() {
  while (!stopping_.load()) {
    pollfd p{listener_.get(), POLLIN, 0};
    int rc = poll(&p, 1, 200);
    ReapFinished();
    if (rc <= 0) continue;
    sockaddr_in addr{};
    socklen_t len = sizeof(addr);
    int fd = accept4(listener_.get(), reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC);
    if (fd < 0) continue;
    TuneTcpSocket(fd);
    auto conn = std::make_unique<Connection>();
    conn->fd = Fd(fd);
    char ip[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &addr.sin_addr, ip, sizeof(ip));
    conn->peer = std::string(ip) + ":" + std::to_string(ntohs(addr.sin_port));
    Connection* raw = conn.get();
    std::lock_guard lock(mu_);
    if (stopping_.load()) break;
    conn->thread = std::thread([this, raw] {
      Serve(raw);
      raw->done.store(true);
    });
    connections_.push_back(std::move(conn));
  }
}

Status TcpDataServer::SendError(Connection* conn, uint64_t request_id, const Status& status) {
  std::string message = status.message();
  FrameHeader h;
  h.type = FrameType::kError;
  h.code = static_cast<uint8_t>(status.code());
  h.request_id = request_id;
  h.length = message.size();
  uint8_t header[kFrameHeaderSize];
  EncodeHeader(h, header);
  iovec iov[2] = {{header, sizeof(header)}, {message.data(), message.size()}};
  return SendAllV(conn->fd.get(), iov, 2, FrameDeadline(), conn->peer);
}

void TcpDataServer::Serve(Connection* conn) {
  bool authenticated = context_.auth_token.empty();
  uint8_t nonce[32] = {};
  {
    FrameHeader hello;
    hello.type = FrameType::kHello;
    if (!authenticated) {
      hello.flags = kFlagNeedAuth;
      hello.length = sizeof(nonce);
      RandomBytes(nonce, sizeof(nonce));
    }
    uint8_t header[kFrameHeaderSize];
    EncodeHeader(hello, header);
    iovec iov[2] = {{header, sizeof(header)}, {nonce, authenticated ? 0 : sizeof(nonce)}};
    if (!SendAllV(conn->fd.get(), iov, 2, FrameDeadline(), conn->peer).ok()) return;
  }
  uint8_t raw[kFrameHeaderSize];
  while (!stopping_.load()) {
    pollfd p{conn->fd.get(), POLLIN, 0};
    int rc = poll(&p, 1, 500);
    if (rc == 0) continue;
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return;
    if (!RecvAll(conn->fd.get(), raw, sizeof(raw), FrameDeadline(), conn->peer).ok()) return;
    if (!HandleFrame(conn, raw, &authenticated, nonce)) return;
  }
}

bool TcpDataServer::HandleFrame(Connection* conn, const uint8_t* raw, bool* authenticated,
                                const uint8_t* nonce) {
  int fd = conn->fd.get();
  FrameHeader h;
  if (Status s = DecodeHeader(raw, &h); !s.ok()) {
    // Without a valid header the next frame boundary is unknown: report, then close.
    SendError(conn, 0, s.WithContext("malformed frame from " + conn->peer)).IgnoreError();
    return false;
  }
  if (!*authenticated && h.type != FrameType::kAuth) {
    SendError(conn, h.request_id,
              PermissionDeniedError("authenticate before sending data frames (cluster token)"))
        .IgnoreError();
    return false;
  }
  switch (h.type) {
    case FrameType::kAuth: {
      uint8_t mac[32];
      if (h.length != sizeof(mac) ||
          !RecvAll(fd, mac, sizeof(mac), FrameDeadline(), conn->peer).ok()) {
        SendError(conn, h.request_id, InvalidArgumentError("malformed auth frame")).IgnoreError();
        return false;
      }
      if (context_.auth_token.empty()) {
        *authenticated = true;
      } else {
        auto expected = HmacSha256(context_.auth_token, nonce, 32);
        if (!DigestEqual(expected.data(), mac)) {
          Log().warn("tcp data server: wrong cluster token from {}", conn->peer);
          SendError(conn, h.request_id,
                    PermissionDeniedError("wrong cluster token for engine " + context_.engine_id))
              .IgnoreError();
          return false;
        }
        *authenticated = true;
      }
      FrameHeader ok;
      ok.type = FrameType::kAuthOk;
      ok.request_id = h.request_id;
      uint8_t out[kFrameHeaderSize];
      EncodeHeader(ok, out);
      return SendAll(fd, out, sizeof(out), FrameDeadline(), conn->peer).ok();
    }
    case FrameType::kDescribe: {
      if (h.length != 0) {
        SendError(conn, h.request_id, InvalidArgumentError("describe frame carries no payload"))
            .IgnoreError();
        return false;
      }
      nlohmann::json list = nlohmann::json::array();
      for (const auto& d : context_.exports->List())
        list.push_back(nlohmann::json::parse(d.ToJson()));
      std::string body = list.dump();
      FrameHeader reply;
      reply.type = FrameType::kDescribeReply;
      reply.request_id = h.request_id;
      reply.length = body.size();
      uint8_t out[kFrameHeaderSize];
      EncodeHeader(reply, out);
      iovec iov[2] = {{out, sizeof(out)}, {body.data(), body.size()}};
      return SendAllV(fd, iov, 2, FrameDeadline(), conn->peer).ok();
    }
    case FrameType::kRead: {
      if (h.length > kMaxFramePayload) {
        return SendError(conn, h.request_id,
                         InvalidArgumentError("read of " + std::to_string(h.length) +
                                              " bytes exceeds the frame limit"))
            .ok();
      }
      Status send_status;
      Status access = context_.exports->Access(h.segment_id, h.offset, h.length, [&](uint8_t* src) {
        FrameHeader reply;
        reply.type = FrameType::kReadReply;
        reply.request_id = h.request_id;
        reply.length = h.length;
        uint8_t out[kFrameHeaderSize];
        EncodeHeader(reply, out);
        iovec iov[2] = {{out, sizeof(out)}, {src, h.length}};
        send_status = SendAllV(fd, iov, 2, FrameDeadline(), conn->peer);
      });
      if (!access.ok()) return SendError(conn, h.request_id, access).ok();
      return send_status.ok();
    }
    case FrameType::kWrite: {
      if (h.length > kMaxFramePayload) {
        SendError(conn, h.request_id,
                  InvalidArgumentError("write of " + std::to_string(h.length) +
                                       " bytes exceeds the frame limit"))
            .IgnoreError();
        return false;  // cannot skip a payload that large safely
      }
      Status recv_status;
      Status access = context_.exports->Access(h.segment_id, h.offset, h.length, [&](uint8_t* dst) {
        recv_status = RecvAll(fd, dst, h.length, FrameDeadline(), conn->peer);
      });
      if (!access.ok()) {
        // Skip the payload so the connection stays usable, then report.
        std::vector<uint8_t> sink(std::min<uint64_t>(h.length, 1 << 20));
        for (uint64_t left = h.length; left > 0;) {
          uint64_t n = std::min<uint64_t>(left, sink.size());
          if (!RecvAll(fd, sink.data(), n, FrameDeadline(), conn->peer).ok()) return false;
          left -= n;
        }
        return SendError(conn, h.request_id, access).ok();
      }
      if (!recv_status.ok()) return false;
      FrameHeader reply;
      reply.type = FrameType::kWriteReply;
      reply.request_id = h.request_id;
      uint8_t out[kFrameHeaderSize];
      EncodeHeader(reply, out);
      return SendAll(fd, out, sizeof(out), FrameDeadline(), conn->peer).ok();
    }
    default:
      SendError(conn, h.request_id,
                InvalidArgumentError("frame type " + std::to_string(static_cast<int>(h.type)) +
                                     " is not a request"))
          .IgnoreError();
      return false;  // its payload length cannot be trusted
  }
}

}  // namespace larder::transfer::tcp
