// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "common/engine_key.h"

#include <gtest/gtest.h>

#include <string>

namespace larder {
namespace {

TEST(EngineKeyTest, SignaturesVerifyOnlyForTheirKeyAndMessage) {
  auto key = EngineKey::Generate();
  auto other = EngineKey::Generate();
  ASSERT_EQ(key->public_key().size(), kEngineKeyBytes);
  EXPECT_NE(key->public_key(), other->public_key());
  const std::string signature = key->Sign("open session for a/1/ff");
  ASSERT_EQ(signature.size(), kEngineSignatureBytes);
  EXPECT_TRUE(VerifyEngineSignature(key->public_key(), "open session for a/1/ff", signature));
  EXPECT_FALSE(VerifyEngineSignature(key->public_key(), "open session for a/1/fe", signature));
  EXPECT_FALSE(VerifyEngineSignature(other->public_key(), "open session for a/1/ff", signature));
  std::string flipped = signature;
  flipped[10] ^= 1;
  EXPECT_FALSE(VerifyEngineSignature(key->public_key(), "open session for a/1/ff", flipped));
  // Malformed inputs are refused, not trusted.
  EXPECT_FALSE(VerifyEngineSignature("", "m", signature));
  EXPECT_FALSE(VerifyEngineSignature(key->public_key(), "m", ""));
  EXPECT_FALSE(VerifyEngineSignature(std::string(kEngineKeyBytes, '\0'), "m", signature));
}

TEST(EngineKeyTest, AnEngineIdClaimsItsKeysFingerprint) {
  auto key = EngineKey::Generate();
  const std::string fingerprint = key->fingerprint();
  ASSERT_EQ(fingerprint.size(), kEngineFingerprintDigits);
  EXPECT_EQ(fingerprint, EngineKeyFingerprint(key->public_key()));
  EXPECT_EQ(ClaimedFingerprint("boot-id-net4026531833/123/" + fingerprint), fingerprint);
  EXPECT_EQ(ClaimedFingerprint("a/b/c/" + fingerprint), fingerprint);
  // Ids of other forms claim nothing.
  EXPECT_EQ(ClaimedFingerprint("victim"), "");
  EXPECT_EQ(ClaimedFingerprint("client/0123456789abcdef"), "") << "two parts only";
  EXPECT_EQ(ClaimedFingerprint("h/1/0123456789ABCDEF"), "") << "upper case";
  EXPECT_EQ(ClaimedFingerprint("h/1/0123456789abcde"), "") << "15 digits";
  EXPECT_EQ(ClaimedFingerprint("h/1/0123456789abcdeg"), "") << "not hex";
  EXPECT_EQ(ClaimedFingerprint("/" + fingerprint), "");
}

}  // namespace
}  // namespace larder
