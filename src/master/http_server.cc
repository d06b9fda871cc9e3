// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <string_view>

namespace larder::master {
namespace {

using Clock = std::chrono::steady_clock;

int MillisecondsLeft(Clock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 60'000));
}

// Waits until `fd` has `events` or the deadline passes; false on the deadline, an error or a
// hang-up without the events.
bool Await(int fd, short events, Clock::time_point deadline) {
  while (true) {
    int left = MillisecondsLeft(deadline);
    if (left == 0) return false;
    pollfd p{fd, events, 0};
    int ready = poll(&p, 1, left);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return false;
    return (p.revents & events) != 0;
  }
}

std::string AddressOf(const sockaddr_storage& address, int* port) {
  char text[INET6_ADDRSTRLEN] = {};
  *port = 0;
  if (address.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(address);
    inet_ntop(AF_INET, &v4.sin_addr, text, sizeof(text));
    *port = ntohs(v4.sin_port);
  } else if (address.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(address);
    inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof(text));
    *port = ntohs(v6.sin6_port);
  }
  return text;
}

std::string PeerAddress(int fd, int* port) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    *port = 0;
    return {};
  }
  return AddressOf(address, port);
}

bool EqualsIgnoringCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// How much of a request has arrived.
struct Scan {
  enum Kind { kPartial, kWhole, kHeaderTooLong, kBodyTooLong } kind = kPartial;
  size_t length = 0;  // kWhole: the request's bytes
};

// What the header says of the body: its Content-Length, or that it comes in chunks.
struct BodyFraming {
  uint64_t content_length = 0;
  bool chunked = false;
};

BodyFraming ParseFraming(std::string_view header) {
  BodyFraming framing;
  size_t line_start = header.find("\r\n");  // past the request line
  while (line_start != std::string_view::npos) {
    line_start += 2;
    size_t line_end = header.find("\r\n", line_start);
    std::string_view line =
        header.substr(line_start, line_end == std::string_view::npos ? std::string_view::npos
                                                                     : line_end - line_start);
    size_t colon = line.find(':');
    if (colon != std::string_view::npos) {
      std::string_view name = Trim(line.substr(0, colon));
      std::string_view value = Trim(line.substr(colon + 1));
      if (EqualsIgnoringCase(name, "content-length")) {
        auto [ptr, ec] =
            std::from_chars(value.data(), value.data() + value.size(), framing.content_length);
        // A malformed length is httplib's to refuse (400); it reads no body then.
        if (ec != std::errc() || ptr != value.data() + value.size()) framing.content_length = 0;
      } else if (EqualsIgnoringCase(name, "transfer-encoding")) {
        framing.chunked = value.find("chunked") != std::string_view::npos;
      }
    }
    line_start = line_end;
  }
  return framing;
}

// Follows one request as its bytes arrive. Each call resumes where the last one stopped (the
// header's end is searched in the new bytes only, the header parsed once), so a client that
// sends a byte at a time makes the server do no more than one that sends the request at once.
class RequestScanner {
 public:
  explicit RequestScanner(const HttpServerLimits& limits) : limits_(limits) {}

  // `bytes`: everything received so far (the bytes of the previous call, and more).
  Scan Next(std::string_view bytes) {
    if (header_end_ == 0) {
      const size_t end = bytes.find("\r\n\r\n", searched_);
      if (end == std::string_view::npos) {
        searched_ = bytes.size() < 3 ? 0 : bytes.size() - 3;  // the end may start in the last 3
        return {bytes.size() > limits_.max_header_bytes ? Scan::kHeaderTooLong : Scan::kPartial};
      }
      header_end_ = end + 4;
      if (header_end_ > limits_.max_header_bytes) return {Scan::kHeaderTooLong};
      framing_ = ParseFraming(bytes.substr(0, end));
      searched_ = header_end_;
    }
    if (framing_.chunked) {
      // The last chunk: "0" CRLF and the empty line (trailers are not used by any route), at
      // the body's start or after a line's end.
      size_t last = bytes.find("0\r\n\r\n", searched_);
      while (last != std::string_view::npos && last != header_end_ && bytes[last - 1] != '\n') {
        last = bytes.find("0\r\n\r\n", last + 1);
      }
      if (last != std::string_view::npos) return {Scan::kWhole, last + 5};
      searched_ = std::max(header_end_, bytes.size() < 4 ? 0 : bytes.size() - 4);
      return {bytes.size() > limits_.max_request_bytes ? Scan::kBodyTooLong : Scan::kPartial};
    }
    if (framing_.content_length >
        limits_.max_request_bytes - std::min(header_end_, limits_.max_request_bytes)) {
      return {Scan::kBodyTooLong};
    }
    const size_t length = header_end_ + framing_.content_length;
    if (bytes.size() >= length) return {Scan::kWhole, length};
    return {Scan::kPartial};
  }

 private:
  const HttpServerLimits& limits_;
  size_t searched_ = 0;    // no search needs to look before this
  size_t header_end_ = 0;  // 0 until the header is whole
  BodyFraming framing_;
};

// One request, already read, as the Stream httplib parses; the answer goes to the socket, all of
// it by the deadline.
class RequestStream final : public httplib::Stream {
 public:
  RequestStream(int fd, std::string request, Clock::time_point write_deadline)
      : fd_(fd), request_(std::move(request)), write_deadline_(write_deadline) {}

  bool is_readable() const override { return position_ < request_.size(); }
  bool is_writable() const override { return Await(fd_, POLLOUT, write_deadline_); }

  ssize_t read(char* ptr, size_t size) override {
    size_t n = std::min(size, request_.size() - position_);
    std::memcpy(ptr, request_.data() + position_, n);
    position_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    while (true) {
      if (!Await(fd_, POLLOUT, write_deadline_)) return -1;
      ssize_t n = send(fd_, ptr, size, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      return n;
    }
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = PeerAddress(fd_, &port);
  }

  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage address{};
    socklen_t length = sizeof(address);
    if (getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      ip.clear();
      port = 0;
      return;
    }
    ip = AddressOf(address, &port);
  }

  socket_t socket() const override { return fd_; }

 private:
  const int fd_;
  const std::string request_;
  size_t position_ = 0;
  const Clock::time_point write_deadline_;
};

void Answer(int fd, std::string_view status_line) {
  std::string response = "HTTP/1.1 ";
  response += status_line;
  response += "\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
  // Best effort: the connection closes next either way.
  [[maybe_unused]] ssize_t n =
      send(fd, response.data(), response.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

}  // namespace

GuardedHttpServer::GuardedHttpServer(HttpServerLimits limits) : limits_(limits) {
  const size_t threads = std::max<size_t>(limits_.threads, 1);
  new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  set_keep_alive_max_count(1);
  set_payload_max_length(limits_.max_request_bytes);
  // cpp-httplib's default sets SO_REUSEPORT, which lets a second master bind the same port and
  // take half of the requests. SO_REUSEADDR alone still lets a restarted master bind at once.
  set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
}

bool GuardedHttpServer::Bind(const std::string& host, int port) {
  if (!bind_to_port(host, port)) return false;
  return ::listen(svr_sock_.load(), kBacklog) == 0;
}

int GuardedHttpServer::BindToAnyPort(const std::string& host) {
  const int port = bind_to_any_port(host);
  if (port <= 0) return port;
  return ::listen(svr_sock_.load(), kBacklog) == 0 ? port : -1;
}

bool GuardedHttpServer::Admit(const std::string& peer, int fd, Connections::iterator* out) {
  MutexLock lock(mu_);
  Connections& connections = peers_[peer];
  size_t held = 0;
  Connections::iterator oldest_waiting = connections.end();
  for (auto it = connections.begin(); it != connections.end(); ++it) {
    if (it->evicted) continue;
    ++held;
    if (it->waiting && oldest_waiting == connections.end()) oldest_waiting = it;
  }
  if (held >= std::max<size_t>(limits_.connections_per_peer, 1)) {
    if (oldest_waiting == connections.end()) {
      if (connections.empty()) peers_.erase(peer);
      return false;
    }
    // Its thread sees the hang-up at once, and closes the fd only after Forget (under mu_), so
    // the fd is still that connection's here.
    oldest_waiting->evicted = true;
    shutdown(oldest_waiting->fd, SHUT_RDWR);
  }
  connections.push_back(Connection{fd});
  *out = std::prev(connections.end());
  return true;
}

size_t GuardedHttpServer::waiting() const {
  MutexLock lock(mu_);
  size_t n = 0;
  for (const auto& [peer, connections] : peers_) {
    for (const Connection& connection : connections) {
      n += connection.waiting && !connection.evicted ? 1 : 0;
    }
  }
  return n;
}

bool GuardedHttpServer::Pass(Connections::iterator connection) {
  MutexLock lock(mu_);
  connection->waiting = false;
  return !connection->evicted;
}

void GuardedHttpServer::Forget(const std::string& peer, Connections::iterator connection) {
  MutexLock lock(mu_);
  auto it = peers_.find(peer);
  it->second.erase(connection);
  if (it->second.empty()) peers_.erase(it);
}

bool GuardedHttpServer::ReadRequest(int fd, std::string* request) const {
  const Clock::time_point deadline = Clock::now() + limits_.request_deadline;
  std::string bytes;
  RequestScanner scanner(limits_);
  char chunk[4096];
  while (true) {
    // In steps, so that a stopping server (stop() closes the listening socket) does not wait
    // out every stalled client's deadline.
    if (svr_sock_.load() == INVALID_SOCKET) return false;
    const Clock::time_point step =
        std::min(deadline, Clock::now() + std::chrono::milliseconds(100));
    pollfd p{fd, POLLIN, 0};
    int ready = poll(&p, 1, MillisecondsLeft(step));
    if (ready < 0 && errno != EINTR) return false;
    if (ready <= 0) {
      if (Clock::now() >= deadline) return false;
      continue;
    }
    // Readable, hung up or failed: recv says which.
    ssize_t n = recv(fd, chunk, sizeof(chunk), MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) return false;  // closed (or evicted) before the request was whole
    bytes.append(chunk, static_cast<size_t>(n));
    Scan scan = scanner.Next(bytes);
    switch (scan.kind) {
      case Scan::kPartial:
        continue;
      case Scan::kWhole:
        bytes.resize(scan.length);  // one request per connection: what follows is not read
        *request = std::move(bytes);
        return true;
      case Scan::kHeaderTooLong:
        Answer(fd, "431 Request Header Fields Too Large");
        return false;
      case Scan::kBodyTooLong:
        Answer(fd, "413 Payload Too Large");
        return false;
    }
  }
}

bool GuardedHttpServer::process_and_close_socket(socket_t sock) {
  int port = 0;
  const std::string peer = PeerAddress(sock, &port);
  Connections::iterator connection;
  bool served = false;
  bool admitted = Admit(peer, sock, &connection);
  if (admitted) {
    std::string request;
    const bool whole = ReadRequest(sock, &request);
    admitted = Pass(connection) && whole;
    if (admitted) {
      RequestStream stream(sock, std::move(request), Clock::now() + limits_.response_deadline);
      bool closed = false;
      served = process_request(stream, /*close_connection=*/true, closed, nullptr);
    }
    Forget(peer, connection);
  }
  if (!admitted) refused_.fetch_add(1, std::memory_order_relaxed);
  shutdown(sock, SHUT_RDWR);
  close(sock);
  return served;
}

}  // namespace larder::master
