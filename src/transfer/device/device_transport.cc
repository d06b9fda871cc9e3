// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/device/device_transport.h"

#include <atomic>
#include <chrono>
#include <set>

#include "common/logging.h"
#include "common/mutex.h"
#include "transfer/copy_executor.h"
#include "transfer/device/device_scope.h"
#include "transfer/device/device_staging.h"
#include "transfer/registration_coverage.h"
#include "transfer/segment_exports.h"
#include "transfer/transport_registry.h"

namespace larder::transfer {
namespace {

class DeviceTransport final : public Transport {
 public:
  DeviceTransport(std::shared_ptr<DeviceBackend> backend, DeviceStagingOptions staging_options)
      : backend_(std::move(backend)),
        coverage_(std::make_shared<RegistrationCoverage>(backend_->registration_granularity())),
        staging_(
            backend_, [this] { return EnsureInit(); },
            [this](void* ptr, uint64_t length) {
              if (backend_->reads_unregistered_host_memory()) return Status();
              return coverage_->Register(reinterpret_cast<uint64_t>(ptr), length, Native());
            },
            staging_options) {}

  // Device memory reached by the CPU's routes goes through pinned host memory from here.
  DeviceStaging* device_staging() override { return &staging_; }

  std::string_view name() const override { return "device"; }
  TransportCaps caps() const override {
    return {.needs_local_registration = !backend_->reads_unregistered_host_memory(),
            .allocates_exportable_memory = true,
            .allocation_rank = 2};
  }

  Status Start(const EngineContext& context) override {
    context_ = context;  // deliberately no native call here: this may be a helper thread
    return Status();
  }

  Result<std::shared_ptr<MemoryRegion>> Allocate(size_t size, HugePages huge_pages) override {
    (void)huge_pages;  // the native allocator keeps its own page policy
    LARDER_ASSIGN_OR_RETURN(int device, EnsureInit());
    DeviceScope scope(*backend_, device);
    LARDER_RETURN_IF_ERROR(scope.status());
    LARDER_ASSIGN_OR_RETURN(void* ptr, backend_->Allocate(size));
    uint64_t g = backend_->registration_granularity();
    uint64_t rounded = AlignUp(size, g);
    // Segment memory is registered once, here: peers' copies into it then always find coverage.
    Status registered = coverage_->Register(reinterpret_cast<uint64_t>(ptr), rounded, Native());
    if (!registered.ok()) {
      if (Status freed = backend_->Free(ptr); !freed.ok()) {
        Log().warn("device memory at {} of device {} not freed after a failed registration: {}",
                   ptr, device, freed.ToString());
      }
      return registered;
    }
    std::shared_ptr<DeviceBackend> backend = backend_;
    // Freed memory is no registration of ours any more: a later allocation at the same address
    // registers again (its granules stay natively covered).
    return std::make_shared<MemoryRegion>(
        ptr, rounded, MemoryKind::kDevice, [backend, coverage = coverage_, device, ptr] {
          coverage->Deregister(reinterpret_cast<uint64_t>(ptr)).IgnoreError();
          DeviceScope release_scope(*backend, device);
          if (Status freed = backend->Free(ptr); !freed.ok()) {
            Log().warn(
                "device memory at {} of device {} not "
                "freed: {}",
                ptr, device, freed.ToString());
          }
        });
  }

  Status RegisterLocalMemory(void* ptr, size_t size) override {
    auto address = reinterpret_cast<uint64_t>(ptr);
    if (backend_->IsDeviceMemory(ptr, size) || !backend_->reads_unregistered_host_memory()) {
      // Memory this transport allocated is registered already, for as long as it lives.
      if (coverage_->IsLogicallyRegistered(address, size)) {
        MutexLock lock(mu_);
        inside_allocations_.insert(address);
        return Status();
      }
      LARDER_ASSIGN_OR_RETURN(int device, EnsureInit());
      DeviceScope scope(*backend_, device);
      LARDER_RETURN_IF_ERROR(scope.status());
      return coverage_->Register(address, size, Native());
    }
    return Status();  // host memory the native copy engine reads directly: the local bypass
  }

  Status UnregisterLocalMemory(void* ptr) override {
    const auto address = reinterpret_cast<uint64_t>(ptr);
    {
      MutexLock lock(mu_);
      if (inside_allocations_.erase(address) > 0) return Status();
    }
    Status s = coverage_->Deregister(address);
    return s.code() == StatusCode::kNotFound ? Status() : s;  // bypassed buffers were never tracked
  }

  // Device memory that this backend allocated is exported as the backend's handle, so that
  // another process of this host can map it (ImportAllocation); other device memory (registered
  // from another allocator) is reached by this engine only.
  Result<std::string> Export(const SegmentDescriptor& descriptor, uint8_t* base) override {
    if (descriptor.memory_kind != MemoryKind::kDevice) return std::string();
    LARDER_ASSIGN_OR_RETURN(int device, RecordedDevice());
    DeviceScope scope(*backend_, device);
    LARDER_RETURN_IF_ERROR(scope.status());
    Result<std::string> handle = backend_->ExportAllocation(base);
    if (!handle.ok() && handle.status().code() == StatusCode::kInvalidArgument) {
      return std::string();  // not an allocation of ours: no handle to give
    }
    LARDER_RETURN_IF_ERROR(
        handle.status().WithContext("exporting device segment '" + descriptor.name + "'"));
    if (handle->size() > kMaxDeviceHandleBytes) {
      return InternalError("the device backend's handle takes " + std::to_string(handle->size()) +
                           " bytes (at most " + std::to_string(kMaxDeviceHandleBytes) + ")");
    }
    return std::move(handle).value();
  }

  void AddStats(EngineStats* stats) const override {
    stats->device_imports += totals_->held.load();
    stats->device_imported_bytes += totals_->bytes.load();
    stats->device_import_calls += totals_->calls.load();
    stats->device_import_failures += totals_->failures.load();
    stats->device_import_ns += totals_->ns.load();
    const DeviceStagingStats staged = staging_.stats();
    stats->staging_buffers += staged.pinned_buffers;
    stats->staging_buffers_in_use += staged.buffers_in_use;
    stats->staging_waits += staged.waits;
    stats->staged_to_host_bytes += staged.bytes_to_host;
    stats->staged_to_device_bytes += staged.bytes_to_device;
    stats->staging_copy_failures += staged.copy_failures;
  }

  // Device memory of this engine, or of another engine of this host that exported a handle.
  bool CanReach(const SegmentDescriptor& d) const override {
    if (d.memory_kind != MemoryKind::kDevice) return false;
    if (d.engine_id == context_.engine_id) return true;
    const std::string* handle = d.TransportBlob("device");
    return handle != nullptr && !handle->empty() && handle->size() <= kMaxDeviceHandleBytes &&
           d.host_id == context_.host_id;
  }

  Result<std::shared_ptr<RemoteSegment>> Open(const SegmentDescriptor& descriptor) override {
    if (!CanReach(descriptor)) {
      return FailedPreconditionError("segment '" + descriptor.name +
                                     "' is not device memory of this engine or of an engine of "
                                     "this host that exports it");
    }
    if (descriptor.engine_id == context_.engine_id) {
      LARDER_ASSIGN_OR_RETURN(ExportedSegment exported,
                              context_.exports->Get(descriptor.segment_id));
      return std::make_shared<DeviceSegment>(descriptor, exported.base, nullptr);
    }
    // Another process's: map its allocation for the device this engine is bound to (which
    // initializes the library here first, on the calling thread's current device).
    LARDER_ASSIGN_OR_RETURN(int device, EnsureInit());
    DeviceScope scope(*backend_, device);
    LARDER_RETURN_IF_ERROR(scope.status());
    const auto started = std::chrono::steady_clock::now();
    Result<ImportedAllocation> imported =
        backend_->ImportAllocation(*descriptor.TransportBlob("device"));
    if (!imported.ok()) totals_->failures.fetch_add(1);
    LARDER_RETURN_IF_ERROR(imported.status().WithContext(
        "importing device segment '" + descriptor.name + "' of " + descriptor.engine_id));
    totals_->calls.fetch_add(1);
    totals_->ns.fetch_add(
        static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::steady_clock::now() - started)
                                  .count()));
    auto import = std::make_shared<Import>(backend_, totals_, device, *imported);
    if (imported->size < descriptor.size) {
      totals_->failures.fetch_add(1);
      return FailedPreconditionError(
          "device segment '" + descriptor.name + "' says " + std::to_string(descriptor.size) +
          " bytes; its exported allocation has " + std::to_string(imported->size));
    }
    return std::make_shared<DeviceSegment>(descriptor, static_cast<uint8_t*>(imported->base),
                                           std::move(import));
  }

  void Submit(RemoteSegment& segment, std::span<Slice* const> slices,
              SliceCallback* done) override {
    auto& device_segment = static_cast<DeviceSegment&>(segment);
    uint8_t* base = device_segment.base();
    // An imported segment stays mapped while a copy through it runs, even if it is closed.
    std::shared_ptr<Import> hold = device_segment.import();
    if (device_segment.imported() && hold == nullptr) {
      for (Slice* s : slices) {
        done->OnSliceDone(
            s, UnavailableError("device segment '" + segment.descriptor().name + "' was closed"));
      }
      return;
    }
    auto device = RecordedDevice();
    if (!device.ok()) {
      for (Slice* s : slices) done->OnSliceDone(s, device.status());
      return;
    }
    // The copy function is the hold's only owner: ExecuteCopies lets it go before the batch
    // completes, so a closed segment's import is unmapped by the time its last copy is reported.
    ExecuteCopies(context_.copy_pool, context_.options->inline_copy_bytes, slices, done,
                  [this, base, hold = std::move(hold), d = *device](Slice* s, uint64_t begin,
                                                                    uint64_t length) {
                    (void)hold;  // held for the mapping's sake
                    return CopyRange(d, *s, base, begin, length);
                  });
  }

 private:
  // What the engine's stats say about imports (EngineStats::device_*). Shared with the imports,
  // which may outlive the transport while copies through them end.
  struct ImportTotals {
    std::atomic<uint64_t> held{0};
    std::atomic<uint64_t> bytes{0};
    std::atomic<uint64_t> calls{0};
    std::atomic<uint64_t> failures{0};
    std::atomic<uint64_t> ns{0};
  };

  // Another process's device allocation mapped here; unmapped when the last holder lets go.
  struct Import {
    Import(std::shared_ptr<DeviceBackend> b, std::shared_ptr<ImportTotals> t, int d,
           ImportedAllocation a)
        : backend(std::move(b)), totals(std::move(t)), device(d), allocation(a) {
      totals->held.fetch_add(1);
      totals->bytes.fetch_add(allocation.size);
    }
    ~Import() {
      DeviceScope scope(*backend, device);
      if (Status closed = backend->CloseImport(allocation.base); !closed.ok()) {
        Log().warn("imported device memory at {} not unmapped: {}", allocation.base,
                   closed.ToString());
      }
      totals->bytes.fetch_sub(allocation.size);
      totals->held.fetch_sub(1);
    }
    Import(const Import&) = delete;
    Import& operator=(const Import&) = delete;
    std::shared_ptr<DeviceBackend> backend;
    std::shared_ptr<ImportTotals> totals;
    int device;
    ImportedAllocation allocation;
  };

  class DeviceSegment final : public RemoteSegment {
   public:
    DeviceSegment(SegmentDescriptor descriptor, uint8_t* base, std::shared_ptr<Import> import)
        : RemoteSegment(std::move(descriptor)),
          base_(base),
          imported_(import != nullptr),
          import_(std::move(import)) {}
    uint8_t* base() const { return base_; }
    bool imported() const { return imported_; }
    // The import to copy through; null once closed (and for this engine's own segments).
    std::shared_ptr<Import> import() const {
      MutexLock lock(mu_);
      return import_;
    }
    void Close() override {
      MutexLock lock(mu_);
      import_.reset();  // unmapped once the copies running through it end
    }

   private:
    uint8_t* const base_;
    const bool imported_;
    mutable Mutex mu_;
    std::shared_ptr<Import> import_ LARDER_GUARDED_BY(mu_);
  };

  RegistrationCoverage::NativeRegister Native() {
    return [this](uint64_t begin, uint64_t length) { return backend_->Register(begin, length); };
  }

  // Initializes the native library on the calling thread's current device the first time.
  Result<int> EnsureInit() {
    MutexLock lock(mu_);
    if (device_ >= 0) return device_;
    auto current = backend_->CurrentDevice();
    if (!current.ok()) {
      return FailedPreconditionError(
          "the device transport initializes on the calling thread's current device, and this "
          "thread has none: set one (e.g. cudaSetDevice) before the first allocation or "
          "registration");
    }
    LARDER_RETURN_IF_ERROR(
        backend_->Init().WithContext("native init on device " + std::to_string(*current)));
    device_ = *current;
    Log().info("device transport ({}) initialized on device {}", backend_->name(), device_);
    return device_;
  }

  Result<int> RecordedDevice() {
    MutexLock lock(mu_);
    if (device_ < 0) return FailedPreconditionError("device transport used before initialization");
    return device_;
  }

  // Moves bytes [begin, begin + length) of a slice, one native copy per piece that stays within
  // one granule of both the source and the destination.
  Status CopyRange(int device, const Slice& s, uint8_t* base, uint64_t begin, uint64_t length) {
    DeviceScope scope(*backend_, device);
    LARDER_RETURN_IF_ERROR(scope.status());
    uint8_t* remote = base + s.offset + begin;
    uint8_t* local = s.local + begin;
    uint8_t* dst = s.op == TransferOp::kRead ? local : remote;
    const uint8_t* src = s.op == TransferOp::kRead ? remote : local;
    uint64_t g = backend_->registration_granularity();
    for (auto [offset, piece] : SplitAtBoundaries(reinterpret_cast<uint64_t>(src),
                                                  reinterpret_cast<uint64_t>(dst), length, g)) {
      LARDER_ASSIGN_OR_RETURN(uint64_t id, backend_->SubmitCopy(dst + offset, src + offset, piece));
      LARDER_RETURN_IF_ERROR(backend_->WaitCopy(id));
    }
    return Status();
  }

  std::shared_ptr<DeviceBackend> backend_;
  std::shared_ptr<ImportTotals> totals_ = std::make_shared<ImportTotals>();
  // Shared with the regions it allocated, which deregister themselves when freed.
  std::shared_ptr<RegistrationCoverage> coverage_;
  EngineContext context_;
  Mutex mu_;
  int device_ LARDER_GUARDED_BY(mu_) = -1;
  // Local memory registered inside this transport's own allocations (nothing was done for it).
  std::set<uint64_t> inside_allocations_ LARDER_GUARDED_BY(mu_);
  // Last: its buffers go back to the backend while the rest is still here.
  DeviceStaging staging_;
};

}  // namespace

std::unique_ptr<Transport> CreateDeviceTransport(std::shared_ptr<DeviceBackend> backend,
                                                 DeviceStagingOptions staging) {
  return std::make_unique<DeviceTransport>(std::move(backend), staging);
}

// Device memory of this engine: as close as a route gets after local. Never in "auto": device
// memory is asked for by name.
LARDER_REGISTER_TRANSPORT(device, 5, false, [](const TransportSelection&) {
  return CreateDeviceTransport(DefaultDeviceBackend());
});

}  // namespace larder::transfer
