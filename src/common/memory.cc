// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "common/memory.h"

#include <fcntl.h>
#include <linux/memfd.h>
#include <linux/mman.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>

#include "common/logging.h"

namespace larder {

std::string_view MemoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kMemfd:
      return "memfd";
    case MemoryKind::kDevice:
      return "device";
    case MemoryKind::kAnonymous:
      break;
  }
  return "anonymous";
}

Result<MemoryKind> ParseMemoryKind(std::string_view name) {
  for (MemoryKind kind : {MemoryKind::kAnonymous, MemoryKind::kMemfd, MemoryKind::kDevice}) {
    if (name == MemoryKindName(kind)) return kind;
  }
  return InvalidArgumentError("unknown memory_kind '" + std::string(name.substr(0, 64)) + "'");
}

MemoryRegion::MemoryRegion(void* base, size_t size, MemoryKind kind, int fd, size_t page_size)
    : base_(base), size_(size), kind_(kind), fd_(fd), page_size_(page_size) {}

MemoryRegion::MemoryRegion(void* base, size_t size, MemoryKind kind, std::function<void()> release)
    : base_(base),
      size_(size),
      kind_(kind),
      fd_(-1),
      page_size_(static_cast<size_t>(sysconf(_SC_PAGESIZE))),
      release_(std::move(release)) {}

MemoryRegion::~MemoryRegion() {
  if (release_) {
    release_();
    return;
  }
  if (base_ != nullptr) munmap(base_, size_);
  if (fd_ >= 0) close(fd_);
}

std::string_view HugePagesName(HugePages mode) {
  switch (mode) {
    case HugePages::k2M:
      return "2m";
    case HugePages::k1G:
      return "1g";
    case HugePages::kAuto:
      return "auto";
    case HugePages::kOff:
      break;
  }
  return "off";
}

Result<HugePages> ParseHugePages(std::string_view text) {
  std::string lower;
  for (char c : text) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "off" || lower == "0" || lower == "no" || lower == "false" || lower == "none") {
    return HugePages::kOff;
  }
  if (lower == "2m" || lower == "2mb" || lower == "2mib") return HugePages::k2M;
  if (lower == "1g" || lower == "1gb" || lower == "1gib") return HugePages::k1G;
  if (lower == "auto" || lower == "on" || lower == "1" || lower == "yes" || lower == "true") {
    return HugePages::kAuto;
  }
  return InvalidArgumentError("huge pages '" + std::string(text) +
                              "': expected off, 2m, 1g or auto");
}

size_t RoundUp(size_t size, size_t alignment) {
  if (size > SIZE_MAX - (alignment - 1)) return 0;
  return (size + alignment - 1) & ~(alignment - 1);
}

size_t PageSizeOf(HugePages mode) {
  switch (mode) {
    case HugePages::k2M:
    case HugePages::kAuto:
      return kHugePageSize;
    case HugePages::k1G:
      return kGiantPageSize;
    case HugePages::kOff:
      break;
  }
  return static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

HugePagePool ReadHugePagePool(size_t page_size) {
  std::string dir =
      "/sys/kernel/mm/hugepages/hugepages-" + std::to_string(page_size / 1024) + "kB/";
  HugePagePool pool;
  std::ifstream free_in(dir + "free_hugepages");
  std::ifstream total_in(dir + "nr_hugepages");
  if (free_in) free_in >> pool.free;
  if (total_in) total_in >> pool.total;
  return pool;
}

namespace {

// A cgroup limit file's value: "max" and unreadable are none.
std::optional<uint64_t> ReadLimit(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) {
    return std::nullopt;
  }
  return std::strtoull(text.c_str(), nullptr, 10);
}

}  // namespace

uint64_t HostMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  uint64_t bytes =
      pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
  auto lower = [&bytes](std::optional<uint64_t> limit) {
    if (limit && *limit > 0 && (bytes == 0 || *limit < bytes)) bytes = *limit;
  };
  // cgroup v2: "0::/path"; every level up to the root may limit.
  std::ifstream cgroups("/proc/self/cgroup");
  for (std::string line; std::getline(cgroups, line);) {
    if (line.rfind("0::", 0) == 0) {
      std::string path = line.substr(3);
      while (!path.empty() && path != "/") {
        lower(ReadLimit("/sys/fs/cgroup" + path + "/memory.max"));
        path = path.substr(0, path.rfind('/'));
      }
    } else if (size_t at = line.find(":memory:"); at != std::string::npos) {
      lower(ReadLimit("/sys/fs/cgroup/memory" + line.substr(at + 8) + "/memory.limit_in_bytes"));
    }
  }
  return bytes;
}

namespace {

size_t NormalPageSize() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

// Why a huge-page allocation of `bytes` failed, with what would make it work.
Status HugePageShortage(size_t bytes, size_t page_size, int error) {
  HugePagePool pool = ReadHugePagePool(page_size);
  uint64_t needed = bytes / page_size;
  std::string size_name = page_size == kGiantPageSize ? "1 GiB" : "2 MiB";
  std::string sysctl = page_size == kHugePageSize
                           ? "sysctl vm.nr_hugepages=" +
                                 std::to_string(pool.total + needed - std::min(needed, pool.free))
                           : "echo " +
                                 std::to_string(pool.total + needed - std::min(needed, pool.free)) +
                                 " > /sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages";
  return ResourceExhaustedError(
      "huge pages: " + std::to_string(bytes) + " bytes need " + std::to_string(needed) + " " +
      size_name + " pages; the pool has " + std::to_string(pool.free) + " free of " +
      std::to_string(pool.total) + " (" + std::strerror(error) + "). Reserve them with `" + sysctl +
      "` as root, or use huge pages 'auto' to fall back to normal pages");
}

Status CheckSize(size_t size) {
  if (size == 0) return InvalidArgumentError("cannot allocate 0 bytes");
  if (size > kMaxSegmentBytes) {
    return InvalidArgumentError("segment of " + std::to_string(size) +
                                " bytes is larger than the address space allows (at most " +
                                std::to_string(kMaxSegmentBytes) + " bytes)");
  }
  return Status();
}

Result<std::shared_ptr<MemoryRegion>> MapMemfd(const std::string& name, size_t size,
                                               size_t page_size) {
  unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;
  if (page_size == kHugePageSize) flags |= MFD_HUGETLB | MFD_HUGE_2MB;
  if (page_size == kGiantPageSize) flags |= MFD_HUGETLB | MFD_HUGE_1GB;
  const bool huge = page_size != NormalPageSize();
  int fd = memfd_create(name.c_str(), flags);
  if (fd < 0) {
    if (huge) return HugePageShortage(size, page_size, errno);
    return ErrnoToStatus(errno, "memfd_create " + name);
  }
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    Status s = ErrnoToStatus(errno, "ftruncate memfd " + name + " to " + std::to_string(size));
    close(fd);
    return s;
  }
  // hugetlbfs supports no shrink/grow seals; its size cannot change under a mapping anyway.
  int seals = huge ? F_SEAL_SEAL : F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  if (fcntl(fd, F_ADD_SEALS, seals) != 0) {
    Status s = ErrnoToStatus(errno, "seal memfd " + name);
    close(fd);
    return s;
  }
  // A hugetlb mapping reserves its pages here, so a short pool fails now rather than with a
  // SIGBUS on first touch.
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int error = errno;
    close(fd);
    if (huge) return HugePageShortage(size, page_size, error);
    return ErrnoToStatus(error, "mmap memfd " + name);
  }
  return std::make_shared<MemoryRegion>(p, size, MemoryKind::kMemfd, fd, page_size);
}

}  // namespace

Result<std::shared_ptr<MemoryRegion>> AllocateAnonymous(size_t size, HugePages huge_pages) {
  LARDER_RETURN_IF_ERROR(CheckSize(size));
  if (huge_pages != HugePages::kOff) {
    const size_t page = PageSizeOf(huge_pages);
    size_t rounded = RoundUp(size, page);
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB |
                (page == kGiantPageSize ? MAP_HUGE_1GB : MAP_HUGE_2MB);
    void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p != MAP_FAILED) {
      return std::make_shared<MemoryRegion>(p, rounded, MemoryKind::kAnonymous, -1, page);
    }
    if (huge_pages != HugePages::kAuto) return HugePageShortage(rounded, page, errno);
  }
  size_t rounded = RoundUp(size, NormalPageSize());
  void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return ErrnoToStatus(errno, "mmap anonymous " + std::to_string(rounded) + " bytes");
  }
  return std::make_shared<MemoryRegion>(p, rounded, MemoryKind::kAnonymous, -1, NormalPageSize());
}

Result<std::shared_ptr<MemoryRegion>> AllocateMemfd(const std::string& name, size_t size,
                                                    HugePages huge_pages) {
  LARDER_RETURN_IF_ERROR(CheckSize(size));
  if (huge_pages != HugePages::kOff) {
    const size_t page = PageSizeOf(huge_pages);
    auto region = MapMemfd(name, RoundUp(size, page), page);
    if (region.ok() || huge_pages != HugePages::kAuto) return region;
    Log().info("huge pages 'auto': {}; using normal pages", region.status().message());
  }
  return MapMemfd(name, RoundUp(size, NormalPageSize()), NormalPageSize());
}

}  // namespace larder
