// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Client side of the frame protocol (frame.h): connecting to an engine's frame server (TLS and the
// mutual token proof) and the frame helpers that the bootstrap client and the tcp transport share.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "common/net.h"
#include "transfer/transport.h"
#include "transfer/wire/frame.h"
#include "transfer/wire/stream.h"

namespace larder::transfer::wire {

// What an engine proves and checks when it dials a frame server. Immutable; one is shared by all
// of a transport's connections.
struct TcpClientConfig {
  std::string engine_id;                  // named in this client's proofs
  std::string token;                      // the cluster token; empty: none
  std::shared_ptr<const TlsContext> tls;  // the CA to verify servers with; null: plain tcp only

  // From an engine's context (engine_id, auth_token, tls_ca_file). InvalidArgument naming the file
  // when the CA does not load.
  static Result<std::shared_ptr<const TcpClientConfig>> FromContext(const EngineContext& context);
};

// Connects to a frame server and completes the exchange of frame.h: TLS when the server offers
// it, then the mutual token proof when the server asks for one. The returned stream is ready for
// requests: the server proved the token (when `config` has one) on this very connection.
// Unavailable when unreachable; PermissionDenied when either side lacks the other's requirement
// (a token, TLS), when the server refuses our proof, when the server fails to prove the token,
// or when its certificate does not verify; DataLoss for a malformed hello or reply.
// `engine_id` (with a token): the engine the server must be, as the descriptor of the segment
// to reach names it (the master checked that it is the mounting client's); PermissionDenied for a
// server that proves the token as another engine. Empty: any engine (descriptor queries).
Result<TcpStream> ConnectAndAuthenticate(const HostPort& address, const TcpClientConfig& config,
                                         Deadline deadline, std::string_view engine_id = {});

// Sends header `h` and `len` payload bytes.
Status SendFrame(TcpStream& stream, const FrameHeader& h, const void* payload, size_t len,
                 Deadline deadline);
// Reads and decodes one header; DataLoss for a malformed one.
Status RecvHeader(TcpStream& stream, FrameHeader* h, Deadline deadline);
// Reads the message of an error frame into `reported` (the error the peer sent; the stream is
// still in sync). Returns the stream's status: not OK when the connection broke meanwhile.
Status ReadErrorFrame(TcpStream& stream, const FrameHeader& h, Deadline deadline, Status* reported);
// The error frame's Status, or the stream's when it broke: for exchanges that end either way.
Status RecvErrorFrame(TcpStream& stream, const FrameHeader& h, Deadline deadline);

}  // namespace larder::transfer::wire
