// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "standalone/channel.h"

#include <sys/socket.h>
#include <unistd.h>

namespace larder::standalone {

Result<std::unique_ptr<Channel>> Channel::Open(const SocketAddress& address,
                                               std::chrono::milliseconds timeout) {
  LARDER_ASSIGN_OR_RETURN(Fd fd, ConnectTo(address));
  // Anyone may bind an abstract name first; sharing memory with an impostor would hand it our
  // KV cache, so the daemon must be us or root.
  LARDER_ASSIGN_OR_RETURN(PeerCredentials cred, GetPeerCredentials(fd.get()));
  const uid_t self = geteuid();
  if (cred.uid != self && cred.uid != 0) {
    return PermissionDeniedError("the process serving " + address.display + " (pid " +
                                 std::to_string(cred.pid) + ") runs as uid " +
                                 std::to_string(cred.uid) + ", neither this uid (" +
                                 std::to_string(self) + ") nor root; refusing to attach");
  }
  std::unique_ptr<Channel> channel(new Channel(address, std::move(fd), timeout));
  channel->reader_ = std::thread([raw = channel.get()] { raw->ReadLoop(); });
  return channel;
}

Channel::Channel(SocketAddress address, Fd fd, std::chrono::milliseconds timeout)
    : address_(std::move(address)), fd_(std::move(fd)), timeout_(timeout) {}

Channel::~Channel() {
  MarkGone(Gone("this client detached"));
  if (reader_.joinable()) reader_.join();
}

Status Channel::Gone(std::string_view why) const {
  return UnavailableError("larder-client at " + address_.display + " is gone: " + std::string(why));
}

Status Channel::gone() const {
  MutexLock lock(mu_);
  return gone_;
}

void Channel::MarkGone(const Status& why) {
  {
    MutexLock lock(mu_);
    if (!gone_.ok()) return;
    gone_ = why;
  }
  cv_.SignalAll();
  // Wakes the reader; the daemon sees the end and releases what this client shared.
  shutdown(fd_.get(), SHUT_RDWR);
}

Result<std::string> Channel::Call(MessageType type, std::string_view payload, int pass_fd) {
  const uint64_t id = next_id_.fetch_add(1);
  const Deadline deadline = Clock::now() + timeout_;
  Pending pending;
  pending.type = static_cast<uint16_t>(type);
  {
    MutexLock lock(mu_);
    if (!gone_.ok()) return gone_;
    pending_.emplace(id, &pending);
  }
  Status sent;
  {
    MutexLock lock(send_mu_);
    sent = SendFrame(fd_.get(), static_cast<uint16_t>(type), id, payload, pass_fd, deadline,
                     address_.display);
  }
  if (!sent.ok()) {
    // A daemon that refused us said why in a Goodbye before it closed, and the reader is about
    // to hand that over; the send error itself says less.
    MutexLock lock(mu_);
    while (gone_.ok() && cv_.WaitUntil(lock, deadline)) {
    }
    pending_.erase(id);
    if (!gone_.ok()) return gone_;
    lock.Unlock();
    MarkGone(Gone(sent.message()));
    return gone();
  }
  bool timed_out = false;
  {
    MutexLock lock(mu_);
    while (!pending.done && gone_.ok() && cv_.WaitUntil(lock, deadline)) {
    }
    timed_out = !pending.done && gone_.ok();
    pending_.erase(id);
    if (pending.done) return std::move(pending.payload);
    if (!timed_out) return gone_;
  }
  // The daemon may still act on this request later; it is taken for gone so that nothing waits
  // on it again.
  MarkGone(Gone("no reply to " + MessageTypeName(static_cast<uint16_t>(type)) + " within " +
                std::to_string(timeout_.count()) + " ms"));
  return gone();
}

void Channel::ReadLoop() {
  const int fd = fd_.get();
  for (;;) {
    if (Status ready = WaitReadable(fd, address_.display); !ready.ok()) {
      MarkGone(Gone(ready.message()));
      return;
    }
    Frame frame;
    Status read = RecvFrame(fd, kMaxFrameBytes, Clock::now() + timeout_, address_.display, &frame);
    if (!read.ok()) {
      MarkGone(read.code() == StatusCode::kUnavailable ? Gone("the connection closed")
                                                       : Gone(read.message()));
      return;
    }
    frame.fd.Reset();  // the daemon never sends one
    const uint16_t type = frame.header.type;
    if (type == static_cast<uint16_t>(MessageType::kGoodbye)) {
      PayloadReader in(frame.payload);
      Status why = in.GetStatus();
      if (why.ok() || !in.Finish().ok()) why = InternalError("a malformed Goodbye");
      MarkGone(why.code() == StatusCode::kUnavailable
                   ? Gone(why.message())
                   : Status(why.code(), "larder-client at " + address_.display +
                                            " closed the connection: " + why.message()));
      return;
    }
    if ((type & kReplyBit) == 0 || !IsRequestType(type & ~kReplyBit)) {
      MarkGone(Gone("it sent a frame of unknown " + MessageTypeName(type)));
      return;
    }
    bool mismatched = false;
    {
      MutexLock lock(mu_);
      auto it = pending_.find(frame.header.request_id);
      if (it != pending_.end()) {
        mismatched = (it->second->type | kReplyBit) != type;
        if (!mismatched) {
          it->second->payload = std::move(frame.payload);
          it->second->done = true;
        }
      }
    }
    if (mismatched) {
      MarkGone(Gone("it answered a request with a " + MessageTypeName(type) + " reply"));
      return;
    }
    cv_.SignalAll();
  }
}

}  // namespace larder::standalone
