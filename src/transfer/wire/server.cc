// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/wire/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <vector>

#include "common/logging.h"
#include "common/priority.h"
#include "transfer/wire/frame.h"

namespace larder::transfer::wire {

FrameServer::FrameServer(const EngineContext& context) : context_(context) {}

FrameServer::~FrameServer() { Stop(); }

Status FrameServer::Listen(const HostPort& listen) {
  if (!context_.tls_cert_file.empty() || !context_.tls_key_file.empty()) {
    LARDER_ASSIGN_OR_RETURN(tls_,
                            TlsContext::ForServer(context_.tls_cert_file, context_.tls_key_file));
  }
  // Only clients use the CA; it is loaded here too so that a bad file stops the engine at start
  // even when no tcp route is enabled (ListPeerSegments still dials peers).
  if (!context_.tls_ca_file.empty()) {
    LARDER_RETURN_IF_ERROR(TlsContext::ForClient(context_.tls_ca_file).status());
  }
  if (!context_.auth_token.empty() && context_.engine_id.size() > kMaxEngineIdBytes) {
    return InvalidArgumentError("engine id '" + context_.engine_id + "' is longer than " +
                                std::to_string(kMaxEngineIdBytes) + " bytes (shorten host_id)");
  }
  LARDER_ASSIGN_OR_RETURN(listener_, TcpListen(listen));
  LARDER_ASSIGN_OR_RETURN(port_, BoundPort(listener_.get()));
  return Status();
}

void FrameServer::Handle(FrameType type, Handler handler) {
  handlers_[static_cast<size_t>(type)] = std::move(handler);
}

void FrameServer::Serve() {
  accept_thread_ = std::thread([this] { AcceptLoop(); });
}

void FrameServer::Stop() {
  if (stopping_.exchange(true)) return;
  if (listener_.valid()) shutdown(listener_.get(), SHUT_RDWR);
  if (accept_thread_.joinable()) accept_thread_.join();
  std::list<std::unique_ptr<FrameConnection>> connections;
  {
    MutexLock lock(mu_);
    connections.swap(connections_);
  }
  for (auto& c : connections) shutdown(c->stream_.fd(), SHUT_RDWR);
  for (auto& c : connections) c->thread_.join();
  listener_.Reset();
}

void FrameServer::ReapFinished() {
  std::list<std::unique_ptr<FrameConnection>> finished;
  {
    MutexLock lock(mu_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      if ((*it)->done_.load()) {
        finished.push_back(std::move(*it));
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : finished) c->thread_.join();
}

void FrameServer::AcceptLoop() {
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
    auto conn = std::make_unique<FrameConnection>();
    char ip[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &addr.sin_addr, ip, sizeof(ip));
    conn->stream_ = TcpStream(Fd(fd), std::string(ip) + ":" + std::to_string(ntohs(addr.sin_port)));
    FrameConnection* raw = conn.get();
    MutexLock lock(mu_);
    if (stopping_.load()) break;
    conn->thread_ = std::thread([this, raw] {
      ServeConnection(raw);
      raw->done_.store(true);
    });
    connections_.push_back(std::move(conn));
  }
}

Status FrameConnection::SendReply(FrameType type, uint64_t request_id, std::string_view payload) {
  FrameHeader h;
  h.type = type;
  h.request_id = request_id;
  h.length = payload.size();
  uint8_t header[kFrameHeaderSize];
  EncodeHeader(h, header);
  iovec iov[2] = {{header, sizeof(header)}, {const_cast<char*>(payload.data()), payload.size()}};
  return stream_.SendAllV(iov, 2, FrameDeadline());
}

Status FrameConnection::SendError(uint64_t request_id, const Status& status) {
  std::string message = status.message();
  FrameHeader h;
  h.type = FrameType::kError;
  h.code = static_cast<uint8_t>(status.code());
  h.request_id = request_id;
  h.length = message.size();
  uint8_t header[kFrameHeaderSize];
  EncodeHeader(h, header);
  iovec iov[2] = {{header, sizeof(header)}, {message.data(), message.size()}};
  return stream_.SendAllV(iov, 2, FrameDeadline());
}

void FrameServer::ServeConnection(FrameConnection* conn) {
  TcpStream& stream = conn->stream_;
  AuthState auth;
  auth.authenticated = context_.auth_token.empty();
  {
    // The hello travels in the clear, before any TLS: it says whether TLS follows. Tampering with
    // it gains nothing: a client decides from its own configuration whether it needs TLS and a
    // token, and the nonce and engine id are covered by both MACs.
    FrameHeader hello;
    hello.type = FrameType::kHello;
    std::string payload;
    if (tls_) hello.flags |= kFlagTls;
    if (!auth.authenticated) {
      hello.flags |= kFlagNeedAuth;
      RandomBytes(auth.server_nonce.data(), auth.server_nonce.size());
      payload = EncodeHello(auth.server_nonce, context_.engine_id);
    }
    hello.length = payload.size();
    uint8_t header[kFrameHeaderSize];
    EncodeHeader(hello, header);
    iovec iov[2] = {{header, sizeof(header)}, {payload.data(), payload.size()}};
    if (!stream.SendAllV(iov, 2, FrameDeadline()).ok()) return;
  }
  if (tls_) {
    if (Status s = stream.StartTls(*tls_, FrameDeadline()); !s.ok()) {
      Log().warn("frame server: TLS with {} failed: {}", stream.peer(), s.ToString());
      return;
    }
  }
  uint8_t raw[kFrameHeaderSize];
  while (!stopping_.load()) {
    // Bytes that TLS already decrypted are invisible to poll.
    if (!stream.HasBufferedInput()) {
      pollfd p{stream.fd(), POLLIN, 0};
      int rc = poll(&p, 1, 500);
      if (rc == 0) continue;
      if (rc < 0 && errno == EINTR) continue;
      if (rc < 0) return;
    }
    if (!stream.RecvAll(raw, sizeof(raw), FrameDeadline()).ok()) return;
    if (!HandleFrame(conn, raw, &auth)) return;
  }
}

bool FrameServer::HandleAuth(FrameConnection* conn, const FrameHeader& h, AuthState* auth) {
  TcpStream& stream = conn->stream_;
  auto refuse = [&](const Status& status) {
    conn->SendError(h.request_id, status).IgnoreError();
    return false;
  };
  if (auth->authenticated) {
    return refuse(InvalidArgumentError(context_.auth_token.empty()
                                           ? "unexpected auth frame: this engine has no token"
                                           : "unexpected auth frame: already authenticated"));
  }
  if (h.length > kMaxAuthPayload) {
    return refuse(InvalidArgumentError("auth payload of " + std::to_string(h.length) +
                                       " bytes exceeds " + std::to_string(kMaxAuthPayload)));
  }
  std::string payload(h.length, '\0');
  if (!stream.RecvAll(payload.data(), payload.size(), FrameDeadline()).ok()) return false;
  AuthRequest request;
  if (Status s = DecodeAuth(payload, &request); !s.ok()) return refuse(s);

  TcpAuthBinding binding;
  binding.server_nonce = auth->server_nonce;
  binding.client_nonce = request.client_nonce;
  binding.server_engine_id = context_.engine_id;
  binding.dialed_endpoint = request.dialed_endpoint;
  binding.client_engine_id = request.client_engine_id;
  if (stream.tls()) {
    auto channel = stream.ChannelBinding();
    if (!channel.ok()) return refuse(channel.status());
    binding.channel_binding.assign(channel->begin(), channel->end());
  }
  auto expected = TcpClientMac(context_.auth_token, binding);
  if (!DigestEqual(expected.data(), request.mac.data())) {
    Log().warn("frame server: wrong cluster token from {} (claims engine {})", stream.peer(),
               request.client_engine_id);
    return refuse(PermissionDeniedError("wrong cluster token for engine " + context_.engine_id));
  }
  // The client holds the token; it must also have dialed this engine. A relay that forwards our
  // nonce to a client and the client's proof to us is caught here: the client dialed the relay.
  const std::string& advertised = advertised_endpoint_;
  auto local = SocketEndpoint(stream.fd(), /*local=*/true);
  if (request.dialed_endpoint != advertised && !(local.ok() && request.dialed_endpoint == *local)) {
    Log().warn(
        "frame server: engine {} at {} authenticated for {}, which is not this engine "
        "({}, local {}): a relay?",
        request.client_engine_id, stream.peer(), request.dialed_endpoint, advertised,
        local.ok() ? *local : local.status().ToString());
    return refuse(PermissionDeniedError("the client dialed " + request.dialed_endpoint +
                                        ", which is not engine " + context_.engine_id + " (" +
                                        advertised + "): refusing a relayed proof"));
  }
  auth->authenticated = true;
  std::string reply_payload = EncodeAuthOk(TcpServerMac(context_.auth_token, binding));
  return conn->SendReply(FrameType::kAuthOk, h.request_id, reply_payload).ok();
}

bool FrameServer::HandleFrame(FrameConnection* conn, const uint8_t* raw, AuthState* auth) {
  FrameHeader h;
  if (Status s = DecodeHeader(raw, &h); !s.ok()) {
    // Without a valid header the next frame boundary is unknown: report, then close.
    conn->SendError(0, s.WithContext("malformed frame from " + conn->stream_.peer())).IgnoreError();
    return false;
  }
  if (h.type == FrameType::kAuth) return HandleAuth(conn, h, auth);
  if (!auth->authenticated) {
    conn->SendError(h.request_id, PermissionDeniedError(
                                      "authenticate before sending data frames (cluster token)"))
        .IgnoreError();
    return false;
  }
  const Handler& handler = handlers_[static_cast<size_t>(h.type)];
  if (!handler) {
    conn->SendError(h.request_id,
                    InvalidArgumentError("frame type " + std::to_string(static_cast<int>(h.type)) +
                                         " is not a request this engine serves"))
        .IgnoreError();
    return false;  // its payload length cannot be trusted
  }
  if (h.type != FrameType::kRead && h.type != FrameType::kWrite) return handler(*conn, h);
  if ((h.flags & kFlagLatency) != 0) {
    if (!conn->latency_priority_) {
      RaiseThisThreadPriority();
      conn->latency_priority_ = true;
    }
    LatencyWorkScope latency;
    return handler(*conn, h);
  }
  if (!conn->bulk_priority_) {
    LowerThisThreadPriority(kBulkNice);
    conn->bulk_priority_ = true;
  }
  return handler(*conn, h);
}

}  // namespace larder::transfer::wire
