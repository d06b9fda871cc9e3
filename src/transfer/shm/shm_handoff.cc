// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/shm/shm_handoff.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "common/logging.h"
#include "transfer/segment_exports.h"

namespace larder::transfer {
namespace {

// How long one handoff exchange may take before the server drops the connection. Exchanges are
// local and take well under a millisecond; the bound keeps a stalled peer from delaying others.

// Copies `text` into a fixed string field. REQUIRES: text.size() <= N - 1 and <= 255.
template <size_t N>
void SetField(char (&field)[N], uint8_t* length, std::string_view text) {
  static_assert(N >= 2);
  std::memcpy(field, text.data(), text.size());
  *length = static_cast<uint8_t>(text.size());
}

// The string in a received fixed field; false when its length does not fit the field (or `limit`).
template <size_t N>
bool GetField(const char (&field)[N], uint8_t length, size_t limit, std::string_view* text) {
  if (length > N - 1 || length > limit) return false;
  *text = std::string_view(field, length);
  return true;
}

HandoffServerMessage Reply(const Status& status, uint64_t size) {
  HandoffServerMessage m;
  m.type = HandoffServerMessage::kReply;
  m.code = static_cast<uint8_t>(status.code());
  m.size = size;
  std::string text = status.message().substr(0, sizeof(m.message) - 1);
  std::memcpy(m.message, text.data(), text.size());
  return m;
}

Status ReplyStatus(const HandoffServerMessage& m) {
  std::string text(m.message, strnlen(m.message, sizeof(m.message)));
  auto code = static_cast<StatusCode>(m.code);
  if (m.code > static_cast<uint8_t>(StatusCode::kUnauthenticated)) code = StatusCode::kInternal;
  return Status(code, text);
}

MacInput BindingInput(std::string_view label, const HandoffBinding& b) {
  MacInput input(label);
  input.Add(b.owner_nonce, kHandoffNonceBytes)
      .Add(b.peer_nonce, kHandoffNonceBytes)
      .Add(b.owner_engine_id)
      .Add(b.socket_name)
      .Add(b.peer_engine_id)
      .Add(b.segment_id)
      .Add(b.epoch);
  return input;
}

}  // namespace

std::array<uint8_t, 32> HandoffPeerMac(std::string_view token, const HandoffBinding& binding) {
  return BindingInput("larder-shm-client-v1", binding).Sign(token);
}

std::array<uint8_t, 32> HandoffOwnerMac(std::string_view token, const HandoffBinding& binding,
                                        uint8_t code, uint64_t size) {
  MacInput input = BindingInput("larder-shm-server-v1", binding);
  input.Add(uint64_t{code}).Add(size);
  return input.Sign(token);
}

ShmHandoffServer::ShmHandoffServer(const EngineContext& context, std::vector<uint32_t> allowed_uids,
                                   std::chrono::milliseconds timeout)
    : context_(context), allowed_uids_(std::move(allowed_uids)), timeout_(timeout) {
  if (allowed_uids_.empty()) allowed_uids_.push_back(static_cast<uint32_t>(getuid()));
}

ShmHandoffServer::~ShmHandoffServer() { Stop(); }

Status ShmHandoffServer::Start(const std::string& name) {
  if (context_.engine_id.size() > kHandoffMaxEngineId) {
    return InvalidArgumentError(
        "engine id '" + context_.engine_id + "' is " + std::to_string(context_.engine_id.size()) +
        " bytes; the shm handoff carries at most " + std::to_string(kHandoffMaxEngineId));
  }
  if (name.size() > kHandoffMaxSocketName) {
    return InvalidArgumentError("shm handoff socket name @" + name + " is " +
                                std::to_string(name.size()) +
                                " bytes; abstract Unix socket names hold at most " +
                                std::to_string(kHandoffMaxSocketName) + " (shorten the host id)");
  }
  socket_name_ = name;
  LARDER_ASSIGN_OR_RETURN(listener_, UnixListenAbstract(name));
  thread_ = std::thread([this] { AcceptLoop(); });
  return Status();
}

void ShmHandoffServer::Stop() {
  if (stopping_.exchange(true)) return;
  if (listener_.valid()) shutdown(listener_.get(), SHUT_RDWR);
  if (thread_.joinable()) thread_.join();
  listener_.Reset();
}

void ShmHandoffServer::AcceptLoop() {
  // Every exchange in progress, each with its own deadline: a peer that stalls holds only its own
  // connection, never the others'.
  std::vector<std::unique_ptr<Exchange>> pending;
  std::vector<pollfd> fds;
  while (!stopping_.load()) {
    Deadline now = Clock::now();
    int timeout_ms = 200;
    for (const auto& ex : pending) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(ex->deadline - now);
      timeout_ms = std::clamp<int>(static_cast<int>(left.count()) + 1, 0, timeout_ms);
    }
    fds.assign(1, pollfd{listener_.get(), POLLIN, 0});
    for (const auto& ex : pending) fds.push_back(pollfd{ex->owned.get(), POLLIN, 0});
    if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) continue;
    now = Clock::now();
    // Requests that arrived, then connections that ended or ran out of time.
    for (size_t i = 0; i < pending.size(); ++i) {
      Exchange& ex = *pending[i];
      if ((fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR)) != 0) ReadRequest(&ex);
      if (!ex.done && now >= ex.deadline) {
        Log().warn("shm handoff to {}: no request within {} ms; dropped", ex.peer,
                   timeout_.count());
        ex.done = true;
      }
    }
    std::erase_if(pending, [](const auto& ex) { return ex->done; });
    if ((fds[0].revents & POLLIN) == 0) continue;
    Fd conn(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!conn.valid()) continue;
    auto ex = std::make_unique<Exchange>();
    ex->fd = conn.get();
    ex->owned = std::move(conn);
    if (pending.size() >= kMaxPendingHandoffs) {
      auto m =
          Reply(UnavailableError("engine " + context_.engine_id + " is serving " +
                                 std::to_string(pending.size()) + " shm handoffs already; retry"),
                0);
      SendWithFd(ex->fd, &m, sizeof(m), -1).IgnoreError();
      continue;
    }
    if (Greet(ex.get())) pending.push_back(std::move(ex));
  }
}

bool ShmHandoffServer::Greet(Exchange* ex) {
  ex->deadline = Clock::now() + timeout_;
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(ex->fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  ex->peer = "pid " + std::to_string(cred.pid) + " uid " + std::to_string(cred.uid);
  if (std::find(allowed_uids_.begin(), allowed_uids_.end(), cred.uid) == allowed_uids_.end()) {
    Status denied = PermissionDeniedError("uid " + std::to_string(cred.uid) +
                                          " may not map segments of engine " + context_.engine_id);
    Log().warn("shm handoff refused to {}: {}", ex->peer, denied.ToString());
    auto m = Reply(denied, 0);
    SendWithFd(ex->fd, &m, sizeof(m), -1).IgnoreError();
    return false;
  }
  ex->hello.type = HandoffServerMessage::kHello;
  ex->hello.need_auth = context_.auth_token.empty() ? 0 : 1;
  RandomBytes(ex->hello.nonce, sizeof(ex->hello.nonce));
  SetField(ex->hello.engine_id, &ex->hello.engine_id_len, context_.engine_id);
  // A fresh socket's buffer holds the greeting: this send does not wait for the peer.
  return SendWithFd(ex->fd, &ex->hello, sizeof(ex->hello), -1).ok();
}

void ShmHandoffServer::ReadRequest(Exchange* ex) {
  auto* into = reinterpret_cast<uint8_t*>(&ex->request);
  while (ex->received < sizeof(ex->request)) {
    ssize_t n = recv(ex->fd, into + ex->received, sizeof(ex->request) - ex->received, MSG_DONTWAIT);
    if (n > 0) {
      ex->received += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    ex->done = true;  // closed or broken before a whole request: nothing to answer
    return;
  }
  Answer(*ex);
  ex->done = true;
}

void ShmHandoffServer::Serve(int fd) {
  Exchange ex;
  ex.fd = fd;
  if (!Greet(&ex)) return;
  if (!RecvAll(fd, &ex.request, sizeof(ex.request), ex.deadline, ex.peer).ok()) return;
  Answer(ex);
}

void ShmHandoffServer::Answer(const Exchange& ex) {
  const int fd = ex.fd;
  const HandoffRequest& request = ex.request;
  const HandoffServerMessage& hello = ex.hello;
  const bool need_auth = hello.need_auth != 0;
  std::string peer = ex.peer;
  auto reply_error = [&](const Status& error) {
    Log().warn("shm handoff to {} failed: {}", peer, error.ToString());
    auto m = Reply(error, 0);
    if (Status sent = SendWithFd(fd, &m, sizeof(m), -1); !sent.ok()) {
      Log().debug("shm handoff refusal to {} not sent: {}", peer, sent.ToString());
    }
  };
  std::string_view peer_engine_id, dialed;
  if (request.magic != kHandoffMagic) {
    reply_error(InvalidArgumentError("malformed handoff request (bad magic)"));
    return;
  }
  if (!GetField(request.engine_id, request.engine_id_len, kHandoffMaxEngineId, &peer_engine_id) ||
      !GetField(request.socket, request.socket_len, kHandoffMaxSocketName, &dialed)) {
    reply_error(InvalidArgumentError("malformed handoff request (field length out of range)"));
    return;
  }
  peer += " (says engine " + std::string(peer_engine_id) + ")";  // unproven until the mac checks
  // A relay forwards our greeting to a peer that dialed the relay's socket; the peer's proof names
  // that socket, so it never verifies here. This check only makes the refusal say so.
  if (dialed != socket_name_) {
    reply_error(PermissionDeniedError("relayed handoff refused: the peer dialed @" +
                                      std::string(dialed) + ", not this engine's socket"));
    return;
  }
  HandoffBinding binding{hello.nonce,    request.nonce,      context_.engine_id, socket_name_,
                         peer_engine_id, request.segment_id, request.epoch};
  if (need_auth) {
    auto expected = HandoffPeerMac(context_.auth_token, binding);
    if (!DigestEqual(expected.data(), request.mac)) {
      reply_error(PermissionDeniedError("wrong cluster token in shm handoff to engine " +
                                        context_.engine_id));
      return;
    }
  }
  // From here on the peer proved the token (when there is one): replies carry our proof back.
  auto reply = [&](const Status& result, uint64_t size, int pass_fd) {
    if (!result.ok()) Log().warn("shm handoff to {} failed: {}", peer, result.ToString());
    auto m = Reply(result, size);
    if (need_auth) {
      auto mac = HandoffOwnerMac(context_.auth_token, binding, m.code, m.size);
      std::memcpy(m.mac, mac.data(), mac.size());
    }
    // The peer may have gone (or given up at its deadline): say so, nothing else to do.
    if (Status sent = SendWithFd(fd, &m, sizeof(m), pass_fd); !sent.ok()) {
      Log().warn("shm handoff reply{} to {} not sent: {}", pass_fd >= 0 ? " with the memfd" : "",
                 peer, sent.ToString());
    }
  };
  auto exported = context_.exports->Get(request.segment_id);
  if (!exported.ok()) {
    reply(exported.status(), 0, -1);
    return;
  }
  if (exported->descriptor.epoch != request.epoch) {
    reply(NotFoundError("segment " + std::to_string(request.segment_id) +
                        " was re-registered (stale epoch)"),
          0, -1);
    return;
  }
  if (!exported->memory || exported->memory->fd() < 0) {
    reply(FailedPreconditionError("segment '" + exported->descriptor.name +
                                  "' is not memfd-backed and cannot be shared"),
          0, -1);
    return;
  }
  reply(Status(), exported->descriptor.size, exported->memory->fd());
}

Result<Fd> RequestSegmentFd(const SegmentDescriptor& descriptor, const EngineContext& self,
                            Deadline deadline, uint64_t* size, pid_t* owner_pid) {
  const std::string* blob = descriptor.TransportBlob("shm");
  if (blob == nullptr || blob->empty()) {
    return FailedPreconditionError("segment '" + descriptor.name + "' has no shm socket");
  }
  const std::string& socket = *blob;
  std::string peer = "engine " + descriptor.engine_id + " (@" + socket + ")";
  const std::string& token = self.auth_token;
  if (self.engine_id.size() > kHandoffMaxEngineId) {
    return InvalidArgumentError("engine id '" + self.engine_id +
                                "' is too long for the shm handoff");
  }
  if (socket.size() > kHandoffMaxSocketName) {
    return InvalidArgumentError(peer + ": shm socket name longer than " +
                                std::to_string(kHandoffMaxSocketName) + " bytes");
  }
  auto conn = UnixConnectAbstract(socket, deadline);
  if (!conn.ok()) return UnavailableError(peer + ": " + conn.status().message());
  ucred cred{};
  socklen_t cred_len = sizeof(cred);
  *owner_pid =
      getsockopt(conn->get(), SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) == 0 ? cred.pid : 0;
  HandoffServerMessage hello;
  Fd unused;  // a greeting never carries an fd; one attached anyway is closed here
  LARDER_RETURN_IF_ERROR(RecvWithFd(conn->get(), &hello, sizeof(hello), &unused, deadline, peer)
                             .WithContext("shm handoff"));
  if (hello.magic != kHandoffMagic) {
    return InternalError(peer + " sent a malformed handoff greeting");
  }
  if (hello.type == HandoffServerMessage::kReply && hello.code != 0) {
    return ReplyStatus(hello).WithContext("shm handoff");
  }
  std::string_view owner_engine_id;
  if (hello.type != HandoffServerMessage::kHello ||
      !GetField(hello.engine_id, hello.engine_id_len, kHandoffMaxEngineId, &owner_engine_id)) {
    return InternalError(peer + " sent a malformed handoff greeting");
  }
  if (owner_engine_id != descriptor.engine_id) {
    return PermissionDeniedError("@" + socket + " is served by engine " +
                                 std::string(owner_engine_id) + ", not by " + descriptor.engine_id +
                                 "; refusing its segment");
  }
  if (hello.need_auth && token.empty()) {
    return PermissionDeniedError(peer + " requires a cluster token and none is configured");
  }
  if (!hello.need_auth && !token.empty()) {
    // Whoever serves a socket named in a descriptor could hand us any fd (memory that it keeps
    // mapped, or planted bytes); with a token, only an owner that proves it is trusted.
    return PermissionDeniedError(peer +
                                 " asks for no proof of the cluster token, so it cannot prove it "
                                 "holds it either; refusing to map a segment from it");
  }
  HandoffRequest request;
  request.segment_id = descriptor.segment_id;
  request.epoch = descriptor.epoch;
  RandomBytes(request.nonce, sizeof(request.nonce));
  SetField(request.engine_id, &request.engine_id_len, self.engine_id);
  SetField(request.socket, &request.socket_len, socket);
  HandoffBinding binding{hello.nonce,    request.nonce,         owner_engine_id, socket,
                         self.engine_id, descriptor.segment_id, descriptor.epoch};
  if (hello.need_auth) {
    auto mac = HandoffPeerMac(token, binding);
    std::memcpy(request.mac, mac.data(), mac.size());
  }
  LARDER_RETURN_IF_ERROR(SendAll(conn->get(), &request, sizeof(request), deadline, peer));
  HandoffServerMessage reply;
  Fd fd;  // closed on every error path below: an fd is used only after the reply checks out
  LARDER_RETURN_IF_ERROR(RecvWithFd(conn->get(), &reply, sizeof(reply), &fd, deadline, peer));
  if (reply.magic != kHandoffMagic || reply.type != HandoffServerMessage::kReply) {
    return InternalError(peer + " sent a malformed handoff reply");
  }
  if (reply.code != 0) return ReplyStatus(reply).WithContext("shm handoff");
  if (hello.need_auth) {
    auto expected = HandoffOwnerMac(token, binding, reply.code, reply.size);
    if (!DigestEqual(expected.data(), reply.mac)) {
      return PermissionDeniedError(peer +
                                   " replied without proof of the cluster token; its fd was "
                                   "closed unused");
    }
  }
  if (!fd.valid()) return InternalError(peer + " replied OK without a file descriptor");
  *size = reply.size;
  return fd;
}

}  // namespace larder::transfer
