// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/device/emulated_device.h"

#include <sys/mman.h>

#include <cstring>

#include "common/env.h"

namespace larder::transfer {
namespace {

thread_local int current_device = -1;

}  // namespace

EmulatedDevice::EmulatedDevice(EmulatedDeviceOptions options) : options_(options) {
  registration_fault_at_ = options_.fail_registration;
  copy_fault_at_ = options_.fail_copy;
}

EmulatedDevice::~EmulatedDevice() {
  MutexLock lock(mu_);
  for (auto& [begin, length] : allocations_) munmap(reinterpret_cast<void*>(begin), length);
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
  uint64_t rounded = (size + g - 1) / g * g;
  // Over-allocate, then trim so the block is aligned to the granularity like device memory.
  uint64_t span = rounded + g;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return ResourceExhaustedError("emulated device memory exhausted");
  auto start = reinterpret_cast<uint64_t>(raw);
  uint64_t aligned = (start + g - 1) / g * g;
  if (aligned > start) munmap(raw, aligned - start);
  uint64_t tail = start + span - (aligned + rounded);
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + rounded), tail);
  allocations_[aligned] = rounded;
  return reinterpret_cast<void*>(aligned);
}

Status EmulatedDevice::Free(void* ptr) {
  MutexLock lock(mu_);
  LARDER_RETURN_IF_ERROR(CheckBound("free"));
  auto it = allocations_.find(reinterpret_cast<uint64_t>(ptr));
  if (it == allocations_.end()) return InvalidArgumentError("free of unknown device pointer");
  munmap(ptr, it->second);
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
  // Any overlap with an allocation counts: a host range may not run into device memory either.
  auto it = allocations_.upper_bound(p);
  if (it != allocations_.end() && it->first < p + length) return true;
  if (it == allocations_.begin()) return false;
  --it;
  return p < it->first + it->second;
}

Status EmulatedDevice::CheckCopySide(const char* side, uint64_t p, uint64_t length) const {
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
  MutexLock lock(mu_);
  LARDER_RETURN_IF_ERROR(CheckBound("copy submit"));
  uint64_t call = copy_calls_.fetch_add(1) + 1;
  if (length == 0) return InvalidArgumentError("copy of 0 bytes");
  LARDER_RETURN_IF_ERROR(CheckCopySide("source", reinterpret_cast<uint64_t>(src), length));
  LARDER_RETURN_IF_ERROR(CheckCopySide("destination", reinterpret_cast<uint64_t>(dst), length));
  uint64_t id = next_copy_id_++;
  if (copy_fault_at_ != 0 && call == copy_fault_at_) {
    copy_fault_at_ = 0;
    copies_[id] =
        UnavailableError("injected native copy failure (call " + std::to_string(call) + ")");
    return id;
  }
  std::memcpy(dst, src, length);
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

void EmulatedDevice::FailRegistrationAt(uint64_t nth) {
  MutexLock lock(mu_);
  registration_fault_at_ = nth == 0 ? 0 : register_calls_.load() + nth;
}

void EmulatedDevice::FailCopyAt(uint64_t nth) {
  MutexLock lock(mu_);
  copy_fault_at_ = nth == 0 ? 0 : copy_calls_.load() + nth;
}

}  // namespace larder::transfer
