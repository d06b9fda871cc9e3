// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "standalone/frame_io.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

namespace larder::standalone {
namespace {

// sun_path less the NUL that starts an abstract name or ends a path.
constexpr size_t kMaxSocketName = sizeof(sockaddr_un::sun_path) - 1;

sockaddr_un UnixAddress(const SocketAddress& address, socklen_t* len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t n = std::min(address.name.size(), kMaxSocketName);
  if (address.abstract) {
    std::memcpy(addr.sun_path + 1, address.name.data(), n);
    *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  } else {
    std::memcpy(addr.sun_path, address.name.data(), n);
    *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + n + 1);
  }
  return addr;
}

bool AllDigits(std::string_view text) {
  if (text.empty()) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

Result<Fd> Bind(const SocketAddress& address, int* error) {
  Fd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoToStatus(errno, "socket(AF_UNIX)");
  socklen_t len = 0;
  sockaddr_un addr = UnixAddress(address, &len);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    *error = errno;
    return ErrnoToStatus(errno, "bind " + address.display);
  }
  return fd;
}

}  // namespace

Result<SocketAddress> ResolveSocketAddress(std::string_view text) {
  SocketAddress address;
  if (text.empty()) return InvalidArgumentError("empty larder-client socket address");
  if (text.front() == '@') {
    address.abstract = true;
    address.name = std::string(text.substr(1));
    if (address.name.empty()) return InvalidArgumentError("empty abstract socket name '@'");
  } else if (text.find('/') != std::string_view::npos) {
    address.abstract = false;
    address.name = std::string(text);
  } else if (size_t colon = text.rfind(':');
             colon != std::string_view::npos && AllDigits(text.substr(colon + 1))) {
    // Mooncake's client_server_address "host:port": the daemon is on this host by definition,
    // so only the port tells daemons apart.
    std::string_view port_text = text.substr(colon + 1);
    if (port_text.size() > 5 || std::stoul(std::string(port_text)) > 65535 ||
        std::stoul(std::string(port_text)) == 0) {
      return InvalidArgumentError("bad port in larder-client address '" + std::string(text) + "'");
    }
    address.abstract = true;
    address.name = "larder-client-" + std::to_string(std::stoul(std::string(port_text)));
  } else {
    return InvalidArgumentError("larder-client address '" + std::string(text) +
                                "' is none of @name (abstract socket), a path, or host:port");
  }
  if (address.name.size() > kMaxSocketName) {
    return InvalidArgumentError("larder-client socket name '" + std::string(text) + "' exceeds " +
                                std::to_string(kMaxSocketName) + " bytes");
  }
  if (address.name.find('\0') != std::string::npos) {
    return InvalidArgumentError("larder-client socket name contains a NUL byte");
  }
  address.display = address.abstract ? "@" + address.name : address.name;
  return address;
}

Result<Fd> ListenOn(const SocketAddress& address) {
  int error = 0;
  Result<Fd> bound = Bind(address, &error);
  if (!bound.ok() && error == EADDRINUSE && !address.abstract) {
    // A socket file outlives the process that bound it. Replace it only when it is a socket
    // that nobody serves; never unlink anything else.
    struct stat st {};
    if (lstat(address.name.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) &&
        ConnectTo(address).status().code() == StatusCode::kUnavailable) {
      unlink(address.name.c_str());
      bound = Bind(address, &error);
    }
  }
  if (!bound.ok()) {
    if (error == EADDRINUSE) {
      return AlreadyExistsError(address.display +
                                " is taken: another larder-client serves it (pick --socket)");
    }
    return bound.status();
  }
  if (!address.abstract) chmod(address.name.c_str(), 0600);
  if (listen(bound->get(), 128) != 0) return ErrnoToStatus(errno, "listen " + address.display);
  return std::move(*bound);
}

Result<Fd> ConnectTo(const SocketAddress& address) {
  Fd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoToStatus(errno, "socket(AF_UNIX)");
  socklen_t len = 0;
  sockaddr_un addr = UnixAddress(address, &len);
  // A local connect does not block past the backlog check.
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    int err = errno;
    if (err == ECONNREFUSED || err == ENOENT) {
      return UnavailableError("no larder-client serves " + address.display);
    }
    if (err == EAGAIN) {
      return UnavailableError("larder-client at " + address.display +
                              " is not accepting connections (backlog full)");
    }
    return ErrnoToStatus(err, "connect to larder-client at " + address.display);
  }
  return fd;
}

Result<PeerCredentials> GetPeerCredentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return ErrnoToStatus(errno, "SO_PEERCRED");
  }
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

Status SendFrame(int fd, uint16_t type, uint64_t request_id, std::string_view payload, int pass_fd,
                 Deadline deadline, std::string_view peer) {
  MessageHeader header;
  header.type = type;
  header.request_id = request_id;
  header.length = static_cast<uint32_t>(payload.size());
  iovec iov[2] = {{&header, sizeof(header)}, {const_cast<char*>(payload.data()), payload.size()}};
  int iovcnt = payload.empty() ? 1 : 2;
  return SendAllV(fd, iov, iovcnt, deadline, peer, pass_fd);
}

Status WaitReadable(int fd, std::string_view peer) {
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    int rc = poll(&p, 1, -1);
    if (rc > 0) return Status::Ok();
    if (rc < 0 && errno != EINTR) return ErrnoToStatus(errno, "poll " + std::string(peer));
  }
}

Status RecvFrame(int fd, uint32_t max_length, Deadline deadline, std::string_view peer,
                 Frame* frame) {
  frame->payload.clear();
  frame->extra_fds = false;
  LARDER_RETURN_IF_ERROR(
      RecvWithFd(fd, &frame->header, sizeof(frame->header), &frame->fd, deadline, peer));
  LARDER_RETURN_IF_ERROR(CheckHeader(frame->header, max_length));
  if (frame->header.length == 0) return Status::Ok();
  frame->payload.resize(frame->header.length);
  Fd late;
  LARDER_RETURN_IF_ERROR(
      RecvWithFd(fd, frame->payload.data(), frame->payload.size(), &late, deadline, peer));
  if (late.valid()) {
    if (frame->fd.valid()) {
      frame->extra_fds = true;
    } else {
      frame->fd = std::move(late);
    }
  }
  return Status::Ok();
}

}  // namespace larder::standalone
