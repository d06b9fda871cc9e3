// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Memory that Larder owns for a segment (MemoryRegion), what kind it is and its page size: the
// ground floor that the engine's API (transfer_engine.h) and the allocators below it share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>

#include "larder/export.h"
#include "larder/status.h"

namespace larder {

// How a segment's memory was obtained; decides which routes can reach it.
enum class MemoryKind : uint8_t {
  kAnonymous = 0,  // private memory of the owner (malloc, mmap): local and tcp only.
  kMemfd = 1,      // a sealed memfd: also mappable by same-host peers (shm).
  kDevice = 2,     // device memory from the device transport's native allocator: device route only.
};

LARDER_EXPORT std::string_view MemoryKindName(MemoryKind kind);
// The kind MemoryKindName names. Errors: InvalidArgument (no such kind).
LARDER_EXPORT Result<MemoryKind> ParseMemoryKind(std::string_view name);

// The page size of segment memory. kOff: normal pages. k2M, k1G: hugetlb pages of that size, or
// fail with ResourceExhausted (saying how many are needed and free) when the pool lacks them.
// kAuto: 2 MiB pages when the pool has enough, else normal pages.
enum class HugePages : uint8_t { kOff = 0, k2M = 1, k1G = 2, kAuto = 3 };

// "off", "2m", "1g", "auto".
LARDER_EXPORT std::string_view HugePagesName(HugePages mode);
// Parses "off" | "2m" | "1g" | "auto" (case-insensitive; "0"/"no"/"false" mean off).
LARDER_EXPORT Result<HugePages> ParseHugePages(std::string_view text);

// Memory owned by Larder and freed when the last reference goes away (munmap, close).
class LARDER_EXPORT MemoryRegion {
 public:
  // Takes ownership of a mapping (munmap) and of `fd` (close, when >= 0). `page_size` is the
  // page size backing it (4 KiB, or a huge page size).
  MemoryRegion(void* base, size_t size, MemoryKind kind, int fd, size_t page_size);
  // Memory whose owner frees it with `release` (e.g. a device allocator). `release` keeps whatever
  // it needs alive (the native library included), so the region may outlive its engine.
  MemoryRegion(void* base, size_t size, MemoryKind kind, std::function<void()> release);
  ~MemoryRegion();
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  void* data() const { return base_; }
  size_t size() const { return size_; }
  MemoryKind kind() const { return kind_; }
  // The memfd backing the region, or -1. Owned by the region.
  int fd() const { return fd_; }
  size_t page_size() const { return page_size_; }
  bool huge_pages() const { return page_size_ > 4096; }

 private:
  void* base_;
  size_t size_;
  MemoryKind kind_;
  int fd_;
  size_t page_size_;
  std::function<void()> release_;
};

}  // namespace larder
