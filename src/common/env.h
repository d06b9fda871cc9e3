// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Environment and configuration helpers shared by every component.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "larder/status.h"

namespace larder {

// The value of environment variable `name`, or "" when unset.
std::string GetEnv(const char* name);

// Parses a byte size: "4096", "4K", "64KiB", "4M", "1G", "2gb" (binary multiples,
// case-insensitive). InvalidArgument for anything else, for zero when !allow_zero, and on overflow.
Result<uint64_t> ParseByteSize(std::string_view text, bool allow_zero = false);

// Parses a duration: "250ms", "5s", "2m", "1h"; a bare number is milliseconds. InvalidArgument
// for anything else and on overflow.
Result<std::chrono::milliseconds> ParseDuration(std::string_view text);

// "4K", "64K", "4M", "1G" when exact, else bytes.
std::string FormatByteSize(uint64_t bytes);

// "512 B", "8.0 KiB", "2.0 MiB", ...: sizes as the master's status page and larder-ctl write them
// (whole bytes below 1 KiB, else one decimal).
std::string FormatReadableBytes(double bytes);

// "0x1f4000".
std::string FormatHex(uint64_t value);

// This machine's identity: LARDER_HOST_ID when set and non-empty, else the kernel boot id
// (/proc/sys/kernel/random/boot_id) and the network namespace, "<boot id>-net<inode>": a process
// in another network namespace cannot reach this one's abstract Unix sockets, so it is another
// host. Never derived from hostnames or addresses.
std::string DefaultHostId();

// The inode of this process's network namespace (/proc/self/ns/net), or 0 when unknown.
uint64_t NetworkNamespaceId();

// Random 64-bit value from the OS.
uint64_t RandomU64();

}  // namespace larder
