// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// A transport wrapper that injects failures, for tests of retry and fallback. It forwards every
// call to the wrapped transport except where its FaultPlan says to fail. Thread-safe.
#pragma once

#include <atomic>
#include <memory>

#include "transfer/transport.h"

namespace larder::transfer {

struct FaultPlan {
  // Open fails with `open_error` when set (not OK).
  Status open_error;
  // The first `fail_first_slices` slices fail with `slice_error` (0: none).
  uint64_t fail_first_slices = 0;
  // Every slice whose ordinal (from 1) is a multiple of this fails (0: none).
  uint64_t fail_every_nth_slice = 0;
  Status slice_error = UnavailableError("injected slice failure");
  // Pretend the transport needs native registration of local buffers.
  bool needs_local_registration = false;
};

class FaultTransport final : public Transport {
 public:
  FaultTransport(std::unique_ptr<Transport> inner, FaultPlan plan);

  // Slices that reached the wrapped transport, and slices failed by injection.
  uint64_t forwarded_slices() const { return forwarded_.load(); }
  uint64_t failed_slices() const { return failed_.load(); }

  std::string_view name() const override { return inner_->name(); }
  TransportCaps caps() const override;
  Status Start(const EngineContext& context) override { return inner_->Start(context); }
  void Stop() override { inner_->Stop(); }
  Result<std::shared_ptr<MemoryRegion>> Allocate(size_t size, HugePages huge_pages) override {
    return inner_->Allocate(size, huge_pages);
  }
  Result<std::string> Export(const SegmentDescriptor& descriptor, uint8_t* base) override {
    return inner_->Export(descriptor, base);
  }
  void Unexport(SegmentId id) override { inner_->Unexport(id); }
  void AddStats(EngineStats* stats) const override { inner_->AddStats(stats); }
  Status RegisterLocalMemory(void* ptr, size_t size) override {
    return inner_->RegisterLocalMemory(ptr, size);
  }
  Status UnregisterLocalMemory(void* ptr) override { return inner_->UnregisterLocalMemory(ptr); }
  bool CanReach(const SegmentDescriptor& descriptor) const override {
    return inner_->CanReach(descriptor);
  }
  Result<std::shared_ptr<RemoteSegment>> Open(const SegmentDescriptor& descriptor) override;
  void Submit(RemoteSegment& segment, std::span<Slice* const> slices, SliceCallback* done) override;

 private:
  std::unique_ptr<Transport> inner_;
  FaultPlan plan_;
  std::atomic<uint64_t> seen_{0};
  std::atomic<uint64_t> forwarded_{0};
  std::atomic<uint64_t> failed_{0};
};

}  // namespace larder::transfer
