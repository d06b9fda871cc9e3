// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "standalone/daemon.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include "common/logging.h"
#include "standalone/attach_connection.h"

namespace larder::standalone {
namespace {

// How long a Goodbye may take: it is a courtesy, never a reason to wait on a stalled client.
constexpr std::chrono::milliseconds kGoodbyeTimeout{200};

// std::timed_mutex with the annotations of common/mutex.h (which has no timed mutex): a Goodbye
// waits for a connection's writer at most kGoodbyeTimeout.
class LARDER_CAPABILITY("mutex") TimedMutex {
 public:
  TimedMutex() = default;
  TimedMutex(const TimedMutex&) = delete;
  TimedMutex& operator=(const TimedMutex&) = delete;

  void Lock() LARDER_ACQUIRE() { mu_.lock(); }
  void Unlock() LARDER_RELEASE() { mu_.unlock(); }
  // True when it took the lock within `timeout`.
  bool TryLockFor(std::chrono::milliseconds timeout) LARDER_TRY_ACQUIRE(true) {
    return mu_.try_lock_for(timeout);
  }

 private:
  std::timed_mutex mu_;
};

// Holds a TimedMutex for a scope.
class LARDER_SCOPED_CAPABILITY TimedMutexLock {
 public:
  explicit TimedMutexLock(TimedMutex& mu) LARDER_ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~TimedMutexLock() LARDER_RELEASE() { mu_.Unlock(); }
  TimedMutexLock(const TimedMutexLock&) = delete;
  TimedMutexLock& operator=(const TimedMutexLock&) = delete;

 private:
  TimedMutex& mu_;
};

}  // namespace

struct ClientDaemon::Connection {
  Fd fd;
  std::string peer;                           // "pid P uid U"
  std::unique_ptr<AttachConnection> handler;  // serves its requests
  TimedMutex write_mu;                        // one frame at a time on fd

  Mutex mu;
  CondVar cv;
  // Requests read, not yet taken by a worker.
  std::deque<Frame> queue LARDER_GUARDED_BY(mu);
  // Requests being served.
  size_t busy LARDER_GUARDED_BY(mu) = 0;
  // The reader has ended.
  bool closing LARDER_GUARDED_BY(mu) = false;
  std::vector<std::thread> workers;  // started and joined by the reader thread only

  std::thread reader;
  std::atomic<bool> done{false};  // the reader has ended and released everything
};

Result<std::unique_ptr<ClientDaemon>> ClientDaemon::Start(const ClientDaemonOptions& options) {
  if (options.max_clients == 0) return InvalidArgumentError("max_clients must be at least 1");
  if (options.max_in_flight == 0 || options.max_in_flight > 256) {
    return InvalidArgumentError("max_in_flight must be in 1..256");
  }
  if (options.max_regions == 0) return InvalidArgumentError("max_regions must be at least 1");
  if (options.frame_timeout.count() <= 0) {
    return InvalidArgumentError("frame_timeout must be positive");
  }
  LARDER_ASSIGN_OR_RETURN(SocketAddress address, ResolveSocketAddress(options.socket));
  LARDER_ASSIGN_OR_RETURN(Fd listener, ListenOn(address));
  std::unique_ptr<ClientDaemon> daemon(new ClientDaemon(options, address, std::move(listener)));
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) return ErrnoToStatus(errno, "pipe");
  daemon->stop_read_ = Fd(pipe_fds[0]);
  daemon->stop_write_ = Fd(pipe_fds[1]);
  LARDER_ASSIGN_OR_RETURN(daemon->store_, StoreClient::Create(options.store));
  daemon->acceptor_ = std::thread([raw = daemon.get()] { raw->AcceptLoop(); });
  return daemon;
}

ClientDaemon::ClientDaemon(ClientDaemonOptions options, SocketAddress address, Fd listener)
    : options_(std::move(options)), address_(std::move(address)), listener_(std::move(listener)) {}

ClientDaemon::~ClientDaemon() { Stop(); }

void ClientDaemon::Stop() {
  std::call_once(stopped_, [this] {
    stopping_ = true;
    if (stop_write_.valid()) {
      char byte = 1;
      ssize_t n = write(stop_write_.get(), &byte, 1);
      (void)n;  // a full pipe already says stop
    }
    if (acceptor_.joinable()) acceptor_.join();
    listener_.Reset();
    if (!address_.abstract) unlink(address_.name.c_str());
    std::list<std::unique_ptr<Connection>> connections;
    {
      MutexLock lock(mu_);
      connections.swap(connections_);
    }
    const Status going =
        UnavailableError("larder-client at " + address_.display + " is shutting down");
    for (auto& connection : connections) {
      if (!connection->done && connection->write_mu.TryLockFor(kGoodbyeTimeout)) {
        PayloadWriter payload;
        payload.PutStatus(going);
        SendFrame(connection->fd.get(), static_cast<uint16_t>(MessageType::kGoodbye), 0,
                  payload.data(), -1, Clock::now() + kGoodbyeTimeout, connection->peer)
            .IgnoreError();
        connection->write_mu.Unlock();
      }
      // Wakes the reader (and fails sends of the workers), which then waits for the running
      // requests and releases the client's regions.
      shutdown(connection->fd.get(), SHUT_RDWR);
    }
    for (auto& connection : connections) {
      if (connection->reader.joinable()) connection->reader.join();
    }
    connections.clear();
    store_.reset();  // unmounts the segment
  });
}

size_t ClientDaemon::connections() const {
  MutexLock lock(mu_);
  size_t live = 0;
  for (const auto& connection : connections_) live += connection->done ? 0 : 1;
  return live;
}

void ClientDaemon::Reap() {
  std::list<std::unique_ptr<Connection>> finished;
  {
    MutexLock lock(mu_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      if ((*it)->done) {
        finished.push_back(std::move(*it));
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& connection : finished) connection->reader.join();
}

void ClientDaemon::Refuse(Fd fd, const Status& why, const std::string& peer) {
  Log().warn("larder-client: refused {}: {}", peer, why.ToString());
  PayloadWriter payload;
  payload.PutStatus(why);
  SendFrame(fd.get(), static_cast<uint16_t>(MessageType::kGoodbye), 0, payload.data(), -1,
            Clock::now() + kGoodbyeTimeout, peer)
      .IgnoreError();
}

void ClientDaemon::AcceptLoop() {
  const uid_t self = geteuid();
  while (!stopping_) {
    pollfd polled[2] = {{listener_.get(), POLLIN, 0}, {stop_read_.get(), POLLIN, 0}};
    int rc = poll(polled, 2, -1);
    if (rc < 0 && errno != EINTR) {
      Log().error("larder-client: poll on {}: {}", address_.display, std::strerror(errno));
      return;
    }
    if (rc <= 0 || polled[1].revents != 0) continue;
    int accepted = accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (accepted < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS) {
        WarnOnce("larder-client-accept", "larder-client: accept on " + address_.display + ": " +
                                             std::strerror(errno) + "; refusing clients a while");
        pollfd wait{stop_read_.get(), POLLIN, 0};
        poll(&wait, 1, 100);  // the connection waits in the backlog
      }
      continue;
    }
    Fd fd(accepted);
    Reap();
    Result<PeerCredentials> cred = GetPeerCredentials(fd.get());
    if (!cred.ok()) {
      Refuse(std::move(fd), cred.status(), "an unknown peer");
      continue;
    }
    std::string peer = "pid " + std::to_string(cred->pid) + " uid " + std::to_string(cred->uid);
    if (cred->uid != self && cred->uid != 0) {
      Refuse(std::move(fd),
             PermissionDeniedError("uid " + std::to_string(cred->uid) +
                                   " may not attach to larder-client at " + address_.display +
                                   ", which runs as uid " + std::to_string(self) +
                                   " (only that uid and root may)"),
             peer);
      continue;
    }
    if (connections() >= options_.max_clients) {
      Refuse(std::move(fd),
             ResourceExhaustedError("larder-client at " + address_.display + " serves " +
                                    std::to_string(options_.max_clients) +
                                    " clients already (--max-clients)"),
             peer);
      continue;
    }
    auto connection = std::make_unique<Connection>();
    connection->fd = std::move(fd);
    connection->peer = peer;
    AttachConnectionOptions handler_options;
    handler_options.tenant_id = options_.store.tenant_id;
    handler_options.max_regions = options_.max_regions;
    handler_options.max_in_flight = options_.max_in_flight;
    connection->handler = std::make_unique<AttachConnection>(store_.get(), handler_options, peer);
    Connection* raw = connection.get();
    MutexLock lock(mu_);
    connections_.push_back(std::move(connection));
    raw->reader = std::thread([this, raw] { Serve(raw); });
  }
}

namespace {

// Sends a reply; a client that does not take it in time loses its connection.
void SendReply(int fd, TimedMutex* write_mu, const MessageHeader& request,
               const std::string& payload, std::chrono::milliseconds timeout,
               const std::string& peer) {
  TimedMutexLock lock(*write_mu);
  Status sent = SendFrame(fd, request.type | kReplyBit, request.request_id, payload, -1,
                          Clock::now() + timeout, peer);
  if (!sent.ok()) {
    Log().warn("larder-client: reply to {} failed: {}; closing its connection", peer,
               sent.ToString());
    shutdown(fd, SHUT_RDWR);
  }
}

void SendGoodbye(int fd, TimedMutex* write_mu, const Status& why, const std::string& peer) {
  Log().warn("larder-client: closing the connection of {}: {}", peer, why.ToString());
  if (!write_mu->TryLockFor(kGoodbyeTimeout)) return;
  PayloadWriter payload;
  payload.PutStatus(why);
  SendFrame(fd, static_cast<uint16_t>(MessageType::kGoodbye), 0, payload.data(), -1,
            Clock::now() + kGoodbyeTimeout, peer)
      .IgnoreError();
  write_mu->Unlock();
}

std::string ErrorReply(const Status& status) {
  PayloadWriter out;
  out.PutStatus(status);
  return out.Take();
}

}  // namespace

void ClientDaemon::Serve(Connection* c) {
  const int fd = c->fd.get();
  bool attached = false;
  while (!stopping_) {
    if (!WaitReadable(fd, c->peer).ok()) break;
    Frame frame;
    Status read =
        RecvFrame(fd, kMaxFrameBytes, Clock::now() + options_.frame_timeout, c->peer, &frame);
    if (!read.ok()) {
      if (read.code() == StatusCode::kInvalidArgument) {
        SendGoodbye(fd, &c->write_mu, read, c->peer);
      } else if (read.code() == StatusCode::kDeadlineExceeded) {
        SendGoodbye(fd, &c->write_mu,
                    DeadlineExceededError("a frame did not arrive whole within " +
                                          std::to_string(options_.frame_timeout.count()) + " ms"),
                    c->peer);
      }  // else the client closed its end
      break;
    }
    const uint16_t type = frame.header.type;
    if (!IsRequestType(type)) {
      SendGoodbye(fd, &c->write_mu,
                  InvalidArgumentError("unknown request " + MessageTypeName(type)), c->peer);
      break;
    }
    if (!attached && type != static_cast<uint16_t>(MessageType::kHello)) {
      SendGoodbye(
          fd, &c->write_mu,
          FailedPreconditionError("the first request must be Hello, not " + MessageTypeName(type)),
          c->peer);
      break;
    }
    if (frame.extra_fds) {
      frame.fd.Reset();
      SendReply(fd, &c->write_mu, frame.header,
                ErrorReply(InvalidArgumentError(MessageTypeName(type) +
                                                " carries more than one file descriptor")),
                options_.frame_timeout, c->peer);
      continue;
    }
    if (!attached) {
      std::string reply = c->handler->Handle(type, frame.payload, std::move(frame.fd));
      SendReply(fd, &c->write_mu, frame.header, reply, options_.frame_timeout, c->peer);
      if (reply.empty() || reply[0] != 0) break;  // refused (e.g. another protocol version)
      attached = true;
      continue;
    }
    MutexLock lock(c->mu);
    while (c->queue.size() + c->busy >= options_.max_in_flight) c->cv.Wait(lock);
    c->queue.push_back(std::move(frame));
    if (c->workers.size() < options_.max_in_flight &&
        c->queue.size() + c->busy > c->workers.size()) {
      c->workers.emplace_back([this, c] { Work(c); });
    }
    c->cv.SignalAll();
  }
  {
    MutexLock lock(c->mu);
    c->closing = true;
  }
  c->cv.SignalAll();
  for (std::thread& worker : c->workers) worker.join();
  shutdown(fd, SHUT_RDWR);
  const size_t regions = c->handler->region_count();
  c->handler.reset();  // unmaps its regions; the objects it stored stay
  Log().info("larder-client: {} detached ({} shared regions released)", c->peer, regions);
  c->done = true;
}

void ClientDaemon::Work(Connection* c) {
  MutexLock lock(c->mu);
  for (;;) {
    while (!c->closing && c->queue.empty()) c->cv.Wait(lock);
    if (c->closing) return;  // requests still queued belong to a client that left
    Frame frame = std::move(c->queue.front());
    c->queue.pop_front();
    ++c->busy;
    lock.Unlock();
    std::string reply = c->handler->Handle(frame.header.type, frame.payload, std::move(frame.fd));
    SendReply(c->fd.get(), &c->write_mu, frame.header, reply, options_.frame_timeout, c->peer);
    lock.Lock();
    --c->busy;
    c->cv.SignalAll();
  }
}

}  // namespace larder::standalone
