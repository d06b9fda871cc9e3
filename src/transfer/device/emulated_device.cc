// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/device/emulated_device.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>

#include "common/env.h"
#include "common/net.h"
#include "transfer/device/handle_codec.h"

namespace larder::transfer {
namespace {

thread_local int current_device = -1;

// The name of every allocation's memfd: this prefix and the allocation's tag.
constexpr std::string_view kMemfdPrefix = "larder-emulated-device-";
constexpr std::string_view kHandleMagic = "LDEVH1";
constexpr size_t kTagBytes = 16;  // random bytes, 32 hex digits in the name

using handle_codec::Put;
using handle_codec::PutString;
using handle_codec::Take;
using handle_codec::TakeString;

// What a handle says (see EncodeHandle for its layout).
struct Handle {
  std::string host_id;
  int32_t pid = 0;
  int32_t fd = -1;
  int32_t device = -1;
  uint64_t size = 0;
  std::string tag;
};

// magic | u16 host id length | host id | i32 pid | i32 fd | i32 device | u64 size | u8 tag
// length | tag (host byte order: a handle never leaves its host).
std::string EncodeHandle(const Handle& handle) {
  std::string out(kHandleMagic);
  PutString(&out, handle.host_id);
  Put(&out, handle.pid);
  Put(&out, handle.fd);
  Put(&out, handle.device);
  Put(&out, handle.size);
  Put(&out, static_cast<uint8_t>(handle.tag.size()));
  out += handle.tag;
  return out;
}

Result<Handle> DecodeHandle(std::string_view in) {
  auto malformed = [](const char* what) {
    return InvalidArgumentError(std::string("malformed device memory handle: ") + what);
  };
  if (in.size() > kMaxDeviceHandleBytes) return malformed("longer than any handle");
  if (!in.starts_with(kHandleMagic)) return malformed("not an emulated device's handle");
  in.remove_prefix(kHandleMagic.size());
  Handle handle;
  if (!TakeString(&in, &handle.host_id)) return malformed("truncated host id");
  uint8_t tag_size = 0;
  if (!Take(&in, &handle.pid) || !Take(&in, &handle.fd) || !Take(&in, &handle.device) ||
      !Take(&in, &handle.size) || !Take(&in, &tag_size)) {
    return malformed("truncated");
  }
  if (in.size() != tag_size || tag_size != 2 * kTagBytes) return malformed("bad tag");
  handle.tag = std::string(in);
  if (handle.pid <= 0 || handle.fd < 0 || handle.device < 0 || handle.size == 0) {
    return malformed("bad process, fd, device or size");
  }
  for (char c : handle.tag) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return malformed("bad tag");
  }
  return handle;
}

std::string RandomTag() {
  uint8_t bytes[kTagBytes];
  RandomBytes(bytes, sizeof(bytes));
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string tag;
  for (uint8_t b : bytes) {
    tag += kDigits[b >> 4];
    tag += kDigits[b & 15];
  }
  return tag;
}

// Whether the link at `path` (a /proc/<pid>/fd/<fd>) is the memfd of the allocation `tag`.
bool IsMemfdOf(const std::string& path, std::string_view tag) {
  char target[256];
  ssize_t n = readlink(path.c_str(), target, sizeof(target) - 1);
  if (n <= 0) return false;
  std::string_view name(target, static_cast<size_t>(n));
  // "/memfd:<name> (deleted)"
  constexpr std::string_view kMemfd = "/memfd:";
  if (!name.starts_with(kMemfd)) return false;
  name.remove_prefix(kMemfd.size());
  if (!name.starts_with(kMemfdPrefix)) return false;
  name.remove_prefix(kMemfdPrefix.size());
  return name.starts_with(tag) && (name.size() == tag.size() || name[tag.size()] == ' ');
}

std::string ProcFd(int pid, int fd) {
  return "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
}

// Maps `length` bytes of `fd` (shared) at an address aligned to `alignment`, as device memory is.
Result<void*> MapAligned(int fd, uint64_t length, uint64_t alignment) {
  const uint64_t span = length + alignment;
  void* raw = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return ResourceExhaustedError("emulated device memory exhausted");
  const auto start = reinterpret_cast<uint64_t>(raw);
  const uint64_t aligned = (start + alignment - 1) / alignment * alignment;
  void* mapped = mmap(reinterpret_cast<void*>(aligned), length, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_FIXED, fd, 0);
  if (mapped == MAP_FAILED) {
    const int err = errno;
    munmap(raw, span);
    return ErrnoToStatus(err, "mapping emulated device memory");
  }
  if (aligned > start) munmap(raw, aligned - start);
  const uint64_t tail = start + span - (aligned + length);
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + length), tail);
  return mapped;
}

}  // namespace

Result<std::vector<int>> ParsePeerGroups(std::string_view spec, int device_count) {
  if (spec.empty() || spec == "all") return std::vector<int>();
  std::vector<int> groups(static_cast<size_t>(device_count), -1);
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("peer groups '" + std::string(spec) + "': " + why +
                                " (expected e.g. 0-3,4-7)");
  };
  auto number = [&](std::string_view text, int* out) {
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
    return ec == std::errc() && end == text.data() + text.size() && *out >= 0 &&
           *out < device_count;
  };
  int group = 0;
  while (!spec.empty()) {
    const size_t comma = spec.find(',');
    std::string_view item = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
    int first = 0, last = 0;
    const size_t dash = item.find('-');
    if (!number(item.substr(0, dash), &first) ||
        !number(dash == std::string_view::npos ? item : item.substr(dash + 1), &last) ||
        last < first) {
      return bad("'" + std::string(item) + "' is no device or range of the " +
                 std::to_string(device_count));
    }
    for (int d = first; d <= last; ++d) {
      if (groups[static_cast<size_t>(d)] != -1) {
        return bad("device " + std::to_string(d) + " is in two groups");
      }
      groups[static_cast<size_t>(d)] = group;
    }
    ++group;
  }
  return groups;
}

EmulatedDevice::EmulatedDevice(EmulatedDeviceOptions options)
    : options_(std::move(options)),
      host_id_(options_.host_id.empty() ? DefaultHostId() : options_.host_id) {
  registration_fault_at_ = options_.fail_registration;
  copy_fault_at_ = options_.fail_copy;
}

EmulatedDevice::~EmulatedDevice() {
  MutexLock lock(mu_);
  for (auto& [begin, allocation] : allocations_) {
    munmap(reinterpret_cast<void*>(begin), allocation.length);
    close(allocation.fd);
  }
  for (auto& [base, import] : imports_) munmap(reinterpret_cast<void*>(base), import.length);
}

bool EmulatedDevice::HasPeerAccess(int from, int to) const {
  if (from == to) return true;
  const auto& groups = options_.peer_groups;
  if (groups.empty()) return true;
  if (from < 0 || to < 0 || static_cast<size_t>(from) >= groups.size() ||
      static_cast<size_t>(to) >= groups.size()) {
    return false;
  }
  return groups[static_cast<size_t>(from)] >= 0 &&
         groups[static_cast<size_t>(from)] == groups[static_cast<size_t>(to)];
}

Status EmulatedDevice::SetCurrentDevice(int device) {
  if (device == -1) {
    current_device = -1;  // back to a thread that never chose a device
    return Status();
  }
  if (device < 0 || device >= options_.device_count) {
    return InvalidArgumentError("no device " + std::to_string(device) + " (emulating " +
                                std::to_string(options_.device_count) + ")");
  }
  current_device = device;
  return Status();
}

Result<int> EmulatedDevice::CurrentDevice() const {
  if (current_device < 0) return FailedPreconditionError("no current device on this thread");
  return current_device;
}

Status EmulatedDevice::Init() {
  if (current_device < 0) {
    return FailedPreconditionError("native init on a thread with no current device");
  }
  MutexLock lock(mu_);
  if (init_device_ >= 0) {
    return FailedPreconditionError("native library already initialized on device " +
                                   std::to_string(init_device_));
  }
  init_device_ = current_device;
  return Status();
}

int EmulatedDevice::init_device() const {
  MutexLock lock(mu_);
  return init_device_;
}

Status EmulatedDevice::CheckBound(const char* call) const {
  if (init_device_ < 0) {
    return FailedPreconditionError(std::string(call) + " before native init");
  }
  if (current_device < 0) {
    return FailedPreconditionError(std::string(call) + " from a thread with no current device");
  }
  if (current_device != init_device_) {
    return FailedPreconditionError(
        std::string(call) + " from a thread bound to device " + std::to_string(current_device) +
        "; the library was initialized on device " + std::to_string(init_device_));
  }
  return Status();
}

Result<void*> EmulatedDevice::Allocate(uint64_t size) {
  MutexLock lock(mu_);
  LARDER_RETURN_IF_ERROR(CheckBound("alloc"));
  if (size == 0) return InvalidArgumentError("alloc of 0 bytes");
  const uint64_t g = options_.granularity;
  const uint64_t rounded = (size + g - 1) / g * g;
  // A memfd, so that another process can map it (ExportAllocation).
  Allocation allocation;
  allocation.length = rounded;
  allocation.tag = RandomTag();
  const std::string name = std::string(kMemfdPrefix) + allocation.tag;
  allocation.fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (allocation.fd < 0) return ErrnoToStatus(errno, "emulated device memory (memfd_create)");
  if (ftruncate(allocation.fd, static_cast<off_t>(rounded)) != 0) {
    const int err = errno;
    close(allocation.fd);
    return err == ENOMEM || err == ENOSPC
               ? ResourceExhaustedError("emulated device memory exhausted")
               : ErrnoToStatus(err, "emulated device memory (ftruncate)");
  }
  Result<void*> mapped = MapAligned(allocation.fd, rounded, g);
  if (!mapped.ok()) {
    close(allocation.fd);
    return mapped.status();
  }
  allocations_[reinterpret_cast<uint64_t>(*mapped)] = std::move(allocation);
  return *mapped;
}

Status EmulatedDevice::Free(void* ptr) {
  MutexLock lock(mu_);
  LARDER_RETURN_IF_ERROR(CheckBound("free"));
  auto it = allocations_.find(reinterpret_cast<uint64_t>(ptr));
  if (it == allocations_.end()) return InvalidArgumentError("free of unknown device pointer");
  munmap(ptr, it->second.length);
  close(it->second.fd);  // importers' mappings stay, but their handles no longer open
  allocations_.erase(it);
  return Status();
}

size_t EmulatedDevice::live_allocations() const {
  MutexLock lock(mu_);
  return allocations_.size();
}

Status EmulatedDevice::Register(uint64_t begin, uint64_t length) {
  MutexLock lock(mu_);
  LARDER_RETURN_IF_ERROR(CheckBound("register"));
  uint64_t call = register_calls_.fetch_add(1) + 1;
  const uint64_t g = options_.granularity;
  if (length == 0 || begin % g != 0 || length % g != 0 || begin + length < begin) {
    return InvalidArgumentError("registration [" + FormatHex(begin) + ", +" + FormatHex(length) +
                                ") is not aligned to " + FormatHex(g));
  }
  auto next = registrations_.lower_bound(begin);
  if (next != registrations_.end() && next->first < begin + length) {
    return AlreadyExistsError("registration [" + FormatHex(begin) + ", +" + FormatHex(length) +
                              ") overlaps the one at " + FormatHex(next->first));
  }
  if (next != registrations_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > begin) {
      return AlreadyExistsError("registration [" + FormatHex(begin) + ", +" + FormatHex(length) +
                                ") overlaps the one at " + FormatHex(prev->first));
    }
  }
  if (registration_fault_at_ != 0 && call == registration_fault_at_) {
    registration_fault_at_ = 0;
    return UnavailableError("injected native registration failure (call " + std::to_string(call) +
                            ")");
  }
  registrations_[begin] = length;
  return Status();
}

Status EmulatedDevice::Deregister(uint64_t begin) {
  MutexLock lock(mu_);
  LARDER_RETURN_IF_ERROR(CheckBound("deregister"));
  if (registrations_.erase(begin) == 0)
    return NotFoundError("no registration at " + FormatHex(begin));
  return Status();
}

bool EmulatedDevice::IsDeviceMemory(const void* ptr, uint64_t length) const {
  MutexLock lock(mu_);
  return TouchesDeviceMemory(reinterpret_cast<uint64_t>(ptr), length);
}

bool EmulatedDevice::TouchesDeviceMemory(uint64_t p, uint64_t length) const {
  // Any overlap with an allocation or an import counts: a host range may not run into device
  // memory either.
  auto touches = [&](const auto& ranges) {
    auto it = ranges.upper_bound(p);
    if (it != ranges.end() && it->first < p + length) return true;
    if (it == ranges.begin()) return false;
    --it;
    return p < it->first + it->second.length;
  };
  return touches(allocations_) || touches(imports_);
}

Status EmulatedDevice::CheckCopySide(const char* side, uint64_t p, uint64_t length) const {
  auto import = imports_.upper_bound(p);
  if (import != imports_.begin()) {
    --import;
    const uint64_t base = import->first;
    const Import& mapped = import->second;
    if (p >= base && p - base < mapped.length) {
      if (length > mapped.length - (p - base)) {
        return InvalidArgumentError(std::string("copy ") + side + " [" + FormatHex(p) + ", +" +
                                    FormatHex(length) + ") leaves the imported range [" +
                                    FormatHex(base) + ", +" + FormatHex(mapped.length) + ")");
      }
      if (!IsMemfdOf(ProcFd(mapped.exporter_pid, mapped.exporter_fd), mapped.tag)) {
        return FailedPreconditionError(
            std::string("copy ") + side + " " + FormatHex(p) + ": the exporter (pid " +
            std::to_string(mapped.exporter_pid) + ", device " +
            std::to_string(mapped.exporter_device) + ") freed the imported allocation or exited");
      }
      return Status();
    }
  }
  auto it = registrations_.upper_bound(p);
  if (it != registrations_.begin()) {
    --it;
    if (p >= it->first && p - it->first < it->second) {
      if (length <= it->second - (p - it->first)) return Status();
      return InvalidArgumentError(std::string("copy ") + side + " [" + FormatHex(p) + ", +" +
                                  FormatHex(length) + ") leaves the registration [" +
                                  FormatHex(it->first) + ", +" + FormatHex(it->second) + ")");
    }
  }
  if (options_.reads_unregistered_host_memory && !TouchesDeviceMemory(p, length)) return Status();
  return InvalidArgumentError(std::string("copy ") + side + " " + FormatHex(p) +
                              " is not inside a native registration");
}

Result<uint64_t> EmulatedDevice::SubmitCopy(void* dst, const void* src, uint64_t length) {
  uint64_t id;
  {
    MutexLock lock(mu_);
    LARDER_RETURN_IF_ERROR(CheckBound("copy submit"));
    uint64_t call = copy_calls_.fetch_add(1) + 1;
    if (length == 0) return InvalidArgumentError("copy of 0 bytes");
    LARDER_RETURN_IF_ERROR(CheckCopySide("source", reinterpret_cast<uint64_t>(src), length));
    LARDER_RETURN_IF_ERROR(CheckCopySide("destination", reinterpret_cast<uint64_t>(dst), length));
    id = next_copy_id_++;
    if (copy_fault_at_ != 0 && call == copy_fault_at_) {
      copy_fault_at_ = 0;
      copies_[id] =
          UnavailableError("injected native copy failure (call " + std::to_string(call) + ")");
      return id;
    }
  }
  // Outside the lock, as a device's copy engines run beside each other; the memory stays valid
  // while its owner waits for the copy (freeing memory under a running copy is the caller's bug,
  // as on hardware).
  std::memcpy(dst, src, length);
  MutexLock lock(mu_);
  copies_[id] = Status();
  return id;
}

Result<bool> EmulatedDevice::QueryCopy(uint64_t id) {
  MutexLock lock(mu_);
  LARDER_RETURN_IF_ERROR(CheckBound("copy query"));
  auto it = copies_.find(id);
  if (it == copies_.end()) return NotFoundError("no copy " + std::to_string(id));
  Status outcome = it->second;
  copies_.erase(it);
  if (!outcome.ok()) return outcome;
  return true;
}

// Copies finish inside SubmitCopy: waiting is querying once.
Status EmulatedDevice::WaitCopy(uint64_t id) { return QueryCopy(id).status(); }

Result<void*> EmulatedDevice::AllocateHost(uint64_t size) {
  MutexLock lock(mu_);
  LARDER_RETURN_IF_ERROR(CheckBound("host alloc"));
  if (size == 0) return InvalidArgumentError("host alloc of 0 bytes");
  const uint64_t g = options_.granularity;
  const uint64_t rounded = (size + g - 1) / g * g;
  const uint64_t span = rounded + g;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return ResourceExhaustedError("pinned host memory exhausted");
  const auto start = reinterpret_cast<uint64_t>(raw);
  const uint64_t aligned = (start + g - 1) / g * g;
  if (aligned > start) munmap(raw, aligned - start);
  if (start + span > aligned + rounded) {
    munmap(reinterpret_cast<void*>(aligned + rounded), start + span - (aligned + rounded));
  }
  // Pinned memory is resident: fault it in now, as pinning does.
  std::memset(reinterpret_cast<void*>(aligned), 0, rounded);
  host_allocations_[aligned] = rounded;
  return reinterpret_cast<void*>(aligned);
}

Status EmulatedDevice::FreeHost(void* ptr) {
  MutexLock lock(mu_);
  LARDER_RETURN_IF_ERROR(CheckBound("host free"));
  auto it = host_allocations_.find(reinterpret_cast<uint64_t>(ptr));
  if (it == host_allocations_.end()) {
    return InvalidArgumentError("host free of " + FormatHex(reinterpret_cast<uint64_t>(ptr)) +
                                ", which is no pinned allocation of this device");
  }
  munmap(ptr, it->second);
  host_allocations_.erase(it);
  return Status();
}

size_t EmulatedDevice::live_host_allocations() const {
  MutexLock lock(mu_);
  return host_allocations_.size();
}

Result<std::string> EmulatedDevice::ExportAllocation(void* ptr) {
  MutexLock lock(mu_);
  LARDER_RETURN_IF_ERROR(CheckBound("export"));
  auto it = allocations_.find(reinterpret_cast<uint64_t>(ptr));
  if (it == allocations_.end()) {
    return InvalidArgumentError("export of " + FormatHex(reinterpret_cast<uint64_t>(ptr)) +
                                ", which is no allocation of this device");
  }
  Handle handle;
  handle.host_id = host_id_;
  handle.pid = static_cast<int32_t>(getpid());
  handle.fd = it->second.fd;
  handle.device = init_device_;
  handle.size = it->second.length;
  handle.tag = it->second.tag;
  return EncodeHandle(handle);
}

Result<ImportedAllocation> EmulatedDevice::ImportAllocation(std::string_view bytes) {
  LARDER_ASSIGN_OR_RETURN(Handle handle, DecodeHandle(bytes));
  LARDER_RETURN_IF_ERROR(handle_codec::CheckOrigin(handle.host_id, handle.pid, host_id_));
  MutexLock lock(mu_);
  LARDER_RETURN_IF_ERROR(CheckBound("import"));
  if (!HasPeerAccess(init_device_, handle.device)) {
    return FailedPreconditionError("device " + std::to_string(init_device_) +
                                   " has no peer access to device " +
                                   std::to_string(handle.device) + " (the exporter's, pid " +
                                   std::to_string(handle.pid) + ")");
  }
  const auto started = std::chrono::steady_clock::now();
  import_calls_.fetch_add(1);
  auto gone = [&] {
    return FailedPreconditionError(
        "stale device memory handle: its exporter (pid " + std::to_string(handle.pid) +
        ") freed the allocation or exited, or the handle names no allocation of it");
  };
  // The handle is a peer's bytes: what it names must be the tagged memfd before it is opened, so
  // a handle naming a FIFO, a socket or a device node of that process is never opened at all.
  // O_NONBLOCK covers the fd being replaced between this check and the open; the check on the
  // opened fd below settles what was opened.
  const std::string exporter_fd = ProcFd(handle.pid, handle.fd);
  if (!IsMemfdOf(exporter_fd, handle.tag)) return gone();
  const int fd = open(exporter_fd.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT || errno == ESRCH) return gone();
    return ErrnoToStatus(
        errno, "opening the exporter's device memory (pid " + std::to_string(handle.pid) + ")");
  }
  // What was opened must be the allocation itself, not whatever took its fd number since.
  struct stat info {};
  if (!IsMemfdOf(ProcFd(getpid(), fd), handle.tag) || fstat(fd, &info) != 0 ||
      static_cast<uint64_t>(info.st_size) < handle.size) {
    close(fd);
    return gone();
  }
  Result<void*> mapped = MapAligned(fd, handle.size, options_.granularity);
  close(fd);  // the mapping keeps the memory
  LARDER_RETURN_IF_ERROR(mapped.status());
  Import import;
  import.length = handle.size;
  import.exporter_pid = handle.pid;
  import.exporter_fd = handle.fd;
  import.exporter_device = handle.device;
  import.tag = handle.tag;
  imports_[reinterpret_cast<uint64_t>(*mapped)] = std::move(import);
  import_ns_.fetch_add(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                 std::chrono::steady_clock::now() - started)
                                                 .count()));
  return ImportedAllocation{*mapped, handle.size, handle.device};
}

Status EmulatedDevice::CloseImport(void* base) {
  MutexLock lock(mu_);
  LARDER_RETURN_IF_ERROR(CheckBound("close import"));
  auto it = imports_.find(reinterpret_cast<uint64_t>(base));
  if (it == imports_.end()) {
    return NotFoundError("no import at " + FormatHex(reinterpret_cast<uint64_t>(base)));
  }
  munmap(base, it->second.length);
  imports_.erase(it);
  return Status();
}

size_t EmulatedDevice::live_imports() const {
  MutexLock lock(mu_);
  return imports_.size();
}

void EmulatedDevice::FailRegistrationAt(uint64_t nth) {
  MutexLock lock(mu_);
  registration_fault_at_ = nth == 0 ? 0 : register_calls_.load() + nth;
}

void EmulatedDevice::FailCopyAt(uint64_t nth) {
  MutexLock lock(mu_);
  copy_fault_at_ = nth == 0 ? 0 : copy_calls_.load() + nth;
}

}  // namespace larder::transfer
