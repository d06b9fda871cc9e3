// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/wire/stream.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace larder::transfer::wire {
namespace {

// TLS writes of small buffers (a frame header) are gathered up to one record's plaintext, so a
// header and the start of its payload leave in one record instead of two.
constexpr size_t kStagingBytes = 16384;

// What the OpenSSL error queue says (and the queue emptied); `fallback` when it is empty.
std::string TakeOpenSslErrors(std::string_view fallback = "unknown OpenSSL error") {
  std::string out;
  char buffer[256];
  for (unsigned long e = ERR_get_error(); e != 0; e = ERR_get_error()) {
    ERR_error_string_n(e, buffer, sizeof(buffer));
    if (!out.empty()) out += "; ";
    out += buffer;
  }
  return out.empty() ? std::string(fallback) : out;
}

struct SslCtxFree {
  void operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }
};

Result<std::unique_ptr<SSL_CTX, SslCtxFree>> NewContext(const SSL_METHOD* method) {
  std::unique_ptr<SSL_CTX, SslCtxFree> ctx(SSL_CTX_new(method));
  if (!ctx) return InternalError("SSL_CTX_new: " + TakeOpenSslErrors());
  // Every engine runs this code with OpenSSL 3, so there is no older peer to fall back for; TLS
  // 1.3 also gives the exporter (ChannelBinding) its full strength.
  if (SSL_CTX_set_min_proto_version(ctx.get(), TLS1_3_VERSION) != 1) {
    return InternalError("SSL_CTX_set_min_proto_version: " + TakeOpenSslErrors());
  }
  // Frames carry their own lengths, so a peer that closes without close_notify is only a closed
  // connection (a truncated frame still fails its RecvAll).
  SSL_CTX_set_options(ctx.get(), SSL_OP_IGNORE_UNEXPECTED_EOF);
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_OFF);
  return ctx;
}

// OpenSSL's socket BIO writes with write(2), which raises SIGPIPE on a closed peer, and needs the
// socket non-blocking. This BIO uses send/recv with MSG_NOSIGNAL | MSG_DONTWAIT instead, so the
// socket stays as common/net.h expects it. The BIO's data is the fd.
int BioFd(BIO* bio) { return static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(bio))); }

int BioWrite(BIO* bio, const char* data, int len) {
  BIO_clear_retry_flags(bio);
  for (;;) {
    ssize_t n = send(BioFd(bio), data, static_cast<size_t>(len), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return static_cast<int>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_write(bio);
    return -1;
  }
}

int BioRead(BIO* bio, char* data, int len) {
  BIO_clear_retry_flags(bio);
  for (;;) {
    ssize_t n = recv(BioFd(bio), data, static_cast<size_t>(len), MSG_DONTWAIT);
    if (n >= 0) return static_cast<int>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_read(bio);
    return -1;
  }
}

long BioCtrl(BIO* bio, int cmd, long num, void* ptr) {
  (void)bio;
  (void)num;
  (void)ptr;
  return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

int BioCreate(BIO* bio) {
  BIO_set_init(bio, 1);
  return 1;
}

const BIO_METHOD* SocketBioMethod() {
  static const BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "larder-socket");
    if (m == nullptr) return static_cast<BIO_METHOD*>(nullptr);
    BIO_meth_set_write(m, BioWrite);
    BIO_meth_set_read(m, BioRead);
    BIO_meth_set_ctrl(m, BioCtrl);
    BIO_meth_set_create(m, BioCreate);
    return m;
  }();
  return method;
}

int MillisUntil(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return 0;
  return left.count() > 60'000 ? 60'000 : static_cast<int>(left.count()) + 1;
}

Status WaitForSocket(int fd, short events, Deadline deadline, const std::string& peer) {
  for (;;) {
    int timeout = MillisUntil(deadline);
    if (timeout == 0 && Clock::now() >= deadline) {
      return DeadlineExceededError("timed out waiting for " + peer);
    }
    pollfd p{fd, events, 0};
    int rc = poll(&p, 1, timeout);
    if (rc > 0) return Status();
    if (rc < 0 && errno != EINTR) return ErrnoToStatus(errno, "poll " + peer);
  }
}

// Empties what the last OpenSSL call reads its outcome from: the thread's error queue (which
// SSL_get_error requires) and errno (an end-of-stream leaves it untouched).
void ClearErrors() {
  ERR_clear_error();
  errno = 0;
}

}  // namespace

Result<std::shared_ptr<const TlsContext>> TlsContext::ForServer(const std::string& cert_file,
                                                                const std::string& key_file) {
  if (cert_file.empty() || key_file.empty()) {
    return InvalidArgumentError(
        "TLS needs both a certificate (tls_cert_file / LARDER_TLS_CERT) and its key "
        "(tls_key_file / LARDER_TLS_KEY); only the " +
        std::string(cert_file.empty() ? "key" : "certificate") + " is set");
  }
  ERR_clear_error();
  LARDER_ASSIGN_OR_RETURN(auto ctx, NewContext(TLS_server_method()));
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), cert_file.c_str()) != 1) {
    return InvalidArgumentError("cannot load TLS certificate file '" + cert_file +
                                "': " + TakeOpenSslErrors());
  }
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    bool mismatch = ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH;
    return InvalidArgumentError(
        (mismatch ? "TLS key file '" + key_file + "' does not match certificate '" + cert_file
                  : "cannot load TLS key file '" + key_file) +
        "': " + TakeOpenSslErrors());
  }
  if (SSL_CTX_check_private_key(ctx.get()) != 1) {
    return InvalidArgumentError("TLS key file '" + key_file + "' does not match certificate '" +
                                cert_file + "': " + TakeOpenSslErrors());
  }
  // No session tickets: connections are long-lived and never resumed.
  SSL_CTX_set_num_tickets(ctx.get(), 0);
  return std::shared_ptr<const TlsContext>(new TlsContext(ctx.release(), /*is_server=*/true));
}

Result<std::shared_ptr<const TlsContext>> TlsContext::ForClient(const std::string& ca_file) {
  ERR_clear_error();
  LARDER_ASSIGN_OR_RETURN(auto ctx, NewContext(TLS_client_method()));
  if (SSL_CTX_load_verify_locations(ctx.get(), ca_file.c_str(), nullptr) != 1) {
    return InvalidArgumentError("cannot load TLS CA file '" + ca_file +
                                "': " + TakeOpenSslErrors());
  }
  // The chain is verified; host names and IPs are not (see the header).
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  return std::shared_ptr<const TlsContext>(new TlsContext(ctx.release(), /*is_server=*/false));
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

TcpStream::TcpStream(Fd fd, std::string peer) : fd_(std::move(fd)), peer_(std::move(peer)) {}

TcpStream::~TcpStream() { Reset(); }

TcpStream::TcpStream(TcpStream&& other) noexcept
    : fd_(std::move(other.fd_)), peer_(std::move(other.peer_)), ssl_(other.ssl_) {
  other.ssl_ = nullptr;
}

TcpStream& TcpStream::operator=(TcpStream&& other) noexcept {
  if (this != &other) {
    Reset();
    fd_ = std::move(other.fd_);
    peer_ = std::move(other.peer_);
    ssl_ = other.ssl_;
    other.ssl_ = nullptr;
  }
  return *this;
}

void TcpStream::Reset() {
  // No close_notify: the peer treats end-of-stream as a close (SSL_OP_IGNORE_UNEXPECTED_EOF), and
  // a shutdown could block on a stalled peer.
  if (ssl_ != nullptr) SSL_free(ssl_);
  ssl_ = nullptr;
  fd_.Reset();
}

Status TcpStream::StartTls(const TlsContext& context, Deadline deadline) {
  if (ssl_ != nullptr) return FailedPreconditionError("TLS already started with " + peer_);
  ERR_clear_error();
  const BIO_METHOD* method = SocketBioMethod();
  SSL* ssl = SSL_new(context.get());
  BIO* bio = method != nullptr ? BIO_new(method) : nullptr;
  if (ssl == nullptr || bio == nullptr) {
    SSL_free(ssl);
    BIO_free(bio);
    return InternalError("setting up TLS with " + peer_ + ": " + TakeOpenSslErrors());
  }
  BIO_set_data(bio, reinterpret_cast<void*>(static_cast<intptr_t>(fd_.get())));
  SSL_set_bio(ssl, bio, bio);  // the SSL owns the BIO from here
  ssl_ = ssl;
  if (context.is_server()) {
    SSL_set_accept_state(ssl_);
  } else {
    SSL_set_connect_state(ssl_);
  }
  for (;;) {
    ClearErrors();
    int rc = SSL_do_handshake(ssl_);
    if (rc == 1) return Status();
    LARDER_RETURN_IF_ERROR(WaitForTls(rc, deadline, "TLS handshake"));
  }
}

Result<std::array<uint8_t, 32>> TcpStream::ChannelBinding() const {
  static constexpr char kLabel[] = "EXPORTER-larder-tcp-v1";
  std::array<uint8_t, 32> out{};
  if (ssl_ == nullptr) return FailedPreconditionError("no TLS session with " + peer_);
  ERR_clear_error();
  if (SSL_export_keying_material(ssl_, out.data(), out.size(), kLabel, sizeof(kLabel) - 1, nullptr,
                                 0, 0) != 1) {
    return InternalError("TLS exporter with " + peer_ + ": " + TakeOpenSslErrors());
  }
  return out;
}

Status TcpStream::WaitForTls(int result, Deadline deadline, const char* what) {
  int saved_errno = errno;
  int error = SSL_get_error(ssl_, result);
  switch (error) {
    case SSL_ERROR_WANT_READ:
      AckPromptly();
      return WaitForSocket(fd_.get(), POLLIN, deadline, peer_);
    case SSL_ERROR_WANT_WRITE:
      return WaitForSocket(fd_.get(), POLLOUT, deadline, peer_);
    case SSL_ERROR_ZERO_RETURN:
      return UnavailableError("peer " + peer_ + " closed the connection");
    case SSL_ERROR_SYSCALL:
      ERR_clear_error();
      if (saved_errno == 0) return UnavailableError("peer " + peer_ + " closed the connection");
      return ErrnoToStatus(saved_errno, std::string(what) + " with " + peer_);
    default:
      break;
  }
  if (long verify = SSL_get_verify_result(ssl_); verify != X509_V_OK && !SSL_is_server(ssl_)) {
    ERR_clear_error();
    return PermissionDeniedError("TLS certificate of peer " + peer_ +
                                 " does not verify: " + X509_verify_cert_error_string(verify) +
                                 " (is LARDER_TLS_CA the CA that signed the peer's certificate?)");
  }
  if (ERR_GET_REASON(ERR_peek_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
    ERR_clear_error();
    return UnavailableError("peer " + peer_ + " closed the connection during the " + what);
  }
  return UnavailableError(std::string(what) + " with peer " + peer_ +
                          " failed: " + TakeOpenSslErrors());
}

Status TcpStream::SendTls(const void* data, size_t len, Deadline deadline) {
  auto* p = static_cast<const uint8_t*>(data);
  while (len > 0) {
    ClearErrors();
    size_t written = 0;
    int rc = SSL_write_ex(ssl_, p, len, &written);
    if (rc == 1) {
      p += written;
      len -= written;
      continue;
    }
    LARDER_RETURN_IF_ERROR(WaitForTls(rc, deadline, "TLS send"));
  }
  return Status();
}

Status TcpStream::SendAll(const void* data, size_t len, Deadline deadline) {
  if (ssl_ == nullptr) return larder::SendAll(fd_.get(), data, len, deadline, peer_);
  return SendTls(data, len, deadline);
}

Status TcpStream::SendAllV(iovec* iov, int iovcnt, Deadline deadline) {
  if (ssl_ == nullptr) return larder::SendAllV(fd_.get(), iov, iovcnt, deadline, peer_);
  uint8_t staging[kStagingBytes];
  size_t staged = 0;
  for (int i = 0; i < iovcnt; ++i) {
    auto* p = static_cast<const uint8_t*>(iov[i].iov_base);
    size_t left = iov[i].iov_len;
    while (left > 0) {
      if (staged == 0 && left >= kStagingBytes) {
        LARDER_RETURN_IF_ERROR(SendTls(p, left, deadline));
        break;
      }
      size_t take = std::min(left, kStagingBytes - staged);
      std::memcpy(staging + staged, p, take);
      staged += take;
      p += take;
      left -= take;
      if (staged == kStagingBytes) {
        LARDER_RETURN_IF_ERROR(SendTls(staging, staged, deadline));
        staged = 0;
      }
    }
  }
  if (staged > 0) return SendTls(staging, staged, deadline);
  return Status();
}

void TcpStream::AckPromptly() {
  int one = 1;
  setsockopt(fd_.get(), IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));
}

Status TcpStream::RecvAll(void* data, size_t len, Deadline deadline) {
  AckPromptly();
  auto* p = static_cast<uint8_t*>(data);
  if (ssl_ == nullptr) {
    while (len > 0) {
      ssize_t n = recv(fd_.get(), p, len, MSG_DONTWAIT);
      if (n > 0) {
        p += n;
        len -= static_cast<size_t>(n);
        continue;
      }
      if (n == 0) return UnavailableError("peer " + peer_ + " closed the connection");
      if (errno == EINTR) continue;
      if (errno != EAGAIN) return ErrnoToStatus(errno, "recv from " + peer_);
      AckPromptly();
      LARDER_RETURN_IF_ERROR(WaitForSocket(fd_.get(), POLLIN, deadline, peer_));
    }
    return Status();
  }
  while (len > 0) {
    ClearErrors();
    size_t got = 0;
    int rc = SSL_read_ex(ssl_, p, len, &got);
    if (rc == 1) {
      p += got;
      len -= got;
      continue;
    }
    LARDER_RETURN_IF_ERROR(WaitForTls(rc, deadline, "TLS receive"));
  }
  return Status();
}

bool TcpStream::HasBufferedInput() const { return ssl_ != nullptr && SSL_has_pending(ssl_) == 1; }

Result<std::string> SocketEndpoint(int fd, bool local) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  int rc = local ? getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len)
                 : getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  if (rc != 0) return ErrnoToStatus(errno, local ? "getsockname" : "getpeername");
  if (addr.sin_family != AF_INET) return InternalError("socket is not IPv4");
  char ip[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &addr.sin_addr, ip, sizeof(ip));
  return std::string(ip) + ":" + std::to_string(ntohs(addr.sin_port));
}

}  // namespace larder::transfer::wire
