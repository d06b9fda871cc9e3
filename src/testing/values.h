// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Self-checking values for store benchmarks and tests. A value of key K is
//   [8 bytes: hash of K][8 bytes: checksum of the body][body: a pattern seeded by the hash of K]
// so a reader can tell a value that is intact and belongs to K from one that is torn, corrupted or
// another object's. Values shorter than 16 bytes are the pattern alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace larder::test {

uint64_t KeyHash(std::string_view key);

// Fills `out` with the value of `key` (any size).
void FillValue(std::string_view key, std::span<std::byte> out);

// True when `value` is the intact value of `key` of that size.
bool VerifyValue(std::string_view key, std::span<const std::byte> value);

}  // namespace larder::test
