// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Allocation of segment memory: anonymous mappings and sealed memfds, with optional 2 MiB huge
// pages. Every allocation is zero-filled and page-aligned.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "larder/memory_region.h"
#include "larder/status.h"

namespace larder {

inline constexpr size_t kHugePageSize = 2 * 1024 * 1024;

inline constexpr size_t kGiantPageSize = 1024 * 1024 * 1024;

// Bytes per page for `mode` (4 KiB for kOff; 2 MiB for kAuto).
size_t PageSizeOf(HugePages mode);

// Free and total hugetlb pages of `page_size` in the system pool (sysfs); {0, 0} when unknown.
struct HugePagePool {
  uint64_t free = 0;
  uint64_t total = 0;
};
HugePagePool ReadHugePagePool(size_t page_size);

// Anonymous private memory, sparse (MAP_NORESERVE for normal pages). With huge pages, kAuto falls
// back to normal pages; k2M and k1G fail as AllocateMemfd does.
Result<std::shared_ptr<MemoryRegion>> AllocateAnonymous(size_t size, HugePages huge_pages);

// A memfd of `size` bytes (rounded up to the page size), mapped MAP_SHARED and sealed against
// shrinking and growing so that peers' mappings can never SIGBUS. Normal-page memfds are sparse:
// memory is used only for bytes written, so `size` may exceed RAM. Huge-page memfds are reserved
// from the hugetlb pool when mapped: with k2M or k1G a pool that lacks the pages fails with
// ResourceExhausted saying how many are needed and free and which sysctl reserves them; kAuto
// then falls back to normal pages. InvalidArgument for size 0 or sizes past the address space.
Result<std::shared_ptr<MemoryRegion>> AllocateMemfd(const std::string& name, size_t size,
                                                    HugePages huge_pages);

// The memory this process can fill: the host's RAM, or less where its cgroup (v2 memory.max,
// v1 memory.limit_in_bytes) limits it. 0 when unknown.
uint64_t HostMemoryBytes();

// Largest segment this process can map (address space): 64 TiB.
inline constexpr uint64_t kMaxSegmentBytes = 64ull << 40;

// Rounds `size` up to a multiple of `alignment` (a power of two). Returns 0 on overflow.
size_t RoundUp(size_t size, size_t alignment);

}  // namespace larder
