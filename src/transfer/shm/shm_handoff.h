// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The shm fd handoff: an engine serves an abstract Unix socket; a same-host peer asks for a
// segment (id, epoch) and receives its memfd over SCM_RIGHTS. The owner checks the peer's uid
// (SO_PEERCRED) and, when a token is configured, an HMAC over a fresh nonce.
//
// Wire format (fixed size, host byte order; both ends are on one host):
//   server -> peer  ServerMessage (256 B): kHello {need_auth, nonce} right after accept, or a
//                   kReply {code, message} (e.g. PermissionDenied for a uid that is not allowed)
//   peer -> server  Request (56 B): {segment_id, epoch, mac = HMAC(token, nonce|id|epoch)}
//   server -> peer  kReply {code, size, message}, with the memfd attached when code is OK
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "common/net.h"
#include "larder/status.h"
#include "transfer/transport.h"

namespace larder::transfer {

inline constexpr uint32_t kHandoffMagic = 0x3148534c;  // "LSH1"

struct HandoffServerMessage {
  enum Type : uint8_t { kHello = 1, kReply = 2 };
  uint32_t magic = kHandoffMagic;
  uint8_t type = 0;
  uint8_t code = 0;  // StatusCode, for kReply
  uint8_t need_auth = 0;
  uint8_t reserved = 0;
  uint64_t size = 0;  // segment bytes, for an OK kReply
  uint8_t nonce[32] = {};
  char message[208] = {};
};
static_assert(sizeof(HandoffServerMessage) == 256);

struct HandoffRequest {
  uint32_t magic = kHandoffMagic;
  uint32_t reserved = 0;
  uint64_t segment_id = 0;
  uint64_t epoch = 0;
  uint8_t mac[32] = {};
};
static_assert(sizeof(HandoffRequest) == 56);

// HMAC(token, nonce | segment_id | epoch).
std::array<uint8_t, 32> HandoffMac(const std::string& token, const uint8_t* nonce,
                                   uint64_t segment_id, uint64_t epoch);

// Serves fd handoffs for one engine's exported memfd segments. Thread-safe.
class ShmHandoffServer {
 public:
  ShmHandoffServer(const EngineContext& context, std::vector<uint32_t> allowed_uids);
  ~ShmHandoffServer();

  // Listens on the abstract socket `name` and starts serving.
  Status Start(const std::string& name);
  void Stop();

 private:
  void AcceptLoop();
  void Serve(int fd);

  EngineContext context_;
  std::vector<uint32_t> allowed_uids_;
  Fd listener_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
};

// Asks the owner behind `descriptor.shm_socket` for the segment's memfd. The returned fd is open.
// `owner_pid` receives the pid of the process that served it, as the kernel reports it for the
// socket (SO_PEERCRED, in this process's pid namespace; 0 when it is not visible here).
// PermissionDenied when the owner refuses our uid or token; Unavailable when it is unreachable.
Result<Fd> RequestSegmentFd(const SegmentDescriptor& descriptor, const std::string& token,
                            Deadline deadline, uint64_t* size, pid_t* owner_pid);

}  // namespace larder::transfer
