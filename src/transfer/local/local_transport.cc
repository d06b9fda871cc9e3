// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/local/local_transport.h"

#include <cstring>

#include "common/memory.h"
#include "transfer/copy_executor.h"
#include "transfer/segment_exports.h"
#include "transfer/transport_registry.h"

namespace larder::transfer {
namespace {

class LocalTransport final : public Transport {
 public:
  std::string_view name() const override { return "local"; }
  TransportCaps caps() const override { return {.allocates_exportable_memory = true}; }

  Status Start(const EngineContext& context) override {
    context_ = context;
    return Status();
  }

  Result<std::shared_ptr<MemoryRegion>> Allocate(size_t size, HugePages huge_pages) override {
    return AllocateAnonymous(size, huge_pages);
  }

  bool CanReach(const SegmentDescriptor& descriptor) const override {
    // Device memory is not for the CPU to copy: it goes through the device route.
    return descriptor.engine_id == context_.engine_id &&
           descriptor.memory_kind != MemoryKind::kDevice;
  }

  Result<std::shared_ptr<RemoteSegment>> Open(const SegmentDescriptor& descriptor) override {
    if (!CanReach(descriptor)) {
      return FailedPreconditionError("segment '" + descriptor.name + "' belongs to engine " +
                                     descriptor.engine_id + ", not this one");
    }
    LARDER_ASSIGN_OR_RETURN(ExportedSegment exported, context_.exports->Get(descriptor.segment_id));
    if (exported.descriptor.epoch != descriptor.epoch) {
      return NotFoundError("segment '" + descriptor.name +
                           "' was re-registered (stale descriptor)");
    }
    return std::make_shared<RemoteSegment>(descriptor);
  }

  void Submit(RemoteSegment& segment, std::span<Slice* const> slices,
              SliceCallback* done) override {
    SegmentId id = segment.descriptor().segment_id;
    const SegmentExports* exports = context_.exports;
    // Access() holds the exports' shared lock during each copy, so UnregisterSegment waits for it.
    ExecuteCopies(context_.copy_pool, context_.options->inline_copy_bytes, slices, done,
                  [exports, id](Slice* s, uint64_t begin, uint64_t length) {
                    return exports->Access(id, s->offset + begin, length, [&](uint8_t* address) {
                      // Access hands out the address of offset s->offset + begin.
                      CopySliceRange(*s, address - s->offset - begin, begin, length);
                    });
                  });
  }

 private:
  EngineContext context_;
};

}  // namespace

std::unique_ptr<Transport> CreateLocalTransport() { return std::make_unique<LocalTransport>(); }

LARDER_REGISTER_TRANSPORT(local, 0, true,
                          [](const TransportSelection&) { return CreateLocalTransport(); });

}  // namespace larder::transfer
