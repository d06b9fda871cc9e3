// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "common/control_auth.h"

#include <cstring>

#include "common/net.h"

namespace larder::control_auth {

namespace {

Digest OpenProof(std::string_view label, std::string_view key, std::string_view client_id,
                 std::string_view client_nonce, std::string_view server_nonce) {
  return MacInput(label).Add(client_id).Add(client_nonce).Add(server_nonce).Sign(key);
}

}  // namespace

std::string IdentityMessage(std::string_view client_id, std::string_view client_nonce,
                            std::string_view server_nonce) {
  return MacInput("larder-session-identity-v1")
      .Add(client_id)
      .Add(client_nonce)
      .Add(server_nonce)
      .bytes();
}

Digest ClientProof(std::string_view token, std::string_view client_id,
                   std::string_view client_nonce, std::string_view server_nonce) {
  return OpenProof("larder-session-client-v1", token, client_id, client_nonce, server_nonce);
}

Digest AdminProof(std::string_view admin_token, std::string_view client_id,
                  std::string_view client_nonce, std::string_view server_nonce) {
  return OpenProof("larder-session-admin-v1", admin_token, client_id, client_nonce, server_nonce);
}

Digest ServerProof(std::string_view token, std::string_view client_id,
                   std::string_view client_nonce, std::string_view server_nonce,
                   uint64_t session_id, bool admin) {
  return MacInput("larder-session-master-v1")
      .Add(client_id)
      .Add(client_nonce)
      .Add(server_nonce)
      .Add(session_id)
      .Add(uint64_t{admin ? 1u : 0u})
      .Sign(token);
}

std::string SessionKey(std::string_view token, std::string_view client_id,
                       std::string_view client_nonce, std::string_view server_nonce,
                       uint64_t session_id) {
  Digest key = MacInput("larder-session-key-v1")
                   .Add(client_id)
                   .Add(client_nonce)
                   .Add(server_nonce)
                   .Add(session_id)
                   .Sign(token);
  return std::string(reinterpret_cast<const char*>(key.data()), key.size());
}

Digest CallMac(std::string_view session_key, std::string_view method, uint64_t sequence,
               const Digest& body_hash) {
  return MacInput("larder-call-v1")
      .Add(method)
      .Add(sequence)
      .Add(body_hash.data(), body_hash.size())
      .Sign(session_key);
}

Digest BodyHash(std::span<const std::string_view> pieces) { return Sha256(pieces); }

std::string EncodeMetadata(uint64_t session_id, uint64_t sequence, const Digest& mac) {
  std::string out(kMetadataBytes, '\0');
  std::memcpy(out.data(), &session_id, 8);
  std::memcpy(out.data() + 8, &sequence, 8);
  std::memcpy(out.data() + 16, mac.data(), mac.size());
  return out;
}

bool DecodeMetadata(std::string_view value, uint64_t* session_id, uint64_t* sequence, Digest* mac) {
  if (value.size() != kMetadataBytes) return false;
  std::memcpy(session_id, value.data(), 8);
  std::memcpy(sequence, value.data() + 8, 8);
  std::memcpy(mac->data(), value.data() + 16, mac->size());
  return true;
}

namespace {

// The trailer's tag and length: kTrailerField with wire type 2 as a varint, then kMetadataBytes.
constexpr uint8_t kTrailerHead[6] = {0xfa, 0xff, 0xff, 0xff, 0x0f, kMetadataBytes};
static_assert((uint64_t{kTrailerField} << 3 | 2) == 0xfffffffa && kMetadataBytes < 128);

}  // namespace

void EncodeTrailer(uint64_t session_id, uint64_t sequence, const Digest& mac, uint8_t* out) {
  std::memcpy(out, kTrailerHead, sizeof(kTrailerHead));
  out += sizeof(kTrailerHead);
  std::memcpy(out, &session_id, 8);
  std::memcpy(out + 8, &sequence, 8);
  std::memcpy(out + 16, mac.data(), mac.size());
}

bool SplitTrailer(std::string_view bytes, std::string_view* request, std::string_view* proof) {
  if (bytes.size() < kTrailerBytes) return false;
  const size_t at = bytes.size() - kTrailerBytes;
  if (std::memcmp(bytes.data() + at, kTrailerHead, sizeof(kTrailerHead)) != 0) return false;
  *request = bytes.substr(0, at);
  *proof = bytes.substr(at + sizeof(kTrailerHead));
  return true;
}

bool Equal(const Digest& a, std::string_view b) {
  return b.size() == a.size() && DigestEqual(a.data(), reinterpret_cast<const uint8_t*>(b.data()));
}

}  // namespace larder::control_auth
