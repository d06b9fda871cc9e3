// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The shm fd handoff: an engine serves an abstract Unix socket; a same-host peer asks for a
// segment (id, epoch) and receives its memfd over SCM_RIGHTS. The owner checks the peer's uid
// (SO_PEERCRED). With a cluster token, both ends prove the token to each other over this one
// connection: the proofs bind both nonces, both engine ids and the socket name the peer dialed, so
// a relay cannot pass one end's proof to the other, and a peer never uses an fd from an owner that
// did not prove the token.
//
// Wire format "LSH2" (fixed-size messages, host byte order; both ends are on one host). Strings
// travel as a length byte plus a fixed field; a length beyond the field is a malformed message.
//   owner -> peer  ServerMessage (512 B) right after accept: kHello {need_auth, Ns, owner engine
//                  id}, or a kReply {code, message} in its place (e.g. PermissionDenied for a uid
//                  that is not allowed)
//   peer -> owner  Request (472 B): {segment_id, epoch, Nc, peer engine id, dialed socket name,
//                  mac_c}
//   owner -> peer  ServerMessage kReply {code, size, mac_s, message}, with the memfd attached when
//                  code is OK
// With a token (need_auth 1):
//   mac_c = HMAC(token, "larder-shm-client-v1" | Ns | Nc | owner engine id | dialed socket |
//                peer engine id | segment_id | epoch)
//   mac_s = HMAC(token, "larder-shm-server-v1" | the same fields | code | size)
// each field length-prefixed (MacInput). The owner checks mac_c with its own engine id and its own
// socket name before it attaches the fd; the peer checks mac_s before it uses the fd. Without a
// token both macs are zero and unchecked. See docs/wire-protocols.md.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/net.h"
#include "larder/status.h"
#include "transfer/transport.h"

namespace larder::transfer {

inline constexpr uint32_t kHandoffMagic = 0x3248534c;  // "LSH2"
// Longest engine id a handoff carries (its length travels in one byte).
inline constexpr size_t kHandoffMaxEngineId = 255;
// Longest abstract socket name: sun_path (108 bytes) less the leading NUL. Longer names would be
// truncated by the kernel, so they are refused instead.
inline constexpr size_t kHandoffMaxSocketName = 107;
inline constexpr size_t kHandoffNonceBytes = 32;

// Exchanges one owner serves at once (ShmHandoffServer), and how long one may take.
inline constexpr size_t kMaxPendingHandoffs = 256;
inline constexpr std::chrono::milliseconds kHandoffTimeout{500};

struct HandoffServerMessage {
  enum Type : uint8_t { kHello = 1, kReply = 2 };
  uint32_t magic = kHandoffMagic;
  uint8_t type = 0;
  uint8_t code = 0;  // StatusCode, for kReply
  uint8_t need_auth = 0;
  uint8_t engine_id_len = 0;                     // kHello: bytes of engine_id
  uint64_t size = 0;                             // segment bytes, for an OK kReply
  uint8_t nonce[kHandoffNonceBytes] = {};        // kHello: Ns
  uint8_t mac[32] = {};                          // kReply: mac_s once the request proved the token
  char engine_id[kHandoffMaxEngineId + 1] = {};  // kHello: the owner's engine id
  char message[176] = {};                        // kReply: error text, NUL-terminated
};
static_assert(sizeof(HandoffServerMessage) == 512);
static_assert(offsetof(HandoffServerMessage, mac) == 48 &&
              offsetof(HandoffServerMessage, engine_id) == 80 &&
              offsetof(HandoffServerMessage, message) == 336);  // as docs/wire-protocols.md says

struct HandoffRequest {
  uint32_t magic = kHandoffMagic;
  uint8_t engine_id_len = 0;  // bytes of engine_id
  uint8_t socket_len = 0;     // bytes of socket
  uint16_t reserved = 0;
  uint64_t segment_id = 0;
  uint64_t epoch = 0;
  uint8_t nonce[kHandoffNonceBytes] = {};        // Nc
  uint8_t mac[32] = {};                          // mac_c, zero without a token
  char engine_id[kHandoffMaxEngineId + 1] = {};  // the peer's engine id
  char socket[128] = {};                         // the abstract socket name the peer dialed
};
static_assert(sizeof(HandoffRequest) == 472);
static_assert(offsetof(HandoffRequest, nonce) == 24 && offsetof(HandoffRequest, engine_id) == 88 &&
              offsetof(HandoffRequest, socket) == 344);

// Everything one handoff's proofs bind: the connection (both nonces, the socket the peer
// dialed), both ends (engine ids) and what is asked for (segment, epoch).
struct HandoffBinding {
  const uint8_t* owner_nonce = nullptr;  // Ns, kHandoffNonceBytes
  const uint8_t* peer_nonce = nullptr;   // Nc, kHandoffNonceBytes
  std::string_view owner_engine_id;
  std::string_view socket_name;
  std::string_view peer_engine_id;
  uint64_t segment_id = 0;
  uint64_t epoch = 0;
};

// mac_c: the peer's proof of `token` for this binding.
std::array<uint8_t, 32> HandoffPeerMac(std::string_view token, const HandoffBinding& binding);
// mac_s: the owner's proof of `token` for this binding and its reply (`code`, `size`).
std::array<uint8_t, 32> HandoffOwnerMac(std::string_view token, const HandoffBinding& binding,
                                        uint8_t code, uint64_t size);

// Serves fd handoffs for one engine's exported memfd segments. One thread serves every connection
// at once (poll): each exchange has its own deadline (`timeout`), so a peer that stalls
// holds only its own connection and never delays another. At most kMaxPendingHandoffs exchanges
// run at a time; a connection beyond that is answered Unavailable at once. A refused or malformed
// request ends its connection only. Thread-safe.
class ShmHandoffServer {
 public:
  // Serves the segments in `context.exports` to peers whose uid is in `allowed_uids` (empty: only
  // this process's uid), requiring proof of `context.auth_token` when it is set. An exchange not
  // done within `timeout` of its connection is dropped.
  ShmHandoffServer(const EngineContext& context, std::vector<uint32_t> allowed_uids,
                   std::chrono::milliseconds timeout = kHandoffTimeout);
  ~ShmHandoffServer();

  // Listens on the abstract socket `name` and starts serving. InvalidArgument when `name` is
  // longer than kHandoffMaxSocketName or the engine id longer than kHandoffMaxEngineId; the OS
  // error when the name is taken.
  // REQUIRES: called at most once.
  Status Start(const std::string& name);
  // Stops accepting and joins the serving thread. Fds already passed stay valid in their peers.
  void Stop();

  // Serves one connected socket `fd` (the caller keeps it) to the end of its exchange, bounded by
  // the timeout: what the accept loop does for each peer, in one call (the fuzz target's way
  // in). REQUIRES: Start succeeded.
  void Serve(int fd);

 private:
  // One exchange in progress.
  struct Exchange {
    int fd = -1;
    Fd owned;  // the accepted connection (the accept loop's); Serve's caller keeps its own
    std::string peer;
    Deadline deadline;
    HandoffServerMessage hello;
    HandoffRequest request;
    size_t received = 0;  // bytes of `request` read so far
    bool done = false;
  };

  void AcceptLoop();
  // Checks the peer's uid and sends the greeting; false when the exchange is over (refused).
  bool Greet(Exchange* ex);
  // Reads what has arrived of the request, without waiting; answers it once it is whole.
  void ReadRequest(Exchange* ex);
  // Checks a whole request and replies (with the segment's fd when it is granted).
  void Answer(const Exchange& ex);

  EngineContext context_;
  std::vector<uint32_t> allowed_uids_;
  const std::chrono::milliseconds timeout_;
  std::string socket_name_;  // set by Start, before the serving thread exists
  Fd listener_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
};

// Asks the owner behind the descriptor's shm blob (its handoff socket) for the segment's memfd, as
// engine `self`
// (`self.engine_id`, and `self.auth_token` when set). Returns an open fd that the owner proved
// to come from a holder of the token (when `self` has one); `size` receives the segment size the
// owner reports. `owner_pid` receives the pid of the process that served it, as the kernel
// reports it for the socket (SO_PEERCRED, in this process's pid namespace; 0 when it is not
// visible here).
// Errors: PermissionDenied when the owner refuses our uid or proof, when `self` has a token and
// the owner asks for no proof or its reply does not prove the token (its fd is then closed
// unused), when the owner has a token and `self` has none, or when the socket is served by
// another engine than descriptor.engine_id; Unavailable when it is unreachable; InvalidArgument
// for an engine id or socket name too long to send; the owner's own code (NotFound for an
// unknown segment or stale epoch, ...) otherwise.
Result<Fd> RequestSegmentFd(const SegmentDescriptor& descriptor, const EngineContext& self,
                            Deadline deadline, uint64_t* size, pid_t* owner_pid);

}  // namespace larder::transfer
