// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Fuzzes the owner's side of the shm fd handoff (shm_handoff.h): the bytes of a peer's request,
// as they reach ShmHandoffServer over a connected Unix socket. Two owners serve one memfd segment
// (id 1, a fixed epoch) on fixed socket names: one without a token and one with, so both the
// proof check and what lies past it are reached (the first input byte picks the owner). Every input
// is padded to a whole request; the replies (and any fd handed over) are read back and closed, so
// nothing leaks across inputs.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "common/memory.h"
#include "transfer/segment_exports.h"
#include "transfer/shm/shm_handoff.h"

using namespace larder;            // NOLINT: a fuzz target
using namespace larder::transfer;  // NOLINT

namespace {

struct Owner {
  SegmentExports exports;
  std::unique_ptr<ShmHandoffServer> server;
};

Owner* MakeOwner(const std::string& token) {
  static std::shared_ptr<MemoryRegion> memory =
      AllocateMemfd("larder-fuzz", 1 << 20, HugePages::kOff).value();
  auto* owner = new Owner();
  SegmentDescriptor d;
  d.segment_id = 1;
  d.epoch = 0x1122334455667788;
  d.name = "kv";
  d.engine_id = "fuzz-host/1/" + std::string(token.empty() ? "open" : "token");
  d.host_id = "fuzz-host";
  d.size = memory->size();
  d.memory_kind = MemoryKind::kMemfd;
  owner->exports.Publish(d, static_cast<uint8_t*>(memory->data()), memory);
  EngineContext context;
  context.engine_id = d.engine_id;
  context.host_id = d.host_id;
  context.auth_token = token;
  context.exports = &owner->exports;
  // A fixed socket name, so that the seeds name it as the dialed socket; a second fuzzing
  // process on the host takes a name with its pid instead (and reaches less of the code).
  const std::string name = std::string("larder-fuzz-shm/") + (token.empty() ? "open" : "token");
  owner->server = std::make_unique<ShmHandoffServer>(context, std::vector<uint32_t>{});
  if (!owner->server->Start(name).ok()) {
    owner->server = std::make_unique<ShmHandoffServer>(context, std::vector<uint32_t>{});
    if (!owner->server->Start(name + "/" + std::to_string(getpid())).ok()) std::abort();
  }
  return owner;
}

// Reads what the owner sent until it closed, closing every fd that came with it.
void Drain(int fd) {
  for (;;) {
    char bytes[1024];
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
    iovec iov{bytes, sizeof(bytes)};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); n >= 0 && c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t fds = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < fds; ++i) {
        int passed;
        std::memcpy(&passed, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        close(passed);
      }
    }
    if (n <= 0) return;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Owner* open = MakeOwner("");
  static Owner* guarded = MakeOwner("fuzz-token");
  if (size == 0) return 0;
  Owner* owner = (data[0] & 1) ? guarded : open;
  // The request's bytes: the input, zero-padded (HandoffRequest is plain bytes on the wire).
  uint8_t request[sizeof(HandoffRequest)] = {};
  std::memcpy(request, data + 1, std::min(size - 1, sizeof(request)));
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) return 0;
  if (write(pair[0], request, sizeof(request)) == static_cast<ssize_t>(sizeof(request))) {
    shutdown(pair[0], SHUT_WR);
    owner->server->Serve(pair[1]);
  }
  close(pair[1]);
  Drain(pair[0]);
  close(pair[0]);
  return 0;
}
