// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/wire/client.h"

#include <sys/socket.h>

#include "transfer/wire/auth.h"

namespace larder::transfer::wire {
namespace {

// Reads the payload of a hello or auth-ok frame (at most kMaxAuthPayload bytes).
Result<std::string> RecvAuthPayload(TcpStream& stream, const FrameHeader& h, Deadline deadline) {
  if (h.length > kMaxAuthPayload) {
    return DataLossError("peer " + stream.peer() + " sent a " + std::to_string(h.length) +
                         "-byte handshake payload (at most " + std::to_string(kMaxAuthPayload) +
                         ")");
  }
  std::string payload(h.length, '\0');
  LARDER_RETURN_IF_ERROR(stream.RecvAll(payload.data(), payload.size(), deadline));
  return payload;
}

// The mutual proof on a connection whose hello asked for one (frame.h, step 3).
Status ProveToken(TcpStream& stream, const TcpClientConfig& config, const std::string& hello,
                  const std::string& dialed, std::string_view engine_id, Deadline deadline) {
  const std::string& peer = stream.peer();
  TcpAuthBinding binding;
  if (Status s = DecodeHello(hello, &binding.server_nonce, &binding.server_engine_id); !s.ok()) {
    return DataLossError("bad hello from peer " + peer + ": " + s.message());
  }
  if (config.token.empty()) {
    return PermissionDeniedError("peer " + peer +
                                 " requires a cluster token and none is configured");
  }
  AuthRequest request;
  RandomBytes(request.client_nonce.data(), request.client_nonce.size());
  request.client_engine_id = config.engine_id;
  request.dialed_endpoint = dialed;
  binding.client_nonce = request.client_nonce;
  binding.dialed_endpoint = dialed;
  binding.client_engine_id = config.engine_id;
  if (stream.tls()) {
    LARDER_ASSIGN_OR_RETURN(auto channel, stream.ChannelBinding());
    binding.channel_binding.assign(channel.begin(), channel.end());
  }
  request.mac = TcpClientMac(config.token, binding);
  std::string payload = EncodeAuth(request);
  FrameHeader auth;
  auth.type = FrameType::kAuth;
  auth.length = payload.size();
  LARDER_RETURN_IF_ERROR(SendFrame(stream, auth, payload.data(), payload.size(), deadline));

  FrameHeader reply;
  LARDER_RETURN_IF_ERROR(RecvHeader(stream, &reply, deadline));
  if (reply.type == FrameType::kError) return RecvErrorFrame(stream, reply, deadline);
  if (reply.type != FrameType::kAuthOk) return DataLossError("bad auth reply from " + peer);
  LARDER_ASSIGN_OR_RETURN(std::string ok_payload, RecvAuthPayload(stream, reply, deadline));
  AuthMac server_mac;
  if (Status s = DecodeAuthOk(ok_payload, &server_mac); !s.ok()) {
    return PermissionDeniedError("peer " + peer +
                                 " did not prove the cluster token: " + s.message());
  }
  auto expected = TcpServerMac(config.token, binding);
  if (!DigestEqual(expected.data(), server_mac.data())) {
    return PermissionDeniedError("peer " + peer + " (claiming engine " + binding.server_engine_id +
                                 ") failed to prove the cluster token: wrong token, or not the "
                                 "engine this connection reached");
  }
  // The server proved the token as the engine it named: a server of another engine than the
  // segment's owner (a descriptor copied under another owner's name, or a relay answering for
  // another engine) serves nothing of that segment.
  if (!engine_id.empty() && binding.server_engine_id != engine_id) {
    return PermissionDeniedError("peer " + peer + " is engine " + binding.server_engine_id +
                                 ", not engine " + std::string(engine_id) +
                                 " that the segment's descriptor names as its owner");
  }
  return Status();
}

}  // namespace

Status SendFrame(TcpStream& stream, const FrameHeader& h, const void* payload, size_t len,
                 Deadline deadline) {
  uint8_t header[kFrameHeaderSize];
  EncodeHeader(h, header);
  iovec iov[2] = {{header, sizeof(header)}, {const_cast<void*>(payload), len}};
  return stream.SendAllV(iov, len ? 2 : 1, deadline);
}

Status RecvHeader(TcpStream& stream, FrameHeader* h, Deadline deadline) {
  uint8_t raw[kFrameHeaderSize];
  LARDER_RETURN_IF_ERROR(stream.RecvAll(raw, sizeof(raw), deadline));
  Status s = DecodeHeader(raw, h);
  if (!s.ok()) {
    return DataLossError("peer " + stream.peer() + " sent a malformed frame: " + s.message());
  }
  return Status();
}

// Reads the message of an error frame into `reported` (the error the peer sent; the stream is
// still in sync). Returns the stream's status: not OK when the connection broke meanwhile.
Status ReadErrorFrame(TcpStream& stream, const FrameHeader& h, Deadline deadline,
                      Status* reported) {
  if (h.length > kMaxControlPayload) {
    return DataLossError("oversized error frame from " + stream.peer());
  }
  std::string message(h.length, '\0');
  LARDER_RETURN_IF_ERROR(stream.RecvAll(message.data(), message.size(), deadline));
  *reported = ErrorFrameStatus(h.code, "peer " + stream.peer() + ": " + message);
  return Status();
}

// The error frame's Status, or the stream's when it broke: for exchanges that end either way.
Status RecvErrorFrame(TcpStream& stream, const FrameHeader& h, Deadline deadline) {
  Status reported;
  Status broken = ReadErrorFrame(stream, h, deadline, &reported);
  return broken.ok() ? reported : broken;
}

Result<std::shared_ptr<const TcpClientConfig>> TcpClientConfig::FromContext(
    const EngineContext& context) {
  auto config = std::make_shared<TcpClientConfig>();
  config->engine_id = context.engine_id;
  config->token = context.auth_token;
  if (!context.tls_ca_file.empty()) {
    LARDER_ASSIGN_OR_RETURN(config->tls, TlsContext::ForClient(context.tls_ca_file));
  }
  return std::shared_ptr<const TcpClientConfig>(std::move(config));
}

Result<TcpStream> ConnectAndAuthenticate(const HostPort& address, const TcpClientConfig& config,
                                         Deadline deadline, std::string_view engine_id) {
  std::string peer = address.ToString();
  auto conn = TcpConnect(address, deadline);
  if (!conn.ok()) {
    return Status(conn.status().code() == StatusCode::kDeadlineExceeded
                      ? StatusCode::kDeadlineExceeded
                      : StatusCode::kUnavailable,
                  "peer " + peer + " unreachable: " + conn.status().message());
  }
  // What the proof names as the endpoint this connection reached: the address actually connected
  // to, in the form the server compares with ("localhost" resolved).
  LARDER_ASSIGN_OR_RETURN(std::string dialed, SocketEndpoint(conn->get(), /*local=*/false));
  TcpStream stream(std::move(conn).value(), peer);
  FrameHeader hello;
  LARDER_RETURN_IF_ERROR(RecvHeader(stream, &hello, deadline));
  if (hello.type == FrameType::kError) return RecvErrorFrame(stream, hello, deadline);
  if (hello.type != FrameType::kHello) return DataLossError("peer " + peer + " did not greet");
  if ((hello.flags & ~(kFlagNeedAuth | kFlagTls)) != 0) {
    return DataLossError("hello from peer " + peer + " has unknown flags " +
                         std::to_string(hello.flags));
  }
  LARDER_ASSIGN_OR_RETURN(std::string payload, RecvAuthPayload(stream, hello, deadline));
  const bool need_auth = (hello.flags & kFlagNeedAuth) != 0;
  if (!need_auth && !payload.empty()) return DataLossError("bad hello from " + peer);

  if ((hello.flags & kFlagTls) != 0) {
    if (!config.tls) {
      return PermissionDeniedError("peer " + peer +
                                   " requires TLS; set LARDER_TLS_CA (or tls_ca_file) to the CA "
                                   "of the cluster's certificates");
    }
    LARDER_RETURN_IF_ERROR(stream.StartTls(*config.tls, deadline));
  } else if (config.tls) {
    return PermissionDeniedError("peer " + peer +
                                 " does not offer TLS, and this engine requires it (a CA is "
                                 "configured: LARDER_TLS_CA / tls_ca_file)");
  }
  if (need_auth) {
    LARDER_RETURN_IF_ERROR(ProveToken(stream, config, payload, dialed, engine_id, deadline));
  } else if (!config.token.empty()) {
    // A server without the token could be anyone: it would capture our writes and answer our
    // reads with bytes of its choosing.
    return PermissionDeniedError("peer " + peer +
                                 " does not prove the cluster token (its hello asks for no "
                                 "proof); refusing it as a data server");
  }
  return stream;
}

}  // namespace larder::transfer::wire
