// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "common/engine_key.h"

#include <openssl/sha.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace larder {

std::shared_ptr<const EngineKey> EngineKey::Generate() {
  EVP_PKEY* key = EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519");
  if (key == nullptr) {
    std::fprintf(stderr, "larder: OpenSSL cannot make an Ed25519 key\n");
    std::abort();
  }
  return std::shared_ptr<const EngineKey>(new EngineKey(key));
}

EngineKey::EngineKey(EVP_PKEY* key) : key_(key) {
  size_t length = kEngineKeyBytes;
  public_key_.resize(length);
  if (EVP_PKEY_get_raw_public_key(key_, reinterpret_cast<unsigned char*>(public_key_.data()),
                                  &length) != 1 ||
      length != kEngineKeyBytes) {
    std::fprintf(stderr, "larder: OpenSSL cannot export an Ed25519 public key\n");
    std::abort();
  }
}

EngineKey::~EngineKey() { EVP_PKEY_free(key_); }

std::string EngineKey::fingerprint() const { return EngineKeyFingerprint(public_key_); }

std::string EngineKey::Sign(std::string_view message) const {
  std::string signature(kEngineSignatureBytes, '\0');
  size_t length = signature.size();
  EVP_MD_CTX* context = EVP_MD_CTX_new();
  const bool signed_ok =
      context != nullptr && EVP_DigestSignInit(context, nullptr, nullptr, nullptr, key_) == 1 &&
      EVP_DigestSign(context, reinterpret_cast<unsigned char*>(signature.data()), &length,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) == 1;
  EVP_MD_CTX_free(context);
  if (!signed_ok) return {};
  signature.resize(length);
  return signature;
}

std::string EngineKeyFingerprint(std::string_view public_key) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(public_key.data()), public_key.size(), digest);
  std::string out;
  out.reserve(kEngineFingerprintDigits);
  for (size_t i = 0; i < kEngineFingerprintDigits / 2; ++i) {
    char hex[3];
    std::snprintf(hex, sizeof(hex), "%02x", digest[i]);
    out += hex;
  }
  return out;
}

bool VerifyEngineSignature(std::string_view public_key, std::string_view message,
                           std::string_view signature) {
  if (public_key.size() != kEngineKeyBytes || signature.size() != kEngineSignatureBytes) {
    return false;
  }
  EVP_PKEY* key = EVP_PKEY_new_raw_public_key(
      EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char*>(public_key.data()),
      public_key.size());
  if (key == nullptr) return false;
  EVP_MD_CTX* context = EVP_MD_CTX_new();
  const bool valid =
      context != nullptr && EVP_DigestVerifyInit(context, nullptr, nullptr, nullptr, key) == 1 &&
      EVP_DigestVerify(context, reinterpret_cast<const unsigned char*>(signature.data()),
                       signature.size(), reinterpret_cast<const unsigned char*>(message.data()),
                       message.size()) == 1;
  EVP_MD_CTX_free(context);
  EVP_PKEY_free(key);
  return valid;
}

std::string_view ClaimedFingerprint(std::string_view engine_id) {
  const size_t last = engine_id.rfind('/');
  if (last == std::string_view::npos || last == 0) return {};
  const size_t before = engine_id.rfind('/', last - 1);
  if (before == std::string_view::npos) return {};
  std::string_view fingerprint = engine_id.substr(last + 1);
  if (fingerprint.size() != kEngineFingerprintDigits) return {};
  const bool hex = std::all_of(fingerprint.begin(), fingerprint.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
  return hex ? fingerprint : std::string_view();
}

}  // namespace larder
