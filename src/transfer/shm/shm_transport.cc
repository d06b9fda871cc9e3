// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/shm/shm_transport.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <map>
#include <mutex>

#include "common/logging.h"
#include "common/memory.h"
#include "transfer/copy_executor.h"
#include "transfer/shm/shm_handoff.h"
#include "transfer/transport_registry.h"

namespace larder::transfer {
namespace {

constexpr auto kOpenTimeout = std::chrono::seconds(5);

// A peer's memfd mapped into this process. Unmapped when the last user goes away.
struct Mapping {
  uint8_t* base = nullptr;
  uint64_t size = 0;
  ~Mapping() {
    if (base != nullptr) munmap(base, size);
  }
};

class ShmSegment final : public RemoteSegment {
 public:
  ShmSegment(SegmentDescriptor descriptor, std::shared_ptr<Mapping> mapping)
      : RemoteSegment(std::move(descriptor)), mapping_(std::move(mapping)) {}
  const Mapping& mapping() const { return *mapping_; }

 private:
  std::shared_ptr<Mapping> mapping_;
};

class ShmTransport final : public Transport {
 public:
  ~ShmTransport() override { Stop(); }

  std::string_view name() const override { return "shm"; }
  RouteKind route() const override { return RouteKind::kSameHostShm; }
  TransportCaps caps() const override { return {.allocates_exportable_memory = true}; }

  Status Start(const EngineContext& context) override {
    context_ = context;
    socket_name_ = "larder-shm/" + context.engine_id;
    server_ = std::make_unique<ShmHandoffServer>(context, context.options->shm_allowed_uids);
    return server_->Start(socket_name_);
  }

  void Stop() override {
    if (server_) server_->Stop();
  }

  Result<std::shared_ptr<MemoryRegion>> Allocate(size_t size, bool huge_pages) override {
    return AllocateMemfd("larder-segment", size, huge_pages);
  }

  void Describe(SegmentDescriptor* descriptor) const override {
    if (descriptor->memory_kind == MemoryKind::kMemfd) descriptor->shm_socket = socket_name_;
  }

  bool CanReach(const SegmentDescriptor& d) const override {
    return d.host_id == context_.host_id && d.memory_kind == MemoryKind::kMemfd &&
           !d.shm_socket.empty();
  }

  Result<std::shared_ptr<RemoteSegment>> Open(const SegmentDescriptor& descriptor) override {
    if (!CanReach(descriptor)) {
      return FailedPreconditionError("segment '" + descriptor.name + "' of engine " +
                                     descriptor.engine_id +
                                     " is not a shareable segment on this host");
    }
    std::string key = descriptor.engine_id + "/" + std::to_string(descriptor.segment_id) + "/" +
                      std::to_string(descriptor.epoch);
    std::lock_guard lock(mu_);
    if (auto it = mappings_.find(key); it != mappings_.end()) {
      if (auto mapping = it->second.lock()) {
        return std::make_shared<ShmSegment>(descriptor, std::move(mapping));
      }
    }
    uint64_t size = 0;
    LARDER_ASSIGN_OR_RETURN(Fd fd, RequestSegmentFd(descriptor, context_.auth_token,
                                                    Clock::now() + kOpenTimeout, &size));
    struct stat st {};
    if (fstat(fd.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) < descriptor.size ||
        size < descriptor.size) {
      return DataLossError("memfd of segment '" + descriptor.name + "' from engine " +
                           descriptor.engine_id + " is smaller than its descriptor says");
    }
    // Prefaulting builds the page tables now, so the first copy to each page does not fault.
    int flags = MAP_SHARED | (context_.options->shm_prefault ? MAP_POPULATE : 0);
    void* base = mmap(nullptr, descriptor.size, PROT_READ | PROT_WRITE, flags, fd.get(), 0);
    if (base == MAP_FAILED) {
      return ErrnoToStatus(
          errno, "mmap segment '" + descriptor.name + "' of engine " + descriptor.engine_id);
    }
    auto mapping = std::make_shared<Mapping>();
    mapping->base = static_cast<uint8_t*>(base);
    mapping->size = descriptor.size;
    mappings_[key] = mapping;
    return std::make_shared<ShmSegment>(descriptor, std::move(mapping));
  }

  void Submit(RemoteSegment& segment, std::span<Slice* const> slices,
              SliceCallback* done) override {
    const Mapping* mapping = &static_cast<ShmSegment&>(segment).mapping();
    ExecuteCopies(context_.copy_pool, context_.options->inline_copy_bytes, slices, done,
                  [mapping](Slice* s, uint64_t begin, uint64_t length) -> Status {
                    // The engine checked the range against the descriptor and the mapping is at
                    // least that large; this only guards against internal mistakes.
                    if (s->offset > mapping->size || s->length > mapping->size - s->offset) {
                      return OutOfRangeError("slice outside the mapped segment");
                    }
                    CopySliceRange(*s, mapping->base, begin, length);
                    return Status();
                  });
  }

 private:
  EngineContext context_;
  std::string socket_name_;
  std::unique_ptr<ShmHandoffServer> server_;
  std::mutex mu_;
  std::map<std::string, std::weak_ptr<Mapping>> mappings_;  // guarded by mu_
};

}  // namespace

std::unique_ptr<Transport> CreateShmTransport() { return std::make_unique<ShmTransport>(); }

LARDER_REGISTER_TRANSPORT(shm, RouteKind::kSameHostShm, CreateShmTransport);

}  // namespace larder::transfer
