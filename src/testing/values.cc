// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "testing/values.h"

#include <cstring>
#include <vector>

namespace larder::test {
namespace {

constexpr size_t kHeader = 16;

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void FillPattern(uint64_t seed, std::span<std::byte> out) {
  uint64_t state = seed;
  size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    uint64_t word = SplitMix(state);
    std::memcpy(out.data() + i, &word, 8);
  }
  if (i < out.size()) {
    uint64_t word = SplitMix(state);
    std::memcpy(out.data() + i, &word, out.size() - i);
  }
}

// Four independent lanes keep the multiplies from serializing.
uint64_t Checksum(std::span<const std::byte> data) {
  uint64_t lanes[4] = {1, 2, 3, 4};
  size_t i = 0;
  for (; i + 32 <= data.size(); i += 32) {
    for (int l = 0; l < 4; ++l) {
      uint64_t word;
      std::memcpy(&word, data.data() + i + 8 * l, 8);
      lanes[l] = (lanes[l] ^ word) * 0x100000001b3ull;
    }
  }
  uint64_t h = lanes[0] ^ (lanes[1] << 1) ^ (lanes[2] << 2) ^ (lanes[3] << 3);
  for (; i < data.size(); ++i) h = (h ^ static_cast<uint64_t>(data[i])) * 0x100000001b3ull;
  return h ^ data.size();
}

}  // namespace

uint64_t KeyHash(std::string_view key) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : key) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

void FillValue(std::string_view key, std::span<std::byte> out) {
  uint64_t hash = KeyHash(key);
  if (out.size() < kHeader) {
    FillPattern(hash, out);
    return;
  }
  FillPattern(hash, out.subspan(kHeader));
  uint64_t sum = Checksum(out.subspan(kHeader));
  std::memcpy(out.data(), &hash, 8);
  std::memcpy(out.data() + 8, &sum, 8);
}

bool VerifyValue(std::string_view key, std::span<const std::byte> value) {
  uint64_t hash = KeyHash(key);
  if (value.empty()) return true;
  if (value.size() < kHeader) {
    std::vector<std::byte> expected(value.size());
    FillPattern(hash, expected);
    return std::memcmp(expected.data(), value.data(), value.size()) == 0;
  }
  uint64_t stored_hash, stored_sum;
  std::memcpy(&stored_hash, value.data(), 8);
  std::memcpy(&stored_sum, value.data() + 8, 8);
  return stored_hash == hash && stored_sum == Checksum(value.subspan(kHeader));
}

}  // namespace larder::test
