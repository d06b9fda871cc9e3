// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The mutual token proof of the tcp data protocol (tcp_frame.h has the exchange): the payloads of
// kHello, kAuth and kAuthOk, and the two MACs. Both MACs cover both nonces, both engine ids, the
// endpoint the client dialed and, under TLS, the session's exporter value, so a proof made on one
// connection is worthless on any other (a relay that forwards it is refused). Stateless functions;
// thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "larder/status.h"

namespace larder::transfer::wire {

inline constexpr size_t kAuthNonceBytes = 32;
inline constexpr size_t kAuthMacBytes = 32;
inline constexpr size_t kMaxEngineIdBytes = 256;
inline constexpr size_t kMaxEndpointBytes = 64;
// Largest kHello / kAuth / kAuthOk payload; either side refuses a larger one before reading it.
inline constexpr uint64_t kMaxAuthPayload = 1024;

using AuthNonce = std::array<uint8_t, kAuthNonceBytes>;
using AuthMac = std::array<uint8_t, kAuthMacBytes>;

// What one connection's proofs are bound to.
struct TcpAuthBinding {
  AuthNonce server_nonce{};
  AuthNonce client_nonce{};
  std::string server_engine_id;
  std::string dialed_endpoint;  // "ip:port" the client connected to (its getpeername)
  std::string client_engine_id;
  // TcpStream::ChannelBinding() of a TLS connection; empty without TLS (and then not in the MACs).
  std::string channel_binding;
};

// The client's proof: HMAC-SHA256 under `token` of MacInput("larder-tcp-client-v1") with the
// fields server nonce, client nonce, server engine id, dialed endpoint, client engine id (and the
// channel binding when not empty).
AuthMac TcpClientMac(std::string_view token, const TcpAuthBinding& binding);
// The server's proof: the same fields under the label "larder-tcp-server-v1".
AuthMac TcpServerMac(std::string_view token, const TcpAuthBinding& binding);

// kHello payload (with kFlagNeedAuth): the server nonce and the server's engine id.
std::string EncodeHello(const AuthNonce& server_nonce, std::string_view server_engine_id);
// InvalidArgument (naming the field) when a field is missing, of a bad size, or bytes trail.
Status DecodeHello(std::string_view payload, AuthNonce* server_nonce,
                   std::string* server_engine_id);

// kAuth payload: what the client adds to the binding, and its proof.
struct AuthRequest {
  AuthNonce client_nonce{};
  std::string client_engine_id;
  std::string dialed_endpoint;
  AuthMac mac{};
};
std::string EncodeAuth(const AuthRequest& request);
Status DecodeAuth(std::string_view payload, AuthRequest* request);

// kAuthOk payload: the server's proof.
std::string EncodeAuthOk(const AuthMac& mac);
Status DecodeAuthOk(std::string_view payload, AuthMac* mac);

}  // namespace larder::transfer::wire
