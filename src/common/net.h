// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Socket helpers: address parsing, TCP and abstract Unix sockets, deadline-bounded full reads and
// writes, and fd passing (SCM_RIGHTS). Every OS error becomes a Status naming the peer or fd.
#pragma once

#include <sys/uio.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "larder/status.h"

namespace larder {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// Clock::now() to within one scheduler tick (a few ms), several times cheaper: for computing
// deadlines on hot paths. Never later than the precise time.
Deadline CoarseNow();

// An owned file descriptor, closed on destruction. Move-only.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(Fd&& other) noexcept : fd_(other.Release()) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = other.Release();
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Reset();

 private:
  int fd_ = -1;
};

struct HostPort {
  std::string host;
  uint16_t port = 0;
  std::string ToString() const { return host + ":" + std::to_string(port); }
};

// Parses "ip:port" (IPv4 dotted quad or "localhost"). InvalidArgument otherwise. Never looks a
// name up: peers' addresses are parsed with it.
Result<HostPort> ParseHostPort(std::string_view address);

// As ParseHostPort, and a host name is resolved to its first IPv4 address: for addresses this
// process's own user gave (its listen address, a peer named on the command line). Warns once
// when a name resolves to a loopback address (Debian maps the host's own name to 127.0.1.1),
// which other hosts cannot reach.
Result<HostPort> ResolveHostPort(std::string_view address);

// Binds and listens; port 0 picks a free port. Returns the socket.
Result<Fd> TcpListen(const HostPort& address, int backlog = 128);
// The port a bound socket listens on.
Result<uint16_t> BoundPort(int fd);
// Connects before `deadline`. Unavailable when refused or unreachable, DeadlineExceeded on timeout.
// The socket gets TCP_NODELAY; buffer sizes stay autotuned.
Result<Fd> TcpConnect(const HostPort& address, Deadline deadline);
// Applies TCP_NODELAY to an accepted socket.
void TuneTcpSocket(int fd);

// Listens on the abstract Unix socket `name` (no leading NUL; the namespace is per network
// namespace, so peers in other network namespaces cannot reach it).
Result<Fd> UnixListenAbstract(const std::string& name);
Result<Fd> UnixConnectAbstract(const std::string& name, Deadline deadline);

// Writes/reads exactly `len` bytes before `deadline`. A closed peer gives Unavailable naming
// `peer`.
Status SendAll(int fd, const void* data, size_t len, Deadline deadline, std::string_view peer);
// Writes the buffers in order before `deadline`, modifying `iov`. When `pass_fd` >= 0 (a Unix
// socket) it rides (SCM_RIGHTS) on the first bytes that go out.
Status SendAllV(int fd, struct iovec* iov, int iovcnt, Deadline deadline, std::string_view peer,
                int pass_fd = -1);
Status RecvAll(int fd, void* data, size_t len, Deadline deadline, std::string_view peer);

// Sends `len` bytes (one message on a Unix socket) carrying `pass_fd` when >= 0.
Status SendWithFd(int fd, const void* data, size_t len, int pass_fd);
// Receives exactly `len` bytes; any fd passed with them is returned in `received` (else invalid).
Status RecvWithFd(int fd, void* data, size_t len, Fd* received, Deadline deadline,
                  std::string_view peer);

// HMAC-SHA256 of `data` under `key`.
std::array<uint8_t, 32> HmacSha256(std::string_view key, const void* data, size_t len);
// SHA-256 of the pieces, one after the other.
std::array<uint8_t, 32> Sha256(std::span<const std::string_view> pieces);
// Builds the input of an authentication MAC from typed fields. Every field is length-prefixed, so
// two different field lists never produce the same bytes (no "ab"+"c" == "a"+"bc" confusion).
// Each proof starts with a label naming what it proves (e.g. "larder-tcp-client-v1"), so a MAC
// made for one purpose is never accepted for another.
class MacInput {
 public:
  explicit MacInput(std::string_view label) { Add(label); }
  MacInput& Add(std::string_view field);
  MacInput& Add(const void* data, size_t len);
  MacInput& Add(uint64_t value);
  // HMAC-SHA256 of the fields under `key`.
  std::array<uint8_t, 32> Sign(std::string_view key) const;
  // The fields as bytes, for a signature of another kind (an engine key's).
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

// Constant-time equality of two 32-byte digests.
bool DigestEqual(const uint8_t* a, const uint8_t* b);
// Fills `out` with cryptographically random bytes.
void RandomBytes(uint8_t* out, size_t len);

}  // namespace larder
