// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The larder-client socket: its address forms, listening and connecting, the peer's credentials,
// and reading and writing whole LSC1 frames (protocol.h) with deadlines and fd passing.
//
// Thread-safety: free functions; a socket may be read by one thread while another writes it, but
// two writers must take turns (a frame is several writes).
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "common/net.h"
#include "larder/status.h"
#include "standalone/protocol.h"

namespace larder::standalone {

inline constexpr std::string_view kDefaultSocket = "@larder-client-50052";

// Where the daemon listens.
struct SocketAddress {
  bool abstract = true;
  std::string name;     // abstract name (no leading '@' or NUL), or the filesystem path
  std::string display;  // "@name" or the path, as logs and errors show it
};

// "@name" -> abstract "name"; anything with a '/' -> that path; "host:port" (Mooncake's
// client_server_address) -> abstract "larder-client-<port>". Errors: InvalidArgument for empty
// text, a name longer than a socket address holds (107 bytes), or anything else.
Result<SocketAddress> ResolveSocketAddress(std::string_view text);

// Listens on `address`. A path whose socket no process serves any more is replaced; one that is
// served fails with AlreadyExists naming it (as does a taken abstract name).
Result<Fd> ListenOn(const SocketAddress& address);
// Errors: Unavailable "no larder-client serves <address>" when nobody listens.
Result<Fd> ConnectTo(const SocketAddress& address);

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};
// SO_PEERCRED of a connected Unix socket.
Result<PeerCredentials> GetPeerCredentials(int fd);

// A frame as read.
struct Frame {
  MessageHeader header;
  std::string payload;
  Fd fd;                   // the first fd that came with the frame, if any
  bool extra_fds = false;  // more than one fd came (the others were closed)
};

// Writes one frame; attaches `pass_fd` (when >= 0) to its first byte. Errors as SendAll.
Status SendFrame(int fd, uint16_t type, uint64_t request_id, std::string_view payload, int pass_fd,
                 Deadline deadline, std::string_view peer);

// Blocks until `fd` is readable or hung up (no deadline: an idle connection is fine). OK when
// there is something to read or an end to notice.
Status WaitReadable(int fd, std::string_view peer);

// Reads one frame whose header must pass CheckHeader(max_length). The whole frame must arrive
// by `deadline`. Errors: Unavailable (the peer closed), DeadlineExceeded (it stalled),
// InvalidArgument (malformed header; nothing past it was read).
Status RecvFrame(int fd, uint32_t max_length, Deadline deadline, std::string_view peer,
                 Frame* frame);

}  // namespace larder::standalone
