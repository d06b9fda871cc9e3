// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The transfer engine behind TransferEngine::Create, shared by its two files: engine.cc (start-up,
// segments this engine exports and opens, counters) and engine_batches.cc (batches: submission,
// slices, retries over fallback routes, completion). Not part of the public API.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/engine_key.h"
#include "common/mutex.h"
#include "common/thread_pool.h"
#include "larder/transfer_engine.h"
#include "transfer/batch.h"
#include "transfer/device/device_staging.h"
#include "transfer/segment_exports.h"
#include "transfer/staged_dispatch.h"
#include "transfer/transport.h"
#include "transfer/wire/server.h"

namespace larder::transfer {

// What one route carried with one peer engine; lives as long as the engine.
struct PeerCounters {
  std::string engine_id;
  std::string host_id;
  std::string address;
  RouteKind route;
  struct Op {
    std::atomic<uint64_t> requests{0};
    std::atomic<uint64_t> bytes{0};
    std::atomic<uint64_t> failures{0};
    TransferCounters Load() const {
      return {requests.load(std::memory_order_relaxed), bytes.load(std::memory_order_relaxed),
              failures.load(std::memory_order_relaxed)};
    }
  };
  Op reads;
  Op writes;
};

// A segment opened by this engine: its primary route and lazily opened fallbacks.
struct OpenedSegment {
  SegmentHandle handle = 0;
  SegmentDescriptor descriptor;
  // A way to the segment.
  struct Route {
    Transport* transport = nullptr;
    // transport->route(), cached for the hot path; "<route>-staged" when the segment is device
    // memory that its owner stages through host memory for this CPU route.
    RouteKind kind;
    PeerCounters* counters = nullptr;  // owned by the engine
    // Where requests whose local buffer is device memory are counted when this (CPU) route moves
    // them through this engine's staging buffers: "<route>-staged". Null without staging.
    RouteKind staged_kind;
    PeerCounters* staged_counters = nullptr;
  };
  // What a fallback route has opened: null until its first need; `failed` once an open failed.
  struct Fallback {
    std::shared_ptr<RemoteSegment> remote;
    bool failed = false;
  };
  // routes[0] is the primary, opened with the segment; routes and primary are fixed once the
  // segment is published. Fallbacks open on first need, under mu: fallbacks[i] is routes[i + 1]'s.
  std::vector<Route> routes;
  std::shared_ptr<RemoteSegment> primary;
  Mutex mu;
  std::vector<Fallback> fallbacks LARDER_GUARDED_BY(mu);
};

class Engine final : public TransferEngine, public SliceCallback {
 public:
  Engine(const TransferEngineOptions& options, std::vector<std::unique_ptr<Transport>> transports)
      : options_(options), transports_(std::move(transports)) {}

  ~Engine() override {
    if (server_) server_->Stop();
    for (auto& t : transports_) t->Stop();
    copy_pool_.reset();  // finishes queued copies
  }

  Status Init();

  const std::string& id() const override { return context_.engine_id; }
  std::string identity_key() const override { return key_->public_key(); }
  std::string SignAsEngine(std::string_view message) const override { return key_->Sign(message); }
  const std::string& host_id() const override { return context_.host_id; }
  std::string address() const override { return context_.engine_address; }
  std::vector<RouteKind> routes() const override {
    std::vector<RouteKind> out;
    for (const auto& t : transports_) out.push_back(t->route());
    return out;
  }
  EngineStats Stats() const override;

  Result<std::shared_ptr<MemoryRegion>> AllocateSegmentMemory(size_t size) override;
  Result<SegmentId> RegisterSegment(std::string name,
                                    std::shared_ptr<MemoryRegion> memory) override;
  Result<SegmentId> RegisterSegment(std::string name, void* base, size_t size) override;
  Status UnregisterSegment(SegmentId id) override;
  std::vector<SegmentDescriptor> ListSegments() const override { return exports_.List(); }

  Status RegisterLocalMemory(void* ptr, size_t size) override;
  Status UnregisterLocalMemory(void* ptr) override;

  Result<std::vector<SegmentDescriptor>> ListPeerSegments(
      const std::string& address, std::chrono::milliseconds timeout) override;
  Result<SegmentHandle> OpenSegment(const SegmentDescriptor& descriptor) override;
  Result<SegmentHandle> OpenSegment(const std::string& address, const std::string& name) override;
  Status CloseSegment(SegmentHandle handle) override;
  Result<RouteKind> SegmentRoute(SegmentHandle handle) const override;
  Result<SegmentDescriptor> SegmentInfo(SegmentHandle handle) const override;

  using TransferEngine::Submit;
  Result<BatchId> Submit(std::span<const TransferRequest> requests,
                         std::chrono::milliseconds timeout, TrafficClass traffic_class) override;
  TrafficClass traffic_class() const override { return context_.traffic_class; }
  Result<bool> Poll(BatchId batch) override;
  Status Wait(BatchId batch, std::chrono::milliseconds timeout) override;
  Result<std::vector<TransferResult>> Results(BatchId batch) override;
  Status BatchStatus(BatchId batch) override;
  Status Release(BatchId batch) override { return batches_.Release(batch); }

  void OnSliceDone(Slice* slice, Status status) override;

 private:
  // The route for `transport` to `descriptor`, with its counters.
  OpenedSegment::Route MakeRoute(Transport* transport, const SegmentDescriptor& descriptor);
  // Hands slices to `transport`: those with a device buffer through staging when it is a CPU
  // route (staged_dispatch.h), the others as they are.
  void Dispatch(Transport* transport, RemoteSegment& remote, std::span<Slice* const> slices) {
    if (staged_dispatch_) return staged_dispatch_->Dispatch(transport, remote, slices);
    transport->Submit(remote, slices, this);
  }
  std::shared_ptr<OpenedSegment> FindOpened(SegmentHandle handle) const {
    ReaderLock lock(opened_mu_);
    auto it = opened_.find(handle);
    return it == opened_.end() ? nullptr : it->second;
  }
  // The open segment `handle`, kept alive by `batch` (its cache or keepalive); null if unknown.
  OpenedSegment* LookupForBatch(BatchState* batch, SegmentHandle handle) const;
  Status ValidateRequest(const TransferRequest& r, const OpenedSegment* segment) const;
  // Describes [base, base + size) through every transport and adds it to the exports.
  Result<SegmentId> Export(std::string name, uint8_t* base, uint64_t size, MemoryKind kind,
                           size_t page_size, std::shared_ptr<MemoryRegion> memory);
  // Slices of a request: at most slice_bytes each, and at most one staging buffer when its local
  // buffer is device memory.
  uint64_t SliceBytes(bool local_device) const {
    return local_device ? std::min<uint64_t>(options_.slice_bytes, staging_->chunk_bytes())
                        : options_.slice_bytes;
  }
  uint64_t SliceCount(uint64_t length, bool local_device) const {
    const uint64_t bytes = SliceBytes(local_device);
    return (length + bytes - 1) / bytes;
  }
  bool LocalRangeRegistered(const void* ptr, uint64_t length) const;
  // Opens the next route after `attempt` for a retry; null when there is none.
  // The next fallback route after *attempt that opens (setting *attempt to it), or null.
  std::shared_ptr<RemoteSegment> NextRoute(OpenedSegment* segment, uint32_t* attempt);
  void FinishSlice(BatchState* batch, Slice* slice, const Status& status,
                   const OpenedSegment::Route& route);
  // The counters of (descriptor's engine, route), created on first use.
  PeerCounters* CountersFor(const SegmentDescriptor& descriptor, RouteKind route);

  TransferEngineOptions options_;
  std::vector<std::unique_ptr<Transport>> transports_;
  EngineContext context_;
  // Its fingerprint ends the engine's id.
  const std::shared_ptr<const EngineKey> key_ = EngineKey::Generate();
  SegmentExports exports_;
  std::unique_ptr<ThreadPool> copy_pool_;
  std::unique_ptr<wire::FrameServer> server_;
  bool check_local_registration_ = false;
  // The device transport and its staging, when the engine has one.
  Transport* device_transport_ = nullptr;
  DeviceStaging* staging_ = nullptr;
  std::unique_ptr<StagedDispatch> staged_dispatch_;  // with staging_

  mutable SharedMutex opened_mu_;
  std::unordered_map<SegmentHandle, std::shared_ptr<OpenedSegment>> opened_
      LARDER_GUARDED_BY(opened_mu_);
  SegmentHandle next_handle_ LARDER_GUARDED_BY(opened_mu_) = 1;
  std::atomic<uint64_t> close_version_{0};  // bumped by every CloseSegment

  mutable SharedMutex local_mu_;
  std::map<uintptr_t, uint64_t> local_regions_ LARDER_GUARDED_BY(local_mu_);  // start -> length

  BatchTable batches_;

  mutable Mutex stats_mu_;
  std::map<std::pair<std::string, RouteKind>, std::unique_ptr<PeerCounters>> counters_
      LARDER_GUARDED_BY(stats_mu_);
};

}  // namespace larder::transfer
