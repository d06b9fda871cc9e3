// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// An EMULATED device backend, for machines without device hardware (CI among them). "Device
// memory" is host memory from per-device pools; copies are memcpy. What it emulates faithfully is
// the rules of a real device library, enforced strictly so that an engine that breaks one fails
// here exactly as it would on hardware:
//  - a per-thread current device; every native call fails (FailedPrecondition) on a thread with
//    no current device or bound to another device than the one Init ran on;
//  - Init once, on the current device; nothing works before it;
//  - 2 MiB registration granularity: unaligned registrations fail (InvalidArgument);
//  - overlapping registrations fail (AlreadyExists), as the native MR layer rejects them;
//  - a copy whose source or destination leaves one registration fails (InvalidArgument), except
//    unregistered host memory when reads_unregistered_host_memory (the local bypass) is on;
//  - fault injection: fail the Nth registration or the Nth copy (1-based), once;
//  - pinned host memory (AllocateHost) is anonymous memory, populated up front as pinning does,
//    counted so that tests see staging buffers come back;
//  - device memory shared between processes: each allocation is a memfd, its handle names the
//    exporting process, the memfd and a random tag; an import opens it through /proc/<pid>/fd,
//    so a handle works on its own host only (its host id must be this one's too), in another
//    process only, for a device with peer access to the exporter's (peer_groups), and only while
//    the exporter holds the allocation (the tag of what is at that fd must match). A copy through
//    an import checks the last again, so one whose exporter freed the memory or died fails.
// Thread-safe.
#pragma once

#include <atomic>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "transfer/device/device_backend.h"

namespace larder::transfer {

struct EmulatedDeviceOptions {
  int device_count = 8;
  uint64_t granularity = 2ULL << 20;
  bool reads_unregistered_host_memory = true;
  uint64_t fail_registration = 0;  // 0: never
  uint64_t fail_copy = 0;          // 0: never
  // The host that this emulator's handles belong to; "" is this machine (DefaultHostId()).
  std::string host_id{};
  // Peer access: the group of each device (peer_groups[d]); devices of one group reach each
  // other's memory. Empty: every device reaches every other. See ParsePeerGroups.
  std::vector<int> peer_groups{};
};

// "0-3,4-7" (groups of device ranges or single devices, comma-separated) -> the group of each of
// `device_count` devices; a device in no group reaches only itself. "" or "all": one group.
Result<std::vector<int>> ParsePeerGroups(std::string_view spec, int device_count);

class EmulatedDevice final : public DeviceBackend {
 public:
  explicit EmulatedDevice(EmulatedDeviceOptions options = {});
  ~EmulatedDevice() override;

  std::string_view name() const override { return "emulated"; }
  uint64_t registration_granularity() const override { return options_.granularity; }
  bool reads_unregistered_host_memory() const override {
    return options_.reads_unregistered_host_memory;
  }
  Status SetCurrentDevice(int device) override;
  Result<int> CurrentDevice() const override;
  Status Init() override;
  Result<void*> Allocate(uint64_t size) override;
  Status Free(void* ptr) override;
  bool IsDeviceMemory(const void* ptr, uint64_t length) const override;
  Status Register(uint64_t begin, uint64_t length) override;
  Status Deregister(uint64_t begin) override;
  Result<uint64_t> SubmitCopy(void* dst, const void* src, uint64_t length) override;
  Result<bool> QueryCopy(uint64_t id) override;
  Status WaitCopy(uint64_t id) override;
  Result<void*> AllocateHost(uint64_t size) override;
  Status FreeHost(void* ptr) override;
  Result<std::string> ExportAllocation(void* ptr) override;
  Result<ImportedAllocation> ImportAllocation(std::string_view handle) override;
  Status CloseImport(void* base) override;

  // Whether device `from` reaches the memory of device `to`.
  bool HasPeerAccess(int from, int to) const;

  // Observations for tests.
  int init_device() const;
  uint64_t register_calls() const { return register_calls_.load(); }
  uint64_t copy_calls() const { return copy_calls_.load(); }
  size_t live_allocations() const;
  size_t live_host_allocations() const;
  size_t live_imports() const;
  uint64_t import_calls() const { return import_calls_.load(); }
  // Time spent in successful imports (opening and mapping), in nanoseconds.
  uint64_t import_ns() const { return import_ns_.load(); }
  // Makes the next fault trigger at the Nth call from now (0: off).
  void FailRegistrationAt(uint64_t nth);
  void FailCopyAt(uint64_t nth);

 private:
  // OK when the calling thread may make native calls (Init done, bound to the init device).
  Status CheckBound(const char* call) const LARDER_REQUIRES(mu_);
  // True when [p, p + length) touches emulated device memory.
  bool TouchesDeviceMemory(uint64_t p, uint64_t length) const LARDER_REQUIRES(mu_);
  // OK when [p, p + length) lies in one registration or one import whose exporter still holds
  // it (or is host memory and the bypass is on).
  Status CheckCopySide(const char* side, uint64_t p, uint64_t length) const LARDER_REQUIRES(mu_);

  struct Allocation {
    uint64_t length = 0;
    int fd = -1;      // the memfd behind it
    std::string tag;  // random, in the memfd's name: what a handle must find at the fd
  };
  struct Import {
    uint64_t length = 0;
    int exporter_pid = 0;
    int exporter_fd = -1;
    int exporter_device = -1;
    std::string tag;
  };

  const EmulatedDeviceOptions options_;
  const std::string host_id_;
  mutable Mutex mu_;
  int init_device_ LARDER_GUARDED_BY(mu_) = -1;
  std::map<uint64_t, Allocation> allocations_ LARDER_GUARDED_BY(mu_);     // by begin
  std::map<uint64_t, Import> imports_ LARDER_GUARDED_BY(mu_);             // by base
  std::map<uint64_t, uint64_t> host_allocations_ LARDER_GUARDED_BY(mu_);  // begin -> length
  std::map<uint64_t, uint64_t> registrations_ LARDER_GUARDED_BY(mu_);     // begin -> length
  std::unordered_map<uint64_t, Status> copies_ LARDER_GUARDED_BY(mu_);    // id -> outcome
  uint64_t next_copy_id_ LARDER_GUARDED_BY(mu_) = 1;
  uint64_t registration_fault_at_ LARDER_GUARDED_BY(mu_) = 0;  // absolute call number
  uint64_t copy_fault_at_ LARDER_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> register_calls_{0};
  std::atomic<uint64_t> copy_calls_{0};
  std::atomic<uint64_t> import_calls_{0};
  std::atomic<uint64_t> import_ns_{0};
};

}  // namespace larder::transfer
