// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/ucx/ucx_transport.h"

#include <atomic>
#include <filesystem>
#include <map>
#include <vector>

#include "common/logging.h"
#include "common/memory.h"
#include "common/mutex.h"
#include "transfer/registration_coverage.h"
#include "transfer/transport_registry.h"
#include "transfer/ucx/ucx_blob.h"
#include "transfer/ucx/ucx_worker.h"

namespace larder::transfer {
namespace {

constexpr auto kOpenTimeout = std::chrono::seconds(5);
// How long UnregisterSegment waits for attached peers to confirm that they stopped (a dead peer
// never does; its endpoint is gone, so it cannot touch the memory either).
constexpr auto kRevokeWait = std::chrono::seconds(2);
// Local registrations are tracked per page.
constexpr uint64_t kRegistrationGranularity = 4096;

// Whether the kernel knows any RDMA device (InfiniBand, RoCE, iWARP NICs all appear here).
bool HostHasRdmaDevices() {
  std::error_code error;
  std::filesystem::directory_iterator it("/sys/class/infiniband", error);
  return !error && it != std::filesystem::directory_iterator();
}

class UcxSegment final : public RemoteSegment {
 public:
  UcxSegment(SegmentDescriptor descriptor, std::shared_ptr<ucx::UcxWorker> worker, uint64_t key)
      : RemoteSegment(std::move(descriptor)), worker_(std::move(worker)), key_(key) {}
  ~UcxSegment() override { Close(); }

  // 0 once closed.
  uint64_t key() const { return key_.load(); }
  void Close() override {
    if (uint64_t key = key_.exchange(0); key != 0) worker_->Detach(key);
  }

 private:
  std::shared_ptr<ucx::UcxWorker> worker_;
  std::atomic<uint64_t> key_;
};

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(const TransportSelection& selection)
      : named_(selection.named), coverage_(kRegistrationGranularity) {}
  ~UcxTransport() override { Stop(); }

  std::string_view name() const override { return "ucx"; }
  TransportCaps caps() const override {
    return {.needs_local_registration = false,
            .allocates_exportable_memory = true,
            .allocation_rank = 0};
  }

  // Named explicitly, a UCX that does not start fails the engine. Included only through "auto",
  // the route is for RDMA alone: on a host without RDMA devices UCX is not even started (no
  // context, no thread, no listening socket, no segment mapped), its worker opens no tcp lane
  // (unless UCX_TLS says otherwise), and a worker without an RDMA lane is stopped again. A UCX
  // that does not start leaves the route off (with a warning) so that the other routes work.
  Status Start(const EngineContext& context) override {
    context_ = context;
    if (!named_ && !HostHasRdmaDevices()) return Status();
    auto worker =
        ucx::UcxWorker::Create(context.engine_id, /*rdma_only=*/!named_, context.auth_token);
    if (!worker.ok()) {
      if (named_) return worker.status().WithContext("starting the ucx transport");
      Log().warn("ucx transport off for engine {}: {}", context.engine_id,
                 worker.status().ToString());
      return Status();
    }
    if (!named_ && !(*worker)->has_rdma_lane()) {
      Log().info("ucx transport off for engine {}: UCX has no RDMA lane here (transports [{}])",
                 context.engine_id, (*worker)->resources());
      (*worker)->Stop();
      return Status();
    }
    worker_ = std::move(worker).value();
    return Status();
  }

  void Stop() override {
    if (worker_) worker_->Stop();
  }

  Result<std::shared_ptr<MemoryRegion>> Allocate(size_t size, HugePages huge_pages) override {
    return AllocateAnonymous(size, huge_pages);
  }

  // Device memory is out of the CPU's reach, and so out of UCX's host-memory transports.
  Result<std::string> Export(const SegmentDescriptor& descriptor, uint8_t* base) override {
    if (!worker_ || descriptor.memory_kind == MemoryKind::kDevice) return std::string();
    LARDER_ASSIGN_OR_RETURN(std::string rkey,
                            worker_->Export(descriptor.segment_id, base, descriptor.size));
    ucx::UcxBlob blob;
    blob.rdma = worker_->has_rdma_lane();
    blob.segment_id = descriptor.segment_id;
    blob.remote_base = reinterpret_cast<uint64_t>(base);
    blob.size = descriptor.size;
    blob.worker_address = worker_->address();
    blob.rkey = std::move(rkey);
    return ucx::EncodeBlob(blob);
  }

  void Unexport(SegmentId id) override {
    if (worker_) worker_->Unexport(id, kRevokeWait);
  }

  Status RegisterLocalMemory(void* ptr, size_t size) override {
    if (!worker_) return Status();
    return coverage_.Register(
        reinterpret_cast<uint64_t>(ptr), size, [this](uint64_t begin, uint64_t length) -> Status {
          LARDER_ASSIGN_OR_RETURN(ucp_mem_h memh, worker_->MapLocal(begin, length));
          MutexLock lock(mu_);
          local_memhs_[begin] = memh;
          return Status();
        });
  }

  Status UnregisterLocalMemory(void* ptr) override {
    Status s = coverage_.Deregister(reinterpret_cast<uint64_t>(ptr));
    return s.code() == StatusCode::kNotFound ? Status() : s;  // registration is optional here
  }

  // Named: every segment with a valid ucx blob. Through "auto": only other hosts, and only where
  // both ends have an RDMA lane, since over tcp the tcp route is as fast and checks every access.
  bool CanReach(const SegmentDescriptor& d) const override {
    if (!worker_ || d.memory_kind == MemoryKind::kDevice) return false;
    const std::string* bytes = d.TransportBlob("ucx");
    if (bytes == nullptr) return false;
    auto blob = ucx::ParseBlob(*bytes, d);
    if (!blob.ok()) return false;
    if (named_) return true;
    return d.host_id != context_.host_id && worker_->has_rdma_lane() && blob->rdma;
  }

  Result<std::shared_ptr<RemoteSegment>> Open(const SegmentDescriptor& descriptor) override {
    if (!worker_) return FailedPreconditionError("the ucx transport did not start");
    if (descriptor.memory_kind == MemoryKind::kDevice) {
      return FailedPreconditionError("segment '" + descriptor.name + "' is device memory");
    }
    const std::string* bytes = descriptor.TransportBlob("ucx");
    if (bytes == nullptr) {
      return FailedPreconditionError("segment '" + descriptor.name + "' of engine " +
                                     descriptor.engine_id + " is not exported through ucx");
    }
    LARDER_ASSIGN_OR_RETURN(ucx::UcxBlob blob, ucx::ParseBlob(*bytes, descriptor));
    ucx::PeerName owner{descriptor.engine_id, descriptor.host_id, descriptor.address,
                        descriptor.name};
    LARDER_ASSIGN_OR_RETURN(uint64_t key,
                            worker_->Attach(blob, std::move(owner), Clock::now() + kOpenTimeout));
    return std::make_shared<UcxSegment>(descriptor, worker_, key);
  }

  void Submit(RemoteSegment& segment, std::span<Slice* const> slices,
              SliceCallback* done) override {
    uint64_t key = static_cast<UcxSegment&>(segment).key();
    if (key == 0) {
      Status closed = UnavailableError("segment '" + segment.descriptor().name + "' of engine " +
                                       segment.descriptor().engine_id + " was closed");
      for (Slice* s : slices) done->OnSliceDone(s, closed);
      return;
    }
    std::vector<ucx::LocalSlice> local;
    local.reserve(slices.size());
    bool registered = coverage_.logical_registrations() > 0;
    for (Slice* s : slices) local.push_back({s, registered ? FindMemh(*s) : nullptr});
    worker_->Submit(key, local, done);
  }

 private:
  // The native registration that holds the slice's whole local range, or null.
  ucp_mem_h FindMemh(const Slice& s) {
    auto begin = reinterpret_cast<uint64_t>(s.local);
    auto native = coverage_.FindNative(begin);
    if (!native || native->end - begin < s.length) return nullptr;
    MutexLock lock(mu_);
    auto it = local_memhs_.find(native->begin);
    return it == local_memhs_.end() ? nullptr : it->second;
  }

  const bool named_;
  EngineContext context_;
  std::shared_ptr<ucx::UcxWorker> worker_;  // null when UCX did not start (auto only)
  RegistrationCoverage coverage_;
  Mutex mu_;
  std::map<uint64_t, ucp_mem_h> local_memhs_ LARDER_GUARDED_BY(mu_);  // by native range start
};

}  // namespace

std::unique_ptr<Transport> CreateUcxTransport(const TransportSelection& selection) {
  return std::make_unique<UcxTransport>(selection);
}

LARDER_REGISTER_TRANSPORT(ucx, 20, true, CreateUcxTransport);

}  // namespace larder::transfer
