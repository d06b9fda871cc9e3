// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The native library behind the device transport: what a CUDA, Ascend (ACL / MemFabric) or other
// device fabric must provide. The device transport, not the backend, owns the policy that makes
// such libraries safe to use from a store: deferred init on the caller's device, binding every
// later call to that device, registration coverage, and boundary-safe copy splitting.
//
// Rules every backend enforces (real hardware does; the emulator checks them strictly):
//  - native calls need a current device on the calling thread, and after Init only the device
//    Init ran on is accepted;
//  - registrations are aligned to registration_granularity() and may not overlap;
//  - a copy must stay inside one registration on each side, except that host memory of the
//    initiator needs no registration when reads_unregistered_host_memory() is true;
//  - device memory of another process of the same host is reached through an exported handle
//    (ExportAllocation there, ImportAllocation here): only on that host, only from a device with
//    peer access to the exporting one, and only while the exporter holds the allocation. A copy
//    must stay inside one import, as inside one registration.
//
// Thread safety: implementations must accept calls from any thread (each checked against the
// calling thread's current device).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "larder/status.h"

namespace larder::transfer {

// The most bytes a device memory handle (ExportAllocation) may take; longer ones are refused
// before they are parsed.
inline constexpr size_t kMaxDeviceHandleBytes = 512;

// Device memory of another process, mapped here (ImportAllocation).
struct ImportedAllocation {
  void* base = nullptr;
  uint64_t size = 0;
  int exporter_device = -1;  // the device that holds the memory
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  virtual std::string_view name() const = 0;
  // Alignment of native registrations (2 MiB for the devices this targets).
  virtual uint64_t registration_granularity() const = 0;
  // Whether copies may read/write initiator host memory that was never natively registered (the
  // RFC's local read/write bypass).
  virtual bool reads_unregistered_host_memory() const = 0;

  // The calling thread's current device (like cudaSetDevice / aclrtSetDevice). -1 returns the
  // thread to having none, where the library has that notion (backends without it may ignore -1).
  virtual Status SetCurrentDevice(int device) = 0;
  // FailedPrecondition when the calling thread has no current device.
  virtual Result<int> CurrentDevice() const = 0;

  // Native initialization on the calling thread's current device. Once only.
  virtual Status Init() = 0;
  // Device memory on the initialized device, aligned to the registration granularity.
  virtual Result<void*> Allocate(uint64_t size) = 0;
  virtual Status Free(void* ptr) = 0;
  // Whether [ptr, ptr + length) touches device memory (like cuPointerGetAttribute). No device
  // binding needed.
  virtual bool IsDeviceMemory(const void* ptr, uint64_t length) const = 0;

  // Natively registers [begin, begin + length). REQUIRES: aligned; no overlap with another
  // registration (AlreadyExists otherwise).
  virtual Status Register(uint64_t begin, uint64_t length) = 0;
  virtual Status Deregister(uint64_t begin) = 0;

  // Starts a copy; returns its id. InvalidArgument when a side leaves its registration.
  virtual Result<uint64_t> SubmitCopy(void* dst, const void* src, uint64_t length) = 0;
  // True when the copy finished; its error when it failed. NotFound for unknown ids.
  virtual Result<bool> QueryCopy(uint64_t id) = 0;
  // Blocks until the copy finished (cudaEventSynchronize); its error when it failed. NotFound
  // for unknown ids. The default polls QueryCopy, yielding between polls.
  virtual Status WaitCopy(uint64_t id);

  // ---- pinned host memory, for staging device memory through the CPU's routes ----

  // Host memory the device copies to and from at full speed (cudaHostAlloc), aligned to the
  // registration granularity. Like Allocate, it needs the initialized device.
  virtual Result<void*> AllocateHost(uint64_t size) = 0;
  // Frees what AllocateHost returned. InvalidArgument for any other pointer.
  virtual Status FreeHost(void* ptr) = 0;

  // ---- device memory shared between processes of one host ----

  // An opaque handle (at most kMaxDeviceHandleBytes) to the whole allocation at `ptr`, as
  // returned by Allocate, that a backend in another process of this host imports (what
  // cudaIpcGetMemHandle or a fabric's shared memory handle gives). InvalidArgument for a pointer
  // that is no allocation of this backend.
  virtual Result<std::string> ExportAllocation(void* ptr) = 0;
  // Maps an exported allocation for the initialized device (cudaIpcOpenMemHandle). The mapping is
  // device memory of this backend until CloseImport: copies may read and write it, each inside
  // its bounds. InvalidArgument for a malformed handle; FailedPrecondition for a handle of another
  // host, of this process, of a device without peer access to the initialized one, or of an
  // allocation its exporter freed (or whose exporter exited).
  virtual Result<ImportedAllocation> ImportAllocation(std::string_view handle) = 0;
  // Unmaps an import by its base. NotFound when `base` is no import.
  virtual Status CloseImport(void* base) = 0;
};

}  // namespace larder::transfer
