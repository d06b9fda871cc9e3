// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "master/local_control_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "common/env.h"
#include "common/local_control.h"
#include "common/logging.h"

namespace larder::master {

namespace {

// A client that does not take its reply within this long loses its connection.
constexpr std::chrono::milliseconds kSendTimeout{10000};

}  // namespace

Result<std::unique_ptr<LocalControlServer>> LocalControlServer::Listen(size_t max_connections) {
  std::string name = fmt::format("larder-master-{:016x}", RandomU64());
  LARDER_ASSIGN_OR_RETURN(Fd listener, UnixListenAbstract(name));
  Fd wake(eventfd(0, EFD_CLOEXEC));
  if (!wake.valid()) return InternalError(std::string("eventfd: ") + std::strerror(errno));
  return std::unique_ptr<LocalControlServer>(new LocalControlServer(
      std::move(name), std::move(listener), std::move(wake), std::max<size_t>(max_connections, 1)));
}

LocalControlServer::LocalControlServer(std::string name, Fd listener, Fd wake,
                                       size_t max_connections)
    : name_(std::move(name)),
      max_connections_(max_connections),
      listener_(std::move(listener)),
      wake_(std::move(wake)) {}

LocalControlServer::~LocalControlServer() { Stop(); }

void LocalControlServer::Start(ServedMaster* service) {
  service_ = service;
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

void LocalControlServer::Stop() {
  std::list<std::unique_ptr<Connection>> connections;
  {
    MutexLock lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    // A connection's thread waiting for its next call wakes with the end of its stream.
    for (const auto& connection : connections_) shutdown(connection->fd.get(), SHUT_RDWR);
    connections = std::move(connections_);
  }
  const uint64_t one = 1;
  if (write(wake_.get(), &one, sizeof(one)) != sizeof(one)) {
    Log().warn("local control socket: cannot wake its accept loop: {}", std::strerror(errno));
  }
  if (acceptor_.joinable()) acceptor_.join();
  for (const auto& connection : connections) connection->thread.join();
}

void LocalControlServer::AcceptLoop() {
  for (;;) {
    pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      Log().error("local control socket: poll: {}", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    Fd accepted(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!accepted.valid()) {
      if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
      // Out of descriptors or memory: connections wait in the backlog until some close.
      Log().warn("local control socket: accept: {}", std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    MutexLock lock(mu_);
    if (stopping_) return;
    connections_.remove_if([](const std::unique_ptr<Connection>& connection) {
      if (!connection->done.load()) return false;
      connection->thread.join();
      return true;
    });
    if (connections_.size() >= max_connections_) {
      // Closed unanswered: the client goes on over gRPC.
      if (refused_.fetch_add(1, std::memory_order_relaxed) == 0) {
        Log().warn(
            "local control socket: {} connections already, refusing more (their clients "
            "use gRPC)",
            max_connections_);
      }
      continue;
    }
    auto connection = std::make_unique<Connection>();
    connection->fd = std::move(accepted);
    Connection* raw = connection.get();
    connection->thread = std::thread([this, raw] {
      ServeConnection(raw->fd.get());
      // The peer learns at once that the connection is over; the descriptor is closed when
      // the thread is reaped (a close here could race with Stop's shutdown of a reused number).
      shutdown(raw->fd.get(), SHUT_RDWR);
      raw->done.store(true);
    });
    connections_.push_back(std::move(connection));
  }
}

void LocalControlServer::ServeConnection(int fd) {
  using local_control::ReplyHead;
  using local_control::RequestHead;
  timeval send_timeout{kSendTimeout.count() / 1000, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
  std::string request;
  std::string reply;
  uint64_t bound_session = 0;  // see ServedMaster::LocalCall
  for (;;) {
    RequestHead head;
    if (!local_control::ReadAll(fd, &head, sizeof(head))) return;  // closed, or Stop
    if (head.version != local_control::kVersion || head.length > local_control::kMaxBodyBytes ||
        (head.flags & ~local_control::kProofAfterBytes) != 0) {
      Log().warn(
          "local control socket: closing a connection that sent a frame of version {}, "
          "flags {:#x} and {} bytes (version {}, at most {} bytes)",
          head.version, head.flags, head.length, local_control::kVersion,
          local_control::kMaxBodyBytes);
      return;
    }
    if (!local_control::ReadBody(fd, head.length, &request)) return;
    bool bound = false;
    grpc::Status status = service_->ServeLocal(
        ServedMaster::LocalCall{head.method, (head.flags & local_control::kProofAfterBytes) != 0,
                                request, &bound_session, &bound},
        &reply);
    calls_.fetch_add(1, std::memory_order_relaxed);
    if (status.ok() && reply.size() > local_control::kMaxBodyBytes) {
      status = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            fmt::format("the reply of {} bytes exceeds the limit of {}",
                                        reply.size(), local_control::kMaxBodyBytes));
    }
    const std::string& message = status.error_message();
    const std::string& details = status.error_details();
    ReplyHead out;
    out.code = static_cast<uint32_t>(status.error_code());
    out.message_length =
        static_cast<uint32_t>(std::min<size_t>(message.size(), local_control::kMaxStatusBytes));
    out.details_length =
        static_cast<uint32_t>(std::min<size_t>(details.size(), local_control::kMaxStatusBytes));
    out.body_length = status.ok() ? static_cast<uint32_t>(reply.size()) : 0;
    out.flags = bound ? local_control::kBound : 0;
    iovec pieces[4] = {{&out, sizeof(out)},
                       {const_cast<char*>(message.data()), out.message_length},
                       {const_cast<char*>(details.data()), out.details_length},
                       {reply.data(), out.body_length}};
    if (!local_control::WriteAll(fd, pieces)) return;
  }
}

}  // namespace larder::master
