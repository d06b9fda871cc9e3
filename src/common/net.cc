// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "common/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <time.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "common/logging.h"

namespace larder {
namespace {

int MillisUntil(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return 0;
  return left.count() > 60'000 ? 60'000 : static_cast<int>(left.count()) + 1;
}

// Waits for `events` on fd. OK when ready.
Status WaitFor(int fd, short events, Deadline deadline, std::string_view peer) {
  for (;;) {
    int timeout = MillisUntil(deadline);
    if (timeout == 0 && Clock::now() >= deadline) {
      return DeadlineExceededError("timed out waiting for " + std::string(peer));
    }
    pollfd p{fd, events, 0};
    int rc = poll(&p, 1, timeout);
    if (rc > 0) return Status();
    if (rc < 0 && errno != EINTR) return ErrnoToStatus(errno, "poll " + std::string(peer));
  }
}

// Room for the SCM_RIGHTS control message of one fd.
struct FdControl {
  alignas(cmsghdr) char bytes[CMSG_SPACE(sizeof(int))] = {};
};

// Makes `msg` carry `pass_fd` (SCM_RIGHTS); `control` holds the message until the send.
void AttachFd(msghdr* msg, FdControl* control, int pass_fd) {
  msg->msg_control = control->bytes;
  msg->msg_controllen = sizeof(control->bytes);
  cmsghdr* cmsg = CMSG_FIRSTHDR(msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cmsg), &pass_fd, sizeof(int));
}

sockaddr_un AbstractAddress(const std::string& name, socklen_t* len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  size_t n = std::min(name.size(), sizeof(addr.sun_path) - 1);
  std::memcpy(addr.sun_path + 1, name.data(), n);
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return addr;
}

}  // namespace

Deadline CoarseNow() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return Deadline(std::chrono::duration_cast<Clock::duration>(
      std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec)));
}

void Fd::Reset() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

Result<HostPort> ParseHostPort(std::string_view address) {
  size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == address.size()) {
    return InvalidArgumentError("bad address '" + std::string(address) + "' (want ip:port)");
  }
  HostPort hp;
  hp.host = std::string(address.substr(0, colon));
  if (hp.host == "localhost") hp.host = "127.0.0.1";
  in_addr probe{};
  // inet_pton reads up to a NUL: "1.2.3.4\0anything" must not pass as 1.2.3.4.
  if (hp.host.find('\0') != std::string::npos || inet_pton(AF_INET, hp.host.c_str(), &probe) != 1) {
    return InvalidArgumentError("bad IPv4 address in '" + std::string(address) + "'");
  }
  uint32_t port = 0;
  for (char c : address.substr(colon + 1)) {
    if (c < '0' || c > '9')
      return InvalidArgumentError("bad port in '" + std::string(address) + "'");
    port = port * 10 + static_cast<uint32_t>(c - '0');
    if (port > 65535)
      return InvalidArgumentError("port out of range in '" + std::string(address) + "'");
  }
  hp.port = static_cast<uint16_t>(port);
  return hp;
}

Result<HostPort> ResolveHostPort(std::string_view address) {
  auto parsed = ParseHostPort(address);
  if (parsed.ok()) return parsed;
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return parsed.status();
  const std::string host(address.substr(0, colon));
  // A name: letters, digits, '-' and '.' only (no NUL, no spaces), as DNS and /etc/hosts have.
  const bool name_like =
      host.size() <= 253 && std::all_of(host.begin(), host.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
      });
  if (!name_like) return parsed.status();
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int error = getaddrinfo(host.c_str(), nullptr, &hints, &found); error != 0) {
    return InvalidArgumentError("'" + host + "' in '" + std::string(address) +
                                "' is neither an IPv4 address nor a name this host resolves (" +
                                gai_strerror(error) + "); give an IPv4 address");
  }
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, text, sizeof(text));
  freeaddrinfo(found);
  const std::string resolved = std::string(text) + std::string(address.substr(colon));
  auto hp = ParseHostPort(resolved);
  if (hp.ok() && hp->host.rfind("127.", 0) == 0) {
    static std::once_flag warned;
    std::call_once(warned, [&] {
      Log().warn(
          "'{}' resolves to {}, a loopback address that other hosts cannot reach; give "
          "this host's own IPv4 address to be reached from other hosts",
          host, hp->host);
    });
  }
  return hp;
}

void TuneTcpSocket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // Socket buffer sizes are left to the kernel: setting SO_SNDBUF/SO_RCVBUF turns autotuning off
  // and caps them at net.core.[rw]mem_max (about 200 KiB by default), far below what autotuning
  // reaches (net.ipv4.tcp_[rw]mem, several MiB).
}

Result<Fd> TcpListen(const HostPort& address, int backlog) {
  Fd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoToStatus(errno, "socket");
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(address.port);
  inet_pton(AF_INET, address.host.c_str(), &addr.sin_addr);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoToStatus(errno, "bind " + address.ToString());
  }
  if (listen(fd.get(), backlog) != 0) return ErrnoToStatus(errno, "listen " + address.ToString());
  return fd;
}

Result<uint16_t> BoundPort(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return ErrnoToStatus(errno, "getsockname");
  }
  return ntohs(addr.sin_port);
}

Result<Fd> TcpConnect(const HostPort& address, Deadline deadline) {
  Fd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return ErrnoToStatus(errno, "socket");
  TuneTcpSocket(fd.get());
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(address.port);
  inet_pton(AF_INET, address.host.c_str(), &addr.sin_addr);
  std::string peer = address.ToString();
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno != EINPROGRESS) return ErrnoToStatus(errno, "connect to " + peer);
    LARDER_RETURN_IF_ERROR(WaitFor(fd.get(), POLLOUT, deadline, peer));
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return ErrnoToStatus(err, "connect to " + peer);
  }
  int flags = fcntl(fd.get(), F_GETFL);
  fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

Result<Fd> UnixListenAbstract(const std::string& name) {
  Fd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoToStatus(errno, "socket(AF_UNIX)");
  socklen_t len = 0;
  sockaddr_un addr = AbstractAddress(name, &len);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    return ErrnoToStatus(errno, "bind @" + name);
  }
  if (listen(fd.get(), 64) != 0) return ErrnoToStatus(errno, "listen @" + name);
  return fd;
}

Result<Fd> UnixConnectAbstract(const std::string& name, Deadline deadline) {
  Fd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoToStatus(errno, "socket(AF_UNIX)");
  socklen_t len = 0;
  sockaddr_un addr = AbstractAddress(name, &len);
  // Connecting to a local socket does not block beyond the backlog check.
  (void)deadline;
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    return ErrnoToStatus(errno, "connect @" + name);
  }
  return fd;
}

Status SendAllV(int fd, struct iovec* iov, int iovcnt, Deadline deadline, std::string_view peer,
                int pass_fd) {
  FdControl control;
  while (iovcnt > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(iovcnt);
    if (pass_fd >= 0) AttachFd(&msg, &control, pass_fd);
    ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        LARDER_RETURN_IF_ERROR(WaitFor(fd, POLLOUT, deadline, peer));
        continue;
      }
      return ErrnoToStatus(errno, "send to " + std::string(peer));
    }
    pass_fd = -1;  // it went with the bytes just sent
    size_t left = static_cast<size_t>(n);
    while (iovcnt > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --iovcnt;
    }
    if (iovcnt > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return Status();
}

Status SendAll(int fd, const void* data, size_t len, Deadline deadline, std::string_view peer) {
  iovec iov{const_cast<void*>(data), len};
  return SendAllV(fd, &iov, 1, deadline, peer);
}

Status RecvAll(int fd, void* data, size_t len, Deadline deadline, std::string_view peer) {
  auto* p = static_cast<char*>(data);
  while (len > 0) {
    ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return UnavailableError("peer " + std::string(peer) + " closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN) {
      LARDER_RETURN_IF_ERROR(WaitFor(fd, POLLIN, deadline, peer));
      continue;
    }
    return ErrnoToStatus(errno, "recv from " + std::string(peer));
  }
  return Status();
}

Status SendWithFd(int fd, const void* data, size_t len, int pass_fd) {
  iovec iov{const_cast<void*>(data), len};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  FdControl control;
  if (pass_fd >= 0) AttachFd(&msg, &control, pass_fd);
  ssize_t n;
  do {
    n = sendmsg(fd, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoToStatus(errno, "sendmsg fd " + std::to_string(fd));
  if (static_cast<size_t>(n) != len)
    return UnavailableError("short sendmsg on fd " + std::to_string(fd));
  return Status();
}

Status RecvWithFd(int fd, void* data, size_t len, Fd* received, Deadline deadline,
                  std::string_view peer) {
  *received = Fd();
  auto* p = static_cast<char*>(data);
  while (len > 0) {
    iovec iov{p, len};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        LARDER_RETURN_IF_ERROR(WaitFor(fd, POLLIN, deadline, peer));
        continue;
      }
      return ErrnoToStatus(errno, "recvmsg from " + std::string(peer));
    }
    if (n == 0) return UnavailableError("peer " + std::string(peer) + " closed the connection");
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
          int got;
          std::memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
          if (!received->valid()) {
            *received = Fd(got);
          } else {
            close(got);  // more fds than asked for: never leak them
          }
        }
      }
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Status();
}

namespace {

// OpenSSL 3 looks an algorithm up by name on every one-shot call (HMAC(), SHA256()), which costs
// more than hashing a short message. Each thread keeps one context per algorithm instead, fetched
// once and set up again for each use.
struct HmacContext {
  HmacContext() {
    EVP_MAC* mac = EVP_MAC_fetch(nullptr, OSSL_MAC_NAME_HMAC, nullptr);
    ctx = mac == nullptr ? nullptr : EVP_MAC_CTX_new(mac);
    EVP_MAC_free(mac);  // the context keeps its own reference
    char digest[] = OSSL_DIGEST_NAME_SHA2_256;
    const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                                 OSSL_PARAM_END};
    if (ctx == nullptr || EVP_MAC_CTX_set_params(ctx, params) != 1) {
      Log().critical("OpenSSL has no HMAC-SHA256");
      std::abort();
    }
  }
  ~HmacContext() { EVP_MAC_CTX_free(ctx); }
  EVP_MAC_CTX* ctx;
};

struct Sha256Context {
  Sha256Context() : md(EVP_MD_fetch(nullptr, OSSL_DIGEST_NAME_SHA2_256, nullptr)) {
    ctx = EVP_MD_CTX_new();
    if (md == nullptr || ctx == nullptr) {
      Log().critical("OpenSSL has no SHA-256");
      std::abort();
    }
  }
  ~Sha256Context() {
    EVP_MD_CTX_free(ctx);
    EVP_MD_free(md);
  }
  EVP_MD* md;
  EVP_MD_CTX* ctx;
};

}  // namespace

std::array<uint8_t, 32> HmacSha256(std::string_view key, const void* data, size_t len) {
  thread_local HmacContext hmac;
  std::array<uint8_t, 32> out{};
  size_t out_len = 0;
  if (EVP_MAC_init(hmac.ctx, reinterpret_cast<const unsigned char*>(key.data()), key.size(),
                   nullptr) != 1 ||
      EVP_MAC_update(hmac.ctx, static_cast<const unsigned char*>(data), len) != 1 ||
      EVP_MAC_final(hmac.ctx, out.data(), &out_len, out.size()) != 1 || out_len != out.size()) {
    Log().critical("HMAC-SHA256 failed");
    std::abort();
  }
  return out;
}

std::array<uint8_t, 32> Sha256(std::span<const std::string_view> pieces) {
  thread_local Sha256Context sha;
  std::array<uint8_t, 32> out{};
  bool ok = EVP_DigestInit_ex2(sha.ctx, sha.md, nullptr) == 1;
  for (std::string_view piece : pieces) {
    ok = ok && EVP_DigestUpdate(sha.ctx, piece.data(), piece.size()) == 1;
  }
  unsigned int out_len = 0;
  if (!ok || EVP_DigestFinal_ex(sha.ctx, out.data(), &out_len) != 1 || out_len != out.size()) {
    Log().critical("SHA-256 failed");
    std::abort();
  }
  return out;
}

MacInput& MacInput::Add(const void* data, size_t len) {
  uint64_t prefix = len;
  bytes_.append(reinterpret_cast<const char*>(&prefix), sizeof(prefix));
  bytes_.append(static_cast<const char*>(data), len);
  return *this;
}

MacInput& MacInput::Add(std::string_view field) { return Add(field.data(), field.size()); }

MacInput& MacInput::Add(uint64_t value) { return Add(&value, sizeof(value)); }

std::array<uint8_t, 32> MacInput::Sign(std::string_view key) const {
  return HmacSha256(key, bytes_.data(), bytes_.size());
}

bool DigestEqual(const uint8_t* a, const uint8_t* b) { return CRYPTO_memcmp(a, b, 32) == 0; }

void RandomBytes(uint8_t* out, size_t len) {
  while (len > 0) {
    ssize_t n = getrandom(out, len, 0);
    if (n <= 0) continue;
    out += n;
    len -= static_cast<size_t>(n);
  }
}

}  // namespace larder
