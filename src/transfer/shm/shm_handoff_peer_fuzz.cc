// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Fuzzes the peer's side of the shm fd handoff (shm_handoff.h): RequestSegmentFd reading what an
// owner sends back, the greeting and the reply, as a hostile process serving the socket named in a
// descriptor could send them. A thread of this target plays that owner: for each input it writes
// the input's bytes on the next connection (with fds attached where the input asks), then ends
// its side, reads the peer's request to its end and closes. When RequestSegmentFd grants an fd,
// the target checks it as ShmTransport::Open does before mapping it. Input:
//   byte 0     flags: 1 the peer holds a token, 2 an fd rides on the greeting, 4 an fd rides on
//              the reply, 8 the reply's fd is a pipe instead of a memfd, 16 two fds ride on it
//   bytes 1-2  the memfd's size in KiB (little-endian)
//   the rest   what the owner writes: the greeting's bytes (the first 512) and then the reply's
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "common/net.h"
#include "transfer/shm/shm_handoff.h"

using namespace larder;            // NOLINT: a fuzz target
using namespace larder::transfer;  // NOLINT

namespace {

constexpr uint8_t kPeerHasToken = 1;
constexpr uint8_t kFdOnGreeting = 2;
constexpr uint8_t kFdOnReply = 4;
constexpr uint8_t kReplyFdIsPipe = 8;
constexpr uint8_t kTwoFds = 16;
constexpr size_t kHeader = 3;
constexpr uint64_t kSegmentSize = 1 << 20;

// The owner's side: serves each connection the input that is current when it is accepted.
class FakeOwner {
 public:
  FakeOwner() {
    socket_name_ = "larder-fuzz-shm-peer/" + std::to_string(getpid());
    auto listener = UnixListenAbstract(socket_name_);
    if (!listener.ok()) std::abort();
    listener_ = std::move(*listener);
    std::thread([this] { Loop(); }).detach();  // lives as long as the process
  }

  const std::string& socket_name() const { return socket_name_; }

  // Makes `input` what the next connection is served, and returns its number.
  uint64_t Offer(const uint8_t* data, size_t size) {
    MutexLock lock(mu_);
    input_.assign(reinterpret_cast<const char*>(data), size);
    return ++offered_;
  }

  // Waits until connection `n` is over on the owner's side (accepted or not: a peer that never
  // dialed leaves it pending, and the next Offer supersedes it).
  void WaitServed(uint64_t n) {
    MutexLock lock(mu_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (served_ < n && served_cv_.WaitUntil(lock, deadline)) {
    }
  }

 private:
  void Loop() {
    for (;;) {
      int conn = accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) continue;
      std::string input;
      uint64_t n;
      {
        MutexLock lock(mu_);
        input = input_;
        n = offered_;
      }
      Serve(conn, input);
      close(conn);
      MutexLock lock(mu_);
      served_ = n;
      served_cv_.SignalAll();
    }
  }

  static int MakeFd(const std::string& input, bool pipe_instead) {
    if (pipe_instead) {
      int ends[2];
      if (pipe2(ends, O_CLOEXEC) != 0) return -1;
      close(ends[1]);
      return ends[0];
    }
    uint16_t kib = 0;
    if (input.size() >= kHeader) std::memcpy(&kib, input.data() + 1, sizeof(kib));
    int fd = memfd_create("larder-fuzz-peer", MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(kib) * 1024) != 0) {
      close(fd);
      return -1;
    }
    return fd;
  }

  // Sends `bytes` as one message, with `count` copies of `pass_fd` when it is >= 0.
  static void Send(int conn, std::string_view bytes, int pass_fd, int count) {
    if (bytes.empty()) return;
    iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 2)] = {};
    if (pass_fd >= 0) {
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * count);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * count);
      for (int i = 0; i < count; ++i) std::memcpy(CMSG_DATA(c) + i * sizeof(int), &pass_fd, 4);
    }
    sendmsg(conn, &msg, MSG_NOSIGNAL);
  }

  static void Serve(int conn, const std::string& input) {
    uint8_t flags = input.empty() ? 0 : static_cast<uint8_t>(input[0]);
    std::string_view sent =
        input.size() > kHeader ? std::string_view(input).substr(kHeader) : std::string_view();
    std::string_view greeting = sent.substr(0, std::min(sent.size(), sizeof(HandoffServerMessage)));
    std::string_view reply = sent.substr(greeting.size());
    int count = (flags & kTwoFds) ? 2 : 1;
    int fd = (flags & kFdOnGreeting) ? MakeFd(input, false) : -1;
    Send(conn, greeting, fd, count);
    if (fd >= 0) close(fd);
    fd = (flags & kFdOnReply) ? MakeFd(input, flags & kReplyFdIsPipe) : -1;
    Send(conn, reply, fd, count);
    if (fd >= 0) close(fd);
    shutdown(conn, SHUT_WR);
    // The peer's request, to its end: it closes once it is done with the reply.
    Deadline deadline = Clock::now() + std::chrono::seconds(2);
    char request[sizeof(HandoffRequest)];
    while (RecvAll(conn, request, sizeof(request), deadline, "fuzz peer").ok()) {
    }
  }

  std::string socket_name_;
  Fd listener_;
  Mutex mu_;
  CondVar served_cv_;
  std::string input_ LARDER_GUARDED_BY(mu_);
  uint64_t offered_ LARDER_GUARDED_BY(mu_) = 0;
  uint64_t served_ LARDER_GUARDED_BY(mu_) = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static FakeOwner* owner = new FakeOwner();
  SegmentDescriptor descriptor;
  descriptor.segment_id = 1;
  descriptor.epoch = 0x1122334455667788;
  descriptor.name = "kv";
  descriptor.engine_id = "fuzz-owner";
  descriptor.host_id = "fuzz-host";
  descriptor.size = kSegmentSize;
  descriptor.memory_kind = MemoryKind::kMemfd;
  descriptor.transports["shm"] = owner->socket_name();
  EngineContext self;
  self.engine_id = "fuzz-peer";
  self.host_id = "fuzz-host";
  if (size > 0 && (data[0] & kPeerHasToken)) self.auth_token = "fuzz-token";

  uint64_t n = owner->Offer(data, size);
  uint64_t granted = 0;
  pid_t owner_pid = 0;
  auto fd = RequestSegmentFd(descriptor, self, Clock::now() + std::chrono::seconds(2), &granted,
                             &owner_pid);
  if (fd.ok()) {
    // What ShmTransport::Open checks before it maps the fd.
    struct stat st {};
    bool fits = fstat(fd->get(), &st) == 0 && static_cast<uint64_t>(st.st_size) >= kSegmentSize &&
                granted >= kSegmentSize;
    if (fits) {
      void* base = mmap(nullptr, kSegmentSize, PROT_READ, MAP_SHARED, fd->get(), 0);
      if (base != MAP_FAILED) munmap(base, kSegmentSize);
    }
  }
  owner->WaitServed(n);
  return 0;
}
