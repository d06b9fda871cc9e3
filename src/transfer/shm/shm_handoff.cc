// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/shm/shm_handoff.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/logging.h"
#include "transfer/segment_exports.h"

namespace larder::transfer {
namespace {

// How long one handoff exchange may take before the server drops the connection. Exchanges are
// local and take well under a millisecond; the bound keeps a stalled peer from delaying others.
constexpr auto kHandoffTimeout = std::chrono::milliseconds(500);

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
  if (m.code > static_cast<uint8_t>(StatusCode::kDataLoss)) code = StatusCode::kInternal;
  return Status(code, text);
}

}  // namespace

std::array<uint8_t, 32> HandoffMac(const std::string& token, const uint8_t* nonce,
                                   uint64_t segment_id, uint64_t epoch) {
  uint8_t data[48];
  std::memcpy(data, nonce, 32);
  std::memcpy(data + 32, &segment_id, 8);
  std::memcpy(data + 40, &epoch, 8);
  return HmacSha256(token, data, sizeof(data));
}

ShmHandoffServer::ShmHandoffServer(const EngineContext& context, std::vector<uint32_t> allowed_uids)
    : context_(context), allowed_uids_(std::move(allowed_uids)) {
  if (allowed_uids_.empty()) allowed_uids_.push_back(static_cast<uint32_t>(getuid()));
}

ShmHandoffServer::~ShmHandoffServer() { Stop(); }

Status ShmHandoffServer::Start(const std::string& name) {
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
  while (!stopping_.load()) {
    pollfd p{listener_.get(), POLLIN, 0};
    int rc = poll(&p, 1, 200);
    if (rc <= 0) continue;
    Fd conn(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn.valid()) continue;
    // Exchanges are tiny and bounded by kHandoffTimeout, so serving them in line is enough.
    Serve(conn.get());
  }
}

void ShmHandoffServer::Serve(int fd) {
  Deadline deadline = Clock::now() + kHandoffTimeout;
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return;
  std::string peer = "pid " + std::to_string(cred.pid) + " uid " + std::to_string(cred.uid);
  if (std::find(allowed_uids_.begin(), allowed_uids_.end(), cred.uid) == allowed_uids_.end()) {
    Status denied = PermissionDeniedError("uid " + std::to_string(cred.uid) +
                                          " may not map segments of engine " + context_.engine_id);
    Log().warn("shm handoff refused to {}: {}", peer, denied.ToString());
    auto m = Reply(denied, 0);
    SendWithFd(fd, &m, sizeof(m), -1).IgnoreError();
    return;
  }
  HandoffServerMessage hello;
  hello.type = HandoffServerMessage::kHello;
  hello.need_auth = context_.auth_token.empty() ? 0 : 1;
  RandomBytes(hello.nonce, sizeof(hello.nonce));
  if (!SendWithFd(fd, &hello, sizeof(hello), -1).ok()) return;

  HandoffRequest request;
  Status status = RecvAll(fd, &request, sizeof(request), deadline, peer);
  if (!status.ok()) return;
  auto reply_error = [&](const Status& error) {
    Log().warn("shm handoff to {} failed: {}", peer, error.ToString());
    auto m = Reply(error, 0);
    SendWithFd(fd, &m, sizeof(m), -1).IgnoreError();
  };
  if (request.magic != kHandoffMagic) {
    reply_error(InvalidArgumentError("malformed handoff request (bad magic)"));
    return;
  }
  if (hello.need_auth) {
    auto expected = HandoffMac(context_.auth_token, hello.nonce, request.segment_id, request.epoch);
    if (!DigestEqual(expected.data(), request.mac)) {
      reply_error(PermissionDeniedError("wrong cluster token in shm handoff to engine " +
                                        context_.engine_id));
      return;
    }
  }
  auto exported = context_.exports->Get(request.segment_id);
  if (!exported.ok()) {
    reply_error(exported.status());
    return;
  }
  if (exported->descriptor.epoch != request.epoch) {
    reply_error(NotFoundError("segment " + std::to_string(request.segment_id) +
                              " was re-registered (stale epoch)"));
    return;
  }
  if (!exported->memory || exported->memory->fd() < 0) {
    reply_error(FailedPreconditionError("segment '" + exported->descriptor.name +
                                        "' is not memfd-backed and cannot be shared"));
    return;
  }
  auto m = Reply(Status(), exported->descriptor.size);
  SendWithFd(fd, &m, sizeof(m), exported->memory->fd()).IgnoreError();
}

Result<Fd> RequestSegmentFd(const SegmentDescriptor& descriptor, const std::string& token,
                            Deadline deadline, uint64_t* size, pid_t* owner_pid) {
  std::string peer = "engine " + descriptor.engine_id + " (@" + descriptor.shm_socket + ")";
  auto conn = UnixConnectAbstract(descriptor.shm_socket, deadline);
  if (!conn.ok()) return UnavailableError(peer + ": " + conn.status().message());
  ucred cred{};
  socklen_t cred_len = sizeof(cred);
  *owner_pid =
      getsockopt(conn->get(), SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) == 0 ? cred.pid : 0;
  HandoffServerMessage hello;
  Fd unused;
  LARDER_RETURN_IF_ERROR(RecvWithFd(conn->get(), &hello, sizeof(hello), &unused, deadline, peer)
                             .WithContext("shm handoff"));
  if (hello.magic != kHandoffMagic)
    return InternalError(peer + " sent a malformed handoff greeting");
  if (hello.type == HandoffServerMessage::kReply)
    return ReplyStatus(hello).WithContext("shm handoff");
  if (hello.need_auth && token.empty()) {
    return PermissionDeniedError(peer + " requires a cluster token and none is configured");
  }
  HandoffRequest request;
  request.segment_id = descriptor.segment_id;
  request.epoch = descriptor.epoch;
  if (hello.need_auth) {
    auto mac = HandoffMac(token, hello.nonce, descriptor.segment_id, descriptor.epoch);
    std::memcpy(request.mac, mac.data(), mac.size());
  }
  LARDER_RETURN_IF_ERROR(SendAll(conn->get(), &request, sizeof(request), deadline, peer));
  HandoffServerMessage reply;
  Fd fd;
  LARDER_RETURN_IF_ERROR(RecvWithFd(conn->get(), &reply, sizeof(reply), &fd, deadline, peer));
  if (reply.magic != kHandoffMagic || reply.type != HandoffServerMessage::kReply) {
    return InternalError(peer + " sent a malformed handoff reply");
  }
  if (reply.code != 0) return ReplyStatus(reply).WithContext("shm handoff");
  if (!fd.valid()) return InternalError(peer + " replied OK without a file descriptor");
  *size = reply.size;
  return fd;
}

}  // namespace larder::transfer
