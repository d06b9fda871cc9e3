// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/device/cuda_device.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <unistd.h>

#include <iterator>

#include "common/env.h"
#include "transfer/device/device_transport.h"
#include "transfer/device/handle_codec.h"

namespace larder::transfer {
namespace {

using handle_codec::Put;
using handle_codec::PutString;
using handle_codec::Take;
using handle_codec::TakeString;

constexpr std::string_view kHandleMagic = "LCUDA1";

Status CudaError(cudaError_t error, const std::string& what) {
  const std::string message =
      what + ": " + cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ")";
  switch (error) {
    case cudaErrorMemoryAllocation:
      return ResourceExhaustedError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
      return InvalidArgumentError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorPeerAccessUnsupported:
      return FailedPreconditionError(message);
    default:
      return UnavailableError(message);
  }
}

#define LARDER_CUDA(call, what)                                     \
  do {                                                              \
    if (cudaError_t cuda_error = (call); cuda_error != cudaSuccess) \
      return CudaError(cuda_error, what);                           \
  } while (0)

std::string BusId(int device) {
  char id[32] = {};
  if (cudaDeviceGetPCIBusId(id, sizeof(id), device) != cudaSuccess) return std::string();
  return id;
}

// The driver's cuMemGetAddressRange, looked up in the driver library the runtime loaded (so that
// binaries do not link libcuda, and start where the driver is missing); null when it is absent.
decltype(&cuMemGetAddressRange) DriverAddressRange() {
  static const auto function = [] {
    void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (driver == nullptr) driver = dlopen("libcuda.so.1", RTLD_NOW);
    void* symbol = driver == nullptr ? nullptr : dlsym(driver, "cuMemGetAddressRange_v2");
    return reinterpret_cast<decltype(&cuMemGetAddressRange)>(symbol);
  }();
  return function;
}

// What a handle says: magic | str host id | i32 pid | str PCI bus id of the exporter's device |
// cudaIpcMemHandle_t | u64 offset of the aligned start | u64 size (host byte order: a handle
// never leaves its host).
struct Handle {
  std::string host_id;
  int32_t pid = 0;
  std::string bus_id;
  cudaIpcMemHandle_t ipc{};
  uint64_t offset = 0;
  uint64_t size = 0;
};

std::string EncodeHandle(const Handle& handle) {
  std::string out(kHandleMagic);
  PutString(&out, handle.host_id);
  Put(&out, handle.pid);
  PutString(&out, handle.bus_id);
  Put(&out, handle.ipc);
  Put(&out, handle.offset);
  Put(&out, handle.size);
  return out;
}

Result<Handle> DecodeHandle(std::string_view in) {
  auto malformed = [](const char* what) {
    return InvalidArgumentError(std::string("malformed CUDA memory handle: ") + what);
  };
  if (in.size() > kMaxDeviceHandleBytes) return malformed("longer than any handle");
  if (!in.starts_with(kHandleMagic)) return malformed("not a CUDA backend's handle");
  in.remove_prefix(kHandleMagic.size());
  Handle handle;
  if (!TakeString(&in, &handle.host_id) || !Take(&in, &handle.pid) ||
      !TakeString(&in, &handle.bus_id) || !Take(&in, &handle.ipc) || !Take(&in, &handle.offset) ||
      !Take(&in, &handle.size)) {
    return malformed("truncated");
  }
  if (!in.empty()) return malformed("trailing bytes");
  if (handle.pid <= 0 || handle.bus_id.empty() || handle.size == 0 ||
      handle.offset >= (2ULL << 20)) {  // the aligned start lies in the first 2 MiB
    return malformed("bad process, device, offset or size");
  }
  return handle;
}

}  // namespace

CudaDevice::CudaDevice() : host_id_(DefaultHostId()) {}

CudaDevice::~CudaDevice() {
  MutexLock lock(mu_);
  if (init_device_ < 0) return;
  cudaSetDevice(init_device_);
  for (auto& [id, event] : copies_) cudaEventDestroy(static_cast<cudaEvent_t>(event));
  for (auto& [base, import] : imports_) cudaIpcCloseMemHandle(import.raw);
  for (auto& [begin, registration] : registrations_) {
    if (registration.pinned) cudaHostUnregister(reinterpret_cast<void*>(begin));
  }
  for (auto& [begin, allocation] : allocations_) cudaFree(allocation.raw);
  for (auto& [begin, allocation] : host_allocations_) cudaFreeHost(allocation.raw);
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

int CudaDevice::DeviceCount(std::string* why_none) {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    if (why_none)
      *why_none = std::string(cudaGetErrorName(error)) + ": " + cudaGetErrorString(error);
    return 0;
  }
  if (count == 0 && why_none) *why_none = "the CUDA driver sees no device";
  return count;
}

Status CudaDevice::SetCurrentDevice(int device) {
  if (device == -1) return Status();  // CUDA threads always have a current device
  LARDER_CUDA(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  return Status();
}

Result<int> CudaDevice::CurrentDevice() const {
  int device = -1;
  LARDER_CUDA(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}

Status CudaDevice::Init() {
  LARDER_ASSIGN_OR_RETURN(int device, CurrentDevice());
  MutexLock lock(mu_);
  if (init_device_ >= 0) {
    return FailedPreconditionError("CUDA backend already initialized on device " +
                                   std::to_string(init_device_));
  }
  LARDER_CUDA(cudaFree(nullptr), "creating the CUDA context of device " + std::to_string(device));
  cudaStream_t stream = nullptr;
  LARDER_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_ = stream;
  init_device_ = device;
  init_bus_id_ = BusId(device);
  return Status();
}

Status CudaDevice::CheckBound(const char* call) const {
  if (init_device_ < 0) return FailedPreconditionError(std::string(call) + " before native init");
  int device = -1;
  LARDER_CUDA(cudaGetDevice(&device), "cudaGetDevice");
  if (device != init_device_) {
    return FailedPreconditionError(std::string(call) + " from a thread bound to device " +
                                   std::to_string(device) + "; the backend was initialized on " +
                                   std::to_string(init_device_));
  }
  return Status();
}

Result<void*> CudaDevice::Allocate(uint64_t size) {
  MutexLock lock(mu_);
  LARDER_RETURN_IF_ERROR(CheckBound("alloc"));
  if (size == 0) return InvalidArgumentError("alloc of 0 bytes");
  const uint64_t rounded = (size + kGranularity - 1) / kGranularity * kGranularity;
  void* raw = nullptr;
  LARDER_CUDA(cudaMalloc(&raw, rounded + kGranularity),
              "cudaMalloc of " + std::to_string(rounded) + " bytes");
  const auto start = reinterpret_cast<uint64_t>(raw);
  const uint64_t aligned = (start + kGranularity - 1) / kGranularity * kGranularity;
  allocations_[aligned] = Allocation{raw, rounded};
  return reinterpret_cast<void*>(aligned);
}

Status CudaDevice::Free(void* ptr) {
  MutexLock lock(mu_);
  LARDER_RETURN_IF_ERROR(CheckBound("free"));
  auto it = allocations_.find(reinterpret_cast<uint64_t>(ptr));
  if (it == allocations_.end()) return InvalidArgumentError("free of unknown device pointer");
  LARDER_CUDA(cudaFree(it->second.raw), "cudaFree");
  allocations_.erase(it);
  return Status();
}

bool CudaDevice::IsDeviceMemory(const void* ptr, uint64_t length) const {
  for (const void* p :
       {ptr, static_cast<const void*>(static_cast<const char*>(ptr) + length - 1)}) {
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
      cudaGetLastError();  // plain host memory is an error on older runtimes; clear it
      continue;
    }
    if (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged) {
      return true;
    }
  }
  return false;
}

Status CudaDevice::Register(uint64_t begin, uint64_t length) {
  MutexLock lock(mu_);
  LARDER_RETURN_IF_ERROR(CheckBound("register"));
  if (length == 0 || begin % kGranularity != 0 || length % kGranularity != 0) {
    return InvalidArgumentError("registration [" + FormatHex(begin) + ", +" + FormatHex(length) +
                                ") is not aligned to " + FormatHex(kGranularity));
  }
  auto next = registrations_.lower_bound(begin);
  const bool overlaps_next = next != registrations_.end() && next->first < begin + length;
  const bool overlaps_prev = next != registrations_.begin() &&
                             std::prev(next)->first + std::prev(next)->second.length > begin;
  if (overlaps_next || overlaps_prev) {
    return AlreadyExistsError("registration [" + FormatHex(begin) + ", +" + FormatHex(length) +
                              ") overlaps another");
  }
  // Device memory needs no registration with CUDA; host memory is pinned so that copies run at
  // full speed and asynchronously.
  Registration registration{length, false};
  cudaPointerAttributes attributes{};
  const bool known =
      cudaPointerGetAttributes(&attributes, reinterpret_cast<void*>(begin)) == cudaSuccess;
  if (!known) cudaGetLastError();
  if (!known || attributes.type == cudaMemoryTypeUnregistered) {
    LARDER_CUDA(cudaHostRegister(reinterpret_cast<void*>(begin), length, cudaHostRegisterDefault),
                "cudaHostRegister");
    registration.pinned = true;
  }
  registrations_[begin] = registration;
  return Status();
}

Status CudaDevice::Deregister(uint64_t begin) {
  MutexLock lock(mu_);
  LARDER_RETURN_IF_ERROR(CheckBound("deregister"));
  auto it = registrations_.find(begin);
  if (it == registrations_.end()) return NotFoundError("no registration at " + FormatHex(begin));
  if (it->second.pinned) {
    LARDER_CUDA(cudaHostUnregister(reinterpret_cast<void*>(begin)), "cudaHostUnregister");
  }
  registrations_.erase(it);
  return Status();
}

Status CudaDevice::CheckCopySide(const char* side, uint64_t p, uint64_t length) const {
  auto import = imports_.upper_bound(p);
  if (import == imports_.begin()) return Status();
  --import;
  const uint64_t base = import->first;
  if (p >= base && p - base < import->second.length &&
      length > import->second.length - (p - base)) {
    return InvalidArgumentError(std::string("copy ") + side + " [" + FormatHex(p) + ", +" +
                                FormatHex(length) + ") leaves the imported range [" +
                                FormatHex(base) + ", +" + FormatHex(import->second.length) + ")");
  }
  return Status();
}

Result<uint64_t> CudaDevice::SubmitCopy(void* dst, const void* src, uint64_t length) {
  MutexLock lock(mu_);
  LARDER_RETURN_IF_ERROR(CheckBound("copy submit"));
  if (length == 0) return InvalidArgumentError("copy of 0 bytes");
  LARDER_RETURN_IF_ERROR(CheckCopySide("source", reinterpret_cast<uint64_t>(src), length));
  LARDER_RETURN_IF_ERROR(CheckCopySide("destination", reinterpret_cast<uint64_t>(dst), length));
  auto stream = static_cast<cudaStream_t>(stream_);
  LARDER_CUDA(cudaMemcpyAsync(dst, src, length, cudaMemcpyDefault, stream), "cudaMemcpyAsync");
  cudaEvent_t event = nullptr;
  LARDER_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  if (cudaError_t error = cudaEventRecord(event, stream); error != cudaSuccess) {
    cudaEventDestroy(event);
    return CudaError(error, "cudaEventRecord");
  }
  const uint64_t id = next_copy_id_++;
  copies_[id] = event;
  return id;
}

Result<bool> CudaDevice::QueryCopy(uint64_t id) {
  MutexLock lock(mu_);
  LARDER_RETURN_IF_ERROR(CheckBound("copy query"));
  auto it = copies_.find(id);
  if (it == copies_.end()) return NotFoundError("no copy " + std::to_string(id));
  auto event = static_cast<cudaEvent_t>(it->second);
  cudaError_t state = cudaEventQuery(event);
  if (state == cudaErrorNotReady) return false;
  cudaEventDestroy(event);
  copies_.erase(it);
  if (state != cudaSuccess) return CudaError(state, "copy " + std::to_string(id));
  return true;
}

Status CudaDevice::WaitCopy(uint64_t id) {
  cudaEvent_t event = nullptr;
  {
    MutexLock lock(mu_);
    LARDER_RETURN_IF_ERROR(CheckBound("copy wait"));
    auto it = copies_.find(id);
    if (it == copies_.end()) return NotFoundError("no copy " + std::to_string(id));
    event = static_cast<cudaEvent_t>(it->second);
    copies_.erase(it);
  }
  // Synchronized outside the lock: other threads submit and wait meanwhile.
  cudaError_t state = cudaEventSynchronize(event);
  cudaEventDestroy(event);
  if (state != cudaSuccess) return CudaError(state, "copy " + std::to_string(id));
  return Status();
}

Result<void*> CudaDevice::AllocateHost(uint64_t size) {
  MutexLock lock(mu_);
  LARDER_RETURN_IF_ERROR(CheckBound("host alloc"));
  if (size == 0) return InvalidArgumentError("host alloc of 0 bytes");
  const uint64_t rounded = (size + kGranularity - 1) / kGranularity * kGranularity;
  void* raw = nullptr;
  LARDER_CUDA(cudaHostAlloc(&raw, rounded + kGranularity, cudaHostAllocDefault),
              "cudaHostAlloc of " + std::to_string(rounded) + " bytes");
  const auto start = reinterpret_cast<uint64_t>(raw);
  const uint64_t aligned = (start + kGranularity - 1) / kGranularity * kGranularity;
  host_allocations_[aligned] = Allocation{raw, rounded};
  return reinterpret_cast<void*>(aligned);
}

Status CudaDevice::FreeHost(void* ptr) {
  MutexLock lock(mu_);
  LARDER_RETURN_IF_ERROR(CheckBound("host free"));
  auto it = host_allocations_.find(reinterpret_cast<uint64_t>(ptr));
  if (it == host_allocations_.end()) {
    return InvalidArgumentError("host free of unknown pinned pointer");
  }
  LARDER_CUDA(cudaFreeHost(it->second.raw), "cudaFreeHost");
  host_allocations_.erase(it);
  return Status();
}

Result<std::string> CudaDevice::ExportAllocation(void* ptr) {
  MutexLock lock(mu_);
  LARDER_RETURN_IF_ERROR(CheckBound("export"));
  auto it = allocations_.find(reinterpret_cast<uint64_t>(ptr));
  if (it == allocations_.end()) {
    return InvalidArgumentError("export of " + FormatHex(reinterpret_cast<uint64_t>(ptr)) +
                                ", which is no allocation of this backend");
  }
  Handle handle;
  handle.host_id = host_id_;
  handle.pid = static_cast<int32_t>(getpid());
  handle.bus_id = init_bus_id_;
  LARDER_CUDA(cudaIpcGetMemHandle(&handle.ipc, it->second.raw), "cudaIpcGetMemHandle");
  handle.offset = it->first - reinterpret_cast<uint64_t>(it->second.raw);
  handle.size = it->second.length;
  return EncodeHandle(handle);
}

Result<ImportedAllocation> CudaDevice::ImportAllocation(std::string_view bytes) {
  LARDER_ASSIGN_OR_RETURN(Handle handle, DecodeHandle(bytes));
  LARDER_RETURN_IF_ERROR(handle_codec::CheckOrigin(handle.host_id, handle.pid, host_id_));
  MutexLock lock(mu_);
  LARDER_RETURN_IF_ERROR(CheckBound("import"));
  int exporter_device = -1;
  if (cudaDeviceGetByPCIBusId(&exporter_device, handle.bus_id.c_str()) != cudaSuccess) {
    cudaGetLastError();
    return FailedPreconditionError("the exporter's device (PCI " + handle.bus_id +
                                   ") is not visible to this process");
  }
  if (exporter_device != init_device_) {
    int can_access = 0;
    LARDER_CUDA(cudaDeviceCanAccessPeer(&can_access, init_device_, exporter_device),
                "cudaDeviceCanAccessPeer");
    if (!can_access) {
      return FailedPreconditionError("device " + std::to_string(init_device_) +
                                     " has no peer access to device " +
                                     std::to_string(exporter_device) + " (the exporter's, pid " +
                                     std::to_string(handle.pid) + ")");
    }
  }
  void* raw = nullptr;
  if (cudaError_t error = cudaIpcOpenMemHandle(&raw, handle.ipc, cudaIpcMemLazyEnablePeerAccess);
      error != cudaSuccess) {
    cudaGetLastError();
    return FailedPreconditionError(
        "stale CUDA memory handle: its exporter (pid " + std::to_string(handle.pid) +
        ") freed the allocation or exited (" + cudaGetErrorName(error) + ")");
  }
  // The offset and size are the exporter's claims: the mapping must hold them, or copies the
  // engine bounds by that size would run past it.
  CUdeviceptr range_base = 0;
  size_t range_size = 0;
  auto address_range = DriverAddressRange();
  if (address_range == nullptr ||
      address_range(&range_base, &range_size, reinterpret_cast<CUdeviceptr>(raw)) != CUDA_SUCCESS ||
      handle.offset + handle.size > range_size) {
    cudaIpcCloseMemHandle(raw);
    return InvalidArgumentError("CUDA memory handle of pid " + std::to_string(handle.pid) +
                                " claims " + std::to_string(handle.size) + " bytes at offset " +
                                std::to_string(handle.offset) + "; the allocation has " +
                                std::to_string(range_size));
  }
  const uint64_t base = reinterpret_cast<uint64_t>(raw) + handle.offset;
  imports_[base] = Import{raw, handle.size};
  return ImportedAllocation{reinterpret_cast<void*>(base), handle.size, exporter_device};
}

Status CudaDevice::CloseImport(void* base) {
  MutexLock lock(mu_);
  LARDER_RETURN_IF_ERROR(CheckBound("close import"));
  auto it = imports_.find(reinterpret_cast<uint64_t>(base));
  if (it == imports_.end()) {
    return NotFoundError("no import at " + FormatHex(reinterpret_cast<uint64_t>(base)));
  }
  LARDER_CUDA(cudaIpcCloseMemHandle(it->second.raw), "cudaIpcCloseMemHandle");
  imports_.erase(it);
  return Status();
}

}  // namespace larder::transfer

namespace larder::transfer {

std::shared_ptr<DeviceBackend> CreateCudaBackend() { return std::make_shared<CudaDevice>(); }

}  // namespace larder::transfer
