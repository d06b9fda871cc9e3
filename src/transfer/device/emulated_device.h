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
//  - fault injection: fail the Nth registration or the Nth copy (1-based), once.
// Thread-safe.
#pragma once

#include <atomic>
#include <map>
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
};

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

  // Observations for tests.
  int init_device() const;
  uint64_t register_calls() const { return register_calls_.load(); }
  uint64_t copy_calls() const { return copy_calls_.load(); }
  size_t live_allocations() const;
  // Makes the next fault trigger at the Nth call from now (0: off).
  void FailRegistrationAt(uint64_t nth);
  void FailCopyAt(uint64_t nth);

 private:
  // OK when the calling thread may make native calls (Init done, bound to the init device).
  Status CheckBound(const char* call) const LARDER_REQUIRES(mu_);
  // True when [p, p + length) touches emulated device memory.
  bool TouchesDeviceMemory(uint64_t p, uint64_t length) const LARDER_REQUIRES(mu_);
  // OK when [p, p + length) lies in one registration (or is host memory and the bypass is on).
  Status CheckCopySide(const char* side, uint64_t p, uint64_t length) const LARDER_REQUIRES(mu_);

  const EmulatedDeviceOptions options_;
  mutable Mutex mu_;
  int init_device_ LARDER_GUARDED_BY(mu_) = -1;
  std::map<uint64_t, uint64_t> allocations_ LARDER_GUARDED_BY(mu_);     // begin -> length
  std::map<uint64_t, uint64_t> registrations_ LARDER_GUARDED_BY(mu_);   // begin -> length
  std::unordered_map<uint64_t, Status> copies_ LARDER_GUARDED_BY(mu_);  // id -> outcome
  uint64_t next_copy_id_ LARDER_GUARDED_BY(mu_) = 1;
  uint64_t registration_fault_at_ LARDER_GUARDED_BY(mu_) = 0;  // absolute call number
  uint64_t copy_fault_at_ LARDER_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> register_calls_{0};
  std::atomic<uint64_t> copy_calls_{0};
};

}  // namespace larder::transfer
