// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Allocation of segment memory: anonymous mappings and sealed memfds, with optional 2 MiB huge
// pages. Every allocation is zero-filled and page-aligned.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "larder/status.h"
#include "larder/transfer_engine.h"

namespace larder {

inline constexpr size_t kHugePageSize = 2 * 1024 * 1024;

// Anonymous private memory. With `huge_pages`, tries MAP_HUGETLB first and falls back to normal
// pages (the region reports which it got).
Result<std::shared_ptr<MemoryRegion>> AllocateAnonymous(size_t size, bool huge_pages);

// A memfd of `size` bytes (rounded up to the page size), mapped MAP_SHARED and sealed against
// shrinking and growing so that peers' mappings can never SIGBUS. With `huge_pages`, tries
// MFD_HUGETLB first and falls back to normal pages.
Result<std::shared_ptr<MemoryRegion>> AllocateMemfd(const std::string& name, size_t size,
                                                    bool huge_pages);

// Rounds `size` up to a multiple of `alignment` (a power of two). Returns 0 on overflow.
size_t RoundUp(size_t size, size_t alignment);

}  // namespace larder
