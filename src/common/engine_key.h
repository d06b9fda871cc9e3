// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// An engine's signing key (Ed25519, OpenSSL). An engine's id ends with the fingerprint of its
// public key ("<host>/<pid>/<fingerprint>"), so that a master session for that id can be opened
// only by the process that holds the private key: a client id is proven, not claimed, and a token
// holder cannot act for an engine that is away (a client not yet back after a master restart).
// docs/security.md, "Sessions".
#pragma once

#include <openssl/evp.h>

#include <memory>
#include <string>
#include <string_view>

namespace larder {

inline constexpr size_t kEngineKeyBytes = 32;        // an Ed25519 public key
inline constexpr size_t kEngineSignatureBytes = 64;  // an Ed25519 signature
inline constexpr size_t kEngineFingerprintDigits = 16;

// Thread-safe once made.
class EngineKey {
 public:
  // A fresh key pair. Aborts when OpenSSL cannot make one (its random source failed).
  static std::shared_ptr<const EngineKey> Generate();
  ~EngineKey();
  EngineKey(const EngineKey&) = delete;
  EngineKey& operator=(const EngineKey&) = delete;

  const std::string& public_key() const { return public_key_; }
  // EngineKeyFingerprint(public_key()).
  std::string fingerprint() const;
  // The signature (kEngineSignatureBytes) of `message`.
  std::string Sign(std::string_view message) const;

 private:
  explicit EngineKey(EVP_PKEY* key);
  EVP_PKEY* key_;
  std::string public_key_;
};

// kEngineFingerprintDigits lowercase hex digits of SHA-256(public_key).
std::string EngineKeyFingerprint(std::string_view public_key);
// Whether `signature` is `public_key`'s signature of `message` (false for malformed inputs).
bool VerifyEngineSignature(std::string_view public_key, std::string_view message,
                           std::string_view signature);
// The fingerprint an engine id claims: its last part when the id has the engine form
// "<host>/<pid>/<fingerprint>" (at least three parts, the last kEngineFingerprintDigits lowercase
// hex digits); empty for any other id (which claims no engine).
std::string_view ClaimedFingerprint(std::string_view engine_id);

}  // namespace larder
