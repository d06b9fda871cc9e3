// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "common/memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

namespace larder {

MemoryRegion::MemoryRegion(void* base, size_t size, MemoryKind kind, int fd, bool huge_pages)
    : base_(base), size_(size), kind_(kind), fd_(fd), huge_pages_(huge_pages) {}

MemoryRegion::MemoryRegion(void* base, size_t size, MemoryKind kind, std::function<void()> release)
    : base_(base),
      size_(size),
      kind_(kind),
      fd_(-1),
      huge_pages_(false),
      release_(std::move(release)) {}

MemoryRegion::~MemoryRegion() {
  if (release_) {
    release_();
    return;
  }
  if (base_ != nullptr) munmap(base_, size_);
  if (fd_ >= 0) close(fd_);
}

size_t RoundUp(size_t size, size_t alignment) {
  if (size > SIZE_MAX - (alignment - 1)) return 0;
  return (size + alignment - 1) & ~(alignment - 1);
}

Result<std::shared_ptr<MemoryRegion>> AllocateAnonymous(size_t size, bool huge_pages) {
  if (size == 0) return InvalidArgumentError("cannot allocate 0 bytes");
  if (huge_pages) {
    size_t rounded = RoundUp(size, kHugePageSize);
    void* p = rounded ? mmap(nullptr, rounded, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0)
                      : MAP_FAILED;
    if (p != MAP_FAILED) {
      return std::make_shared<MemoryRegion>(p, rounded, MemoryKind::kAnonymous, -1, true);
    }
  }
  size_t rounded = RoundUp(size, static_cast<size_t>(sysconf(_SC_PAGESIZE)));
  if (rounded == 0) return InvalidArgumentError("allocation size overflows");
  void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return ErrnoToStatus(errno, "mmap anonymous " + std::to_string(rounded) + " bytes");
  }
  return std::make_shared<MemoryRegion>(p, rounded, MemoryKind::kAnonymous, -1, false);
}

namespace {

Result<std::shared_ptr<MemoryRegion>> MapMemfd(const std::string& name, size_t size, unsigned flags,
                                               bool huge) {
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING | flags);
  if (fd < 0) return ErrnoToStatus(errno, "memfd_create " + name);
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    Status s = ErrnoToStatus(errno, "ftruncate memfd " + name + " to " + std::to_string(size));
    close(fd);
    return s;
  }
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    Status s = ErrnoToStatus(errno, "seal memfd " + name);
    close(fd);
    return s;
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    Status s = ErrnoToStatus(errno, "mmap memfd " + name);
    close(fd);
    return s;
  }
  return std::make_shared<MemoryRegion>(p, size, MemoryKind::kMemfd, fd, huge);
}

}  // namespace

Result<std::shared_ptr<MemoryRegion>> AllocateMemfd(const std::string& name, size_t size,
                                                    bool huge_pages) {
  if (size == 0) return InvalidArgumentError("cannot allocate 0 bytes");
  if (huge_pages) {
    size_t rounded = RoundUp(size, kHugePageSize);
    if (rounded != 0) {
      auto region = MapMemfd(name, rounded, MFD_HUGETLB, true);
      if (region.ok()) return region;
    }
  }
  size_t rounded = RoundUp(size, static_cast<size_t>(sysconf(_SC_PAGESIZE)));
  if (rounded == 0) return InvalidArgumentError("allocation size overflows");
  return MapMemfd(name, rounded, 0, false);
}

}  // namespace larder
