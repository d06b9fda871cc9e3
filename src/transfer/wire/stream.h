// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The byte stream under the tcp data protocol: a connected socket, optionally wrapped in TLS
// (OpenSSL). Client and server read and write frames only through a TcpStream, so the protocol
// code is the same with and without TLS. Without TLS every call goes straight to the socket helpers
// of common/net.h (no copy, no OpenSSL call). With TLS, OpenSSL reads and writes the socket through
// MSG_DONTWAIT | MSG_NOSIGNAL calls and the stream polls when OpenSSL wants to read or write, so no
// call blocks past its Deadline and a closed peer never raises SIGPIPE.
#pragma once

#include <sys/uio.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "common/net.h"
#include "larder/status.h"

// OpenSSL's types, so that this header does not pull in <openssl/ssl.h>.
typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace larder::transfer::wire {

// An OpenSSL context for one side of the tcp data plane: the data server's (certificate and key)
// or the client's (the CA that servers' certificates must chain to). TLS 1.3 only. Immutable after
// creation, so one context is shared by every connection of an engine. Thread-safe.
class TlsContext {
 public:
  // The server's context: presents `cert_file` (PEM, the leaf first, then any intermediates) with
  // the private key `key_file` (PEM). Clients are not asked for certificates: they prove the
  // cluster token instead. InvalidArgument naming the file when either does not load, or when the
  // key does not belong to the certificate.
  static Result<std::shared_ptr<const TlsContext>> ForServer(const std::string& cert_file,
                                                             const std::string& key_file);
  // The client's context: verifies the server's certificate chain against the CA certificates in
  // `ca_file` (PEM). There is deliberately no host name or IP check: peers are addressed by IP
  // taken from descriptors, and the cluster token (bound to the TLS channel) authenticates the
  // engine behind the certificate. InvalidArgument naming the file when it does not load.
  static Result<std::shared_ptr<const TlsContext>> ForClient(const std::string& ca_file);

  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  SSL_CTX* get() const { return ctx_; }
  bool is_server() const { return is_server_; }

 private:
  TlsContext(SSL_CTX* ctx, bool is_server) : ctx_(ctx), is_server_(is_server) {}

  SSL_CTX* const ctx_;
  const bool is_server_;
};

// One connection. Move-only; not thread-safe (one thread uses a stream at a time), except that
// fd() may be read and shut down from another thread to unblock the owner.
class TcpStream {
 public:
  TcpStream() = default;
  // Takes `fd`, a connected TCP socket; `peer` names the other end in error messages.
  TcpStream(Fd fd, std::string peer);
  ~TcpStream();
  TcpStream(TcpStream&& other) noexcept;
  TcpStream& operator=(TcpStream&& other) noexcept;
  TcpStream(const TcpStream&) = delete;
  TcpStream& operator=(const TcpStream&) = delete;

  bool valid() const { return fd_.valid(); }
  int fd() const { return fd_.get(); }
  const std::string& peer() const { return peer_; }
  bool tls() const { return ssl_ != nullptr; }
  // Closes the connection (and frees the TLS state).
  void Reset();

  // Runs the TLS handshake on the socket; every later byte goes through TLS. `context` says which
  // side this is; a client verifies the server's certificate chain. PermissionDenied when the
  // certificate does not verify (naming the reason), Unavailable when the peer closes or the
  // handshake fails otherwise, DeadlineExceeded. REQUIRES: no TLS yet; no bytes of the peer are
  // buffered unread.
  Status StartTls(const TlsContext& context, Deadline deadline);
  // 32 bytes that only the two ends of this TLS session know (RFC 5705 exporter, label
  // "EXPORTER-larder-tcp-v1"): mixed into the auth MACs so a proof cannot be relayed into another
  // TLS session. REQUIRES: tls().
  Result<std::array<uint8_t, 32>> ChannelBinding() const;

  // Writes/reads exactly the given bytes before `deadline`. A closed peer gives Unavailable naming
  // the peer, an expired deadline DeadlineExceeded. After a failure the stream is unusable.
  Status SendAll(const void* data, size_t len, Deadline deadline);
  // Writes the buffers in order. Modifies `iov` (as common/net.h SendAllV does).
  Status SendAllV(iovec* iov, int iovcnt, Deadline deadline);
  Status RecvAll(void* data, size_t len, Deadline deadline);
  // Whether TLS holds received bytes that a poll of fd() would not report.
  bool HasBufferedInput() const;

 private:
  // Waits until OpenSSL's last `result` can make progress; the Status of a failed call otherwise.
  Status WaitForTls(int result, Deadline deadline, const char* what);
  Status SendTls(const void* data, size_t len, Deadline deadline);
  // Delayed ACKs held back the ACKs of multi-segment replies and payloads for up to the 40 ms
  // delayed-ACK timer while the sender, out of congestion window, waited for them: 40-80 ms in
  // the p99 of 64 KiB batches over an MTU 1500 link (docs/transfer-engine.md, "Tail latency").
  // A reader therefore turns them off (TCP_QUICKACK) before it reads and before it waits; the
  // kernel turns them back on when a send follows a receive closely, which every request and
  // reply does.
  void AckPromptly();

  Fd fd_;
  std::string peer_;
  SSL* ssl_ = nullptr;
};

// The "ip:port" of the local end (`local` true, getsockname) or the remote end (getpeername) of a
// connected IPv4 socket.
Result<std::string> SocketEndpoint(int fd, bool local);

}  // namespace larder::transfer::wire
