// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The frames of larder-master's local control socket (docs/wire-protocols.md, "The local control
// socket"): a client on the master's host sends the calls of proto/master.proto over an abstract
// Unix socket, which the master names in ChallengeReply.local_socket, instead of over gRPC. Both
// ends are on one host, so numbers are in the host's byte order.
//   request: RequestHead{length, method, version = kVersion, flags}, then `length` bytes: the
//            request exactly as gRPC would carry it, and under a cluster token its proof after
//            them (flag kProofAfterBytes) on a connection not yet bound to the session.
//            `method` is the method's index in proto/master.proto's service Master.
//   reply:   ReplyHead{code, message_length, details_length, body_length, flags}, then the status
//            message, the status details (gRPC's error_details) and the reply's bytes (only with
//            code 0, OK).
// One call at a time per connection. The master closes a connection whose frame it cannot take
// (a wrong version, a length over kMaxBodyBytes, a frame cut short).
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "larder/status.h"

namespace larder::local_control {

struct RequestHead {
  uint32_t length = 0;
  uint16_t method = 0;
  uint8_t version = 0;
  uint8_t flags = 0;  // kProofAfterBytes, or none
};
// The request's bytes end with its proof (control_auth::EncodeTrailer). A proof the master takes
// binds the connection to the proof's session: the calls after it on the connection carry none
// and act for that session (no other process can write on the connection). Every other flag is
// reserved (0).
inline constexpr uint8_t kProofAfterBytes = 1;
static_assert(sizeof(RequestHead) == 8);

struct ReplyHead {
  uint32_t code = 0;
  uint32_t message_length = 0;
  uint32_t details_length = 0;
  uint32_t body_length = 0;
  uint32_t flags = 0;  // kBound, or none
};
static_assert(sizeof(ReplyHead) == 20);
// The call's proof was taken: the connection is bound to its session now.
inline constexpr uint32_t kBound = 1;

inline constexpr uint8_t kVersion = 1;
// The largest request or reply: gRPC's message limit on both sides of the master's channel.
inline constexpr uint32_t kMaxBodyBytes = 256u << 20;
// The largest status message, and the largest status details.
inline constexpr uint32_t kMaxStatusBytes = 64u << 10;

// Writes every piece, in order. False on an error (errno says which; EAGAIN: the socket's send
// timeout passed).
bool WriteAll(int fd, std::span<iovec> pieces);
// Reads exactly `size` bytes. False on an error or at the end of the stream (errno 0 then).
bool ReadAll(int fd, void* out, size_t size);
// Reads `length` bytes into *out, growing it as they arrive: a length a peer claims costs no
// memory that it did not send.
bool ReadBody(int fd, size_t length, std::string* out);
// Sets the socket's send and receive timeouts (SO_SNDTIMEO, SO_RCVTIMEO); zero: none.
bool SetTimeouts(int fd, std::chrono::milliseconds timeout);

}  // namespace larder::local_control
