// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The proofs of the control plane's authentication (proto/master.proto, "authentication"), shared
// by larder-master and its clients so that both compute the same bytes.
//
// Opening a session (two round trips, no clocks):
//   client -> master  Challenge                   master -> client  server nonce Ns (32 B)
//   client -> master  OpenSession{client_id, Nc, Ns, proof = ClientProof(token, ...),
//                                 admin_proof = AdminProof(admin token, ...) or empty}
//   master -> client  {session_id, proof = ServerProof(token, ...)}
// A client id of the engine form ("<host>/<pid>/<fingerprint>", common/engine_key.h) also needs the
// engine's public key and its signature of IdentityMessage(client_id, Nc, Ns) in OpenSession: the
// master checks that the key's fingerprint is the id's, so only that engine can open its session.
// Both sides then derive the session key SessionKey(token, client_id, Nc, Ns, session_id); it never
// travels. Every later call carries the session id, a sequence number (the master accepts each
// number once, within a window of recent ones) and CallMac(session key, method, sequence,
// serialized request): at the end of the request's bytes (EncodeTrailer) where the master's
// challenge offers it, else in the `larder-auth-bin` metadata entry. So a captured call cannot be
// replayed or altered, a session cannot be used for another client id than the one it was opened
// for, and a master that does not hold the token cannot pass a client's check of ServerProof.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace larder::control_auth {

inline constexpr size_t kNonceBytes = 32;
inline constexpr char kMetadataKey[] = "larder-auth-bin";  // "-bin": binary gRPC metadata
inline constexpr size_t kMetadataBytes = 8 + 8 + 32;

using Digest = std::array<uint8_t, 32>;

Digest ClientProof(std::string_view token, std::string_view client_id,
                   std::string_view client_nonce, std::string_view server_nonce);
Digest AdminProof(std::string_view admin_token, std::string_view client_id,
                  std::string_view client_nonce, std::string_view server_nonce);
Digest ServerProof(std::string_view token, std::string_view client_id,
                   std::string_view client_nonce, std::string_view server_nonce,
                   uint64_t session_id, bool admin);
// What an engine signs to open a session for its own id.
std::string IdentityMessage(std::string_view client_id, std::string_view client_nonce,
                            std::string_view server_nonce);
std::string SessionKey(std::string_view token, std::string_view client_id,
                       std::string_view client_nonce, std::string_view server_nonce,
                       uint64_t session_id);
// HMAC over the method's name, the sequence number and `body_hash`: SHA-256 of the serialized
// request (BodyHash), as it was sent.
Digest CallMac(std::string_view session_key, std::string_view method, uint64_t sequence,
               const Digest& body_hash);
// SHA-256 of a serialized request, given whole or in the pieces it arrived in.
Digest BodyHash(std::span<const std::string_view> pieces);
inline Digest BodyHash(std::string_view body) { return BodyHash(std::span(&body, 1)); }
// The metadata value: session id | sequence | mac.
std::string EncodeMetadata(uint64_t session_id, uint64_t sequence, const Digest& mac);
// False when `value` does not have the metadata's size.
bool DecodeMetadata(std::string_view value, uint64_t* session_id, uint64_t* sequence, Digest* mac);

// The proof carried in the request's bytes: the same metadata value as protobuf field
// kTrailerField (length-delimited), appended after the serialized request. A parser that does not
// know the field skips it; the proof covers the bytes before it. kTrailerBytes in all.
inline constexpr uint32_t kTrailerField = 536870911;  // the largest field number protobuf allows
inline constexpr size_t kTrailerBytes = 5 + 1 + kMetadataBytes;  // tag, length, value
// Writes the trailer into `out`, which holds kTrailerBytes.
void EncodeTrailer(uint64_t session_id, uint64_t sequence, const Digest& mac, uint8_t* out);
// Splits `bytes` into the request and its trailer's value (a metadata value). False when they do
// not end with a trailer.
bool SplitTrailer(std::string_view bytes, std::string_view* request, std::string_view* proof);

// Equality of two digests in constant time.
bool Equal(const Digest& a, std::string_view b);

}  // namespace larder::control_auth
