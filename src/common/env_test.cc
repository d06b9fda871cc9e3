// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "common/env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <optional>
#include <string>

#include "transfer/testing/test_util.h"

namespace larder {
namespace {

constexpr uint64_t kKiB = 1ULL << 10;
constexpr uint64_t kMiB = 1ULL << 20;
constexpr uint64_t kGiB = 1ULL << 30;
constexpr uint64_t kTiB = 1ULL << 40;

using testutil::ScopedEnv;

uint64_t ParseOrDie(std::string_view text) {
  Result<uint64_t> parsed = ParseByteSize(text);
  EXPECT_TRUE(parsed.ok()) << text << ": " << parsed.status();
  return parsed.value_or(0);
}

TEST(ParseByteSizeTest, AcceptsBinaryMultiples) {
  EXPECT_EQ(ParseOrDie("4K"), 4 * kKiB);
  EXPECT_EQ(ParseOrDie("64K"), 64 * kKiB);
  EXPECT_EQ(ParseOrDie("4M"), 4 * kMiB);
  EXPECT_EQ(ParseOrDie("64M"), 64 * kMiB);
  EXPECT_EQ(ParseOrDie("1G"), kGiB);
  EXPECT_EQ(ParseOrDie("2T"), 2 * kTiB);
}

TEST(ParseByteSizeTest, SuffixesAreCaseInsensitiveAndMayBeSpelledOut) {
  EXPECT_EQ(ParseOrDie("2gb"), 2 * kGiB);
  EXPECT_EQ(ParseOrDie("2GB"), 2 * kGiB);
  EXPECT_EQ(ParseOrDie("64KiB"), 64 * kKiB);
  EXPECT_EQ(ParseOrDie("3mib"), 3 * kMiB);
  EXPECT_EQ(ParseOrDie("4k"), 4 * kKiB);
  EXPECT_EQ(ParseOrDie("100b"), 100u);
  EXPECT_EQ(ParseOrDie(" 8 M "), 8 * kMiB);
}

TEST(ParseByteSizeTest, PlainNumbersAreBytes) {
  EXPECT_EQ(ParseOrDie("4096"), 4096u);
  EXPECT_EQ(ParseOrDie("1"), 1u);
  EXPECT_EQ(ParseOrDie("18446744073709551615"), UINT64_MAX);
}

TEST(ParseByteSizeTest, RejectsBadSuffixes) {
  for (const char* text : {"4X", "4KK", "4 kilobytes", "4Kb5", "1.5G", "K", "-4K", "0x10"}) {
    Result<uint64_t> parsed = ParseByteSize(text);
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << text;
  }
}

TEST(ParseByteSizeTest, RejectsEmptyText) {
  EXPECT_EQ(ParseByteSize("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseByteSize("   ").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseByteSize("", /*allow_zero=*/true).status().code(), StatusCode::kInvalidArgument);
}

TEST(ParseByteSizeTest, ZeroIsRejectedUnlessAllowed) {
  EXPECT_EQ(ParseByteSize("0").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseByteSize("0K").status().code(), StatusCode::kInvalidArgument);
  Result<uint64_t> zero = ParseByteSize("0", /*allow_zero=*/true);
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_EQ(*zero, 0u);
  Result<uint64_t> zero_k = ParseByteSize("0K", /*allow_zero=*/true);
  ASSERT_TRUE(zero_k.ok()) << zero_k.status();
  EXPECT_EQ(*zero_k, 0u);
}

TEST(ParseByteSizeTest, RejectsOverflow) {
  // More than UINT64_MAX as a plain number.
  EXPECT_EQ(ParseByteSize("99999999999999999999").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseByteSize("18446744073709551616").status().code(), StatusCode::kInvalidArgument);
  // 2^34 TiB = 2^74 bytes: the digits fit, the multiplication does not.
  EXPECT_EQ(ParseByteSize("17179869184T").status().code(), StatusCode::kInvalidArgument);
  // The largest multiple that still fits is accepted.
  EXPECT_EQ(ParseOrDie("16777215T"), 16777215ULL * kTiB);
  EXPECT_EQ(ParseByteSize("16777216T").status().code(), StatusCode::kInvalidArgument);
}

TEST(FormatByteSizeTest, UsesTheLargestExactUnit) {
  EXPECT_EQ(FormatByteSize(4 * kKiB), "4K");
  EXPECT_EQ(FormatByteSize(64 * kKiB), "64K");
  EXPECT_EQ(FormatByteSize(4 * kMiB), "4M");
  EXPECT_EQ(FormatByteSize(kGiB), "1G");
  EXPECT_EQ(FormatByteSize(3 * kTiB), "3T");
  EXPECT_EQ(FormatByteSize(1536 * kKiB), "1536K");  // 1.5 MiB is not a whole number of MiB
}

TEST(FormatReadableBytesTest, OneDecimalAboveOneKiB) {
  EXPECT_EQ(FormatReadableBytes(0), "0 B");
  EXPECT_EQ(FormatReadableBytes(512), "512 B");
  EXPECT_EQ(FormatReadableBytes(1023), "1023 B");
  EXPECT_EQ(FormatReadableBytes(8 * kKiB), "8.0 KiB");
  EXPECT_EQ(FormatReadableBytes(1536 * kKiB), "1.5 MiB");
  EXPECT_EQ(FormatReadableBytes(3.0 * kTiB), "3.0 TiB");
  EXPECT_EQ(FormatReadableBytes(2048.0 * kTiB), "2.0 PiB");
  EXPECT_EQ(FormatReadableBytes(4096.0 * 1024 * kTiB), "4096.0 PiB");  // no unit above PiB
}

TEST(FormatByteSizeTest, FallsBackToBytes) {
  EXPECT_EQ(FormatByteSize(0), "0");
  EXPECT_EQ(FormatByteSize(1), "1");
  EXPECT_EQ(FormatByteSize(4097), "4097");
  EXPECT_EQ(FormatByteSize(1023), "1023");
}

TEST(FormatByteSizeTest, RoundTripsThroughParse) {
  for (uint64_t bytes :
       std::initializer_list<uint64_t>{1, 4096, 4097, 64 * kKiB, 5 * kMiB, 7 * kGiB, 2 * kTiB}) {
    EXPECT_EQ(ParseOrDie(FormatByteSize(bytes)), bytes);
  }
}

std::string KernelBootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

TEST(DefaultHostIdTest, HonoursLarderHostId) {
  ScopedEnv env("LARDER_HOST_ID", "rack7-node3");
  EXPECT_EQ(DefaultHostId(), "rack7-node3");
}

TEST(DefaultHostIdTest, UsesTheKernelBootIdWhenUnset) {
  std::string boot_id = KernelBootId();
  if (boot_id.empty()) GTEST_SKIP() << "no /proc/sys/kernel/random/boot_id here";
  ScopedEnv env("LARDER_HOST_ID", std::nullopt);
  EXPECT_EQ(DefaultHostId(), boot_id + "-net" + std::to_string(NetworkNamespaceId()));
}

TEST(DefaultHostIdTest, IncludesTheNetworkNamespace) {
  ASSERT_NE(NetworkNamespaceId(), 0u) << "no /proc/self/ns/net";
  ScopedEnv env("LARDER_HOST_ID", std::nullopt);
  std::string id = DefaultHostId();
  EXPECT_TRUE(id.ends_with("-net" + std::to_string(NetworkNamespaceId()))) << id;
}

TEST(DefaultHostIdTest, EmptyVariableCountsAsUnset) {
  std::string boot_id = KernelBootId();
  if (boot_id.empty()) GTEST_SKIP() << "no /proc/sys/kernel/random/boot_id here";
  ScopedEnv env("LARDER_HOST_ID", "");
  EXPECT_EQ(DefaultHostId(), boot_id + "-net" + std::to_string(NetworkNamespaceId()));
}

TEST(GetEnvTest, ReturnsValueOrEmpty) {
  {
    ScopedEnv env("LARDER_TEST_GETENV", "value");
    EXPECT_EQ(GetEnv("LARDER_TEST_GETENV"), "value");
  }
  EXPECT_EQ(GetEnv("LARDER_TEST_GETENV"), "");
}

TEST(RandomU64Test, ValuesDiffer) {
  // Two equal 64-bit draws in a row would mean the source is broken, not unlucky.
  EXPECT_NE(RandomU64(), RandomU64());
}

TEST(EnvTest, ParseDurationAcceptsUnits) {
  EXPECT_EQ(*ParseDuration("250ms"), std::chrono::milliseconds(250));
  EXPECT_EQ(*ParseDuration("5s"), std::chrono::milliseconds(5000));
  EXPECT_EQ(*ParseDuration("2m"), std::chrono::milliseconds(120000));
  EXPECT_EQ(*ParseDuration("1h"), std::chrono::milliseconds(3600000));
  EXPECT_EQ(*ParseDuration("40"), std::chrono::milliseconds(40));
  for (const char* bad : {"", "s", "5x", "-1s", "1.5s", "9999999999999s"}) {
    EXPECT_EQ(ParseDuration(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace larder
