// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The CUDA backend of the device transport, over the CUDA runtime API. Built only with
// -DLARDER_WITH_CUDA=ON where a CUDA toolkit is found (docs/devices.md); on other machines the
// emulator stands in.
//  - the current device is CUDA's (cudaSetDevice / cudaGetDevice); CUDA has no "no device" state,
//    so SetCurrentDevice(-1) changes nothing;
//  - Init creates the primary context and a copy stream on the current device; later calls must
//    come from threads bound to that device (the device transport binds them);
//  - allocations are cudaMalloc'd with room to start at a 2 MiB boundary, as the registration
//    granularity requires; device memory needs no native registration, host memory is pinned
//    (cudaHostRegister) when registered, and unpinned host memory is still copied (staged by the
//    driver), which is the RFC's local bypass;
//  - copies are cudaMemcpyAsync on the copy stream, each followed by an event that QueryCopy
//    polls and WaitCopy synchronizes on;
//  - pinned host memory for staging is cudaHostAlloc'd, with room to start at a 2 MiB boundary;
//  - device memory of another process: a handle carries the host id, the exporting pid, the PCI
//    bus id of the exporter's device (device ordinals differ between processes), the
//    cudaIpcMemHandle_t, and the offset and size of the aligned allocation inside it. An import
//    refuses another host's handle and this process's own, finds the exporter's device here by its
//    PCI bus id, requires peer access from the initialized device (cudaDeviceCanAccessPeer), and
//    maps it with cudaIpcOpenMemHandle; the offset and size the handle claims must lie inside the
//    mapped allocation (the driver's cuMemGetAddressRange; an import is refused where it cannot be
//    checked). A copy must stay inside an import. The driver does
//    not tell an importer that the exporter freed the memory after the import; an import made after
//    the exporter exited fails.
// Thread-safe.
#pragma once

#include <map>
#include <string>

#include "common/mutex.h"
#include "transfer/device/device_backend.h"

namespace larder::transfer {

class CudaDevice final : public DeviceBackend {
 public:
  CudaDevice();
  ~CudaDevice() override;

  // The number of CUDA devices this process sees (0 when there is no driver or no device), and
  // why there are none.
  static int DeviceCount(std::string* why_none = nullptr);

  std::string_view name() const override { return "cuda"; }
  uint64_t registration_granularity() const override { return kGranularity; }
  bool reads_unregistered_host_memory() const override { return true; }
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

 private:
  static constexpr uint64_t kGranularity = 2ULL << 20;

  struct Allocation {
    void* raw = nullptr;  // what cudaMalloc returned
    uint64_t length = 0;  // usable bytes from the aligned start
  };
  struct Registration {
    uint64_t length = 0;
    bool pinned = false;  // host memory pinned with cudaHostRegister
  };
  struct Import {
    void* raw = nullptr;  // what cudaIpcOpenMemHandle returned
    uint64_t length = 0;
  };

  Status CheckBound(const char* call) const LARDER_REQUIRES(mu_);
  Status CheckCopySide(const char* side, uint64_t p, uint64_t length) const LARDER_REQUIRES(mu_);

  const std::string host_id_;
  mutable Mutex mu_;
  int init_device_ LARDER_GUARDED_BY(mu_) = -1;
  std::string init_bus_id_ LARDER_GUARDED_BY(mu_);
  void* stream_ LARDER_GUARDED_BY(mu_) = nullptr;                      // cudaStream_t
  std::map<uint64_t, Allocation> allocations_ LARDER_GUARDED_BY(mu_);  // by aligned start
  // cudaHostAlloc'd memory, by aligned start.
  std::map<uint64_t, Allocation> host_allocations_ LARDER_GUARDED_BY(mu_);
  std::map<uint64_t, Registration> registrations_ LARDER_GUARDED_BY(mu_);
  std::map<uint64_t, Import> imports_ LARDER_GUARDED_BY(mu_);  // by the start given out
  std::map<uint64_t, void*> copies_ LARDER_GUARDED_BY(mu_);    // id -> cudaEvent_t
  uint64_t next_copy_id_ LARDER_GUARDED_BY(mu_) = 1;
};

}  // namespace larder::transfer
