// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The transport interface: what every route (local, shm, tcp, device, ucx) implements. A transport
// is small: capabilities, allocation, registration, export, open, submit. The engine owns batching,
// slicing, deadlines, route choice and retries; a transport only moves slices. A transport owns its
// identity: what a peer needs to reach it (an endpoint, a socket name, a worker address and rkey)
// is an opaque blob it publishes in the descriptor of each segment it exports (Export) and reads
// back on the peer (CanReach, Open). Nothing outside its folder parses that blob.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "common/net.h"
#include "larder/status.h"
#include "larder/transfer_engine.h"

namespace larder {

class ThreadPool;

namespace transfer {

class DeviceStaging;
class SegmentExports;
namespace wire {
class FrameServer;
}

// What a transport gets from its engine when it starts. Pointers outlive the transport.
struct EngineContext {
  std::string engine_id;
  std::string host_id;
  std::string auth_token;  // empty: no token
  // TLS files of the tcp data plane (resolved from options and LARDER_TLS_*); empty: no TLS.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_ca_file;
  std::string listen_host;      // host of options.listen_address: where servers bind
  std::string advertised_host;  // the address peers dial for this host (listen_host, or a real
                                // interface's address when listen_host is 0.0.0.0)
  std::string engine_address;   // the engine's bootstrap service, "ip:port" (its address())
  const TransferEngineOptions* options = nullptr;
  HugePages huge_pages = HugePages::kOff;  // resolved from options and LARDER_HUGE_PAGES
  SegmentExports* exports = nullptr;
  ThreadPool* copy_pool = nullptr;
  // The engine's class, resolved (never kDefault); a batch may still ask for the other one.
  TrafficClass traffic_class = TrafficClass::kLatency;
  // The engine's frame server at engine_address (transfer/wire/server.h): transports that speak
  // the frame protocol (tcp) register their request handlers on it in Start, and are reached at
  // the same port as the bootstrap service.
  wire::FrameServer* frame_server = nullptr;
  // Pinned host staging over the device transport's backend (device_staging.h), when the engine
  // has a device transport: CPU routes serve this engine's device segments through it.
  DeviceStaging* device_staging = nullptr;
};

// How the engine's protocol selected a transport.
struct TransportSelection {
  // The protocol named this transport ("ucx", "shm,tcp"), rather than only including it through
  // "auto". Transports that "auto" uses only for some peers (ucx: RDMA lanes) reach every peer
  // they can when named.
  bool named = true;
};

// A piece of one request, the unit that transports move and the engine retries.
struct Slice {
  TransferOp op = TransferOp::kRead;
  uint8_t* local = nullptr;
  uint64_t offset = 0;  // inside the segment
  uint64_t length = 0;
  Deadline deadline;
  // Latency-class work (TrafficClass): transports serve it ahead of bulk work.
  bool latency = false;
  // Engine bookkeeping: transports must not touch these.
  void* batch = nullptr;
  uint32_t request = 0;
  uint32_t attempt = 0;
  // `local` is device memory: a CPU route moves it through a pinned staging buffer.
  bool local_device = false;
};

// Receives the outcome of every slice handed to Transport::Submit, exactly once per slice, from
// any thread (possibly inside Submit).
class SliceCallback {
 public:
  virtual ~SliceCallback() = default;
  virtual void OnSliceDone(Slice* slice, Status status) = 0;
};

// A segment opened through one transport.
class RemoteSegment {
 public:
  explicit RemoteSegment(SegmentDescriptor descriptor) : descriptor_(std::move(descriptor)) {}
  virtual ~RemoteSegment() = default;
  const SegmentDescriptor& descriptor() const { return descriptor_; }
  // The engine closed the segment: let go of what it holds (a mapping) now, even while an idle
  // batch still references this object. Copies already started finish; later ones fail.
  virtual void Close() {}

 private:
  SegmentDescriptor descriptor_;
};

struct TransportCaps {
  // Local pointers must lie in memory given to RegisterLocalMemory.
  bool needs_local_registration = false;
  // Can allocate memory that peers reach through this transport (Allocate is implemented).
  bool allocates_exportable_memory = false;
  // Among the enabled transports that allocate, AllocateSegmentMemory uses the one with the
  // highest rank (device memory beats a memfd, which reaches every CPU route, beats anonymous
  // memory).
  int allocation_rank = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  // The transport's registry name, which is also its route's name (RouteKind(name())).
  virtual std::string_view name() const = 0;
  RouteKind route() const { return RouteKind(name()); }
  virtual TransportCaps caps() const { return {}; }

  // Starts servers or threads. Called once, before any other call but name/route/caps.
  virtual Status Start(const EngineContext& context) {
    (void)context;
    return Status();
  }
  // Stops servers and fails or finishes outstanding slices. Called once, before destruction.
  virtual void Stop() {}

  // Memory that peers can reach through this transport.
  virtual Result<std::shared_ptr<MemoryRegion>> Allocate(size_t size, HugePages huge_pages) {
    (void)size;
    (void)huge_pages;
    return UnimplementedError(std::string(name()) + " does not allocate segment memory");
  }
  // Exports one of our segments, [base, base + descriptor.size) (its id, name, memory kind and
  // page size are set), through this transport and returns the blob peers need to reach it.
  // Empty: this transport does not export that segment (e.g. shm and anonymous memory). An error
  // fails the registration.
  virtual Result<std::string> Export(const SegmentDescriptor& descriptor, uint8_t* base) {
    (void)descriptor;
    (void)base;
    return std::string();
  }
  // The segment was unregistered (no transfer of ours touches it any more): let go of what Export
  // set up, so that peers can no longer reach its memory through this transport.
  virtual void Unexport(SegmentId id) { (void)id; }
  // Adds what this transport holds (e.g. mapped peer segments) to the engine's stats.
  virtual void AddStats(EngineStats* stats) const { (void)stats; }
  // The device transport's staging through pinned host memory; null for every other transport.
  virtual DeviceStaging* device_staging() { return nullptr; }

  virtual Status RegisterLocalMemory(void* ptr, size_t size) {
    (void)ptr;
    (void)size;
    return Status();
  }
  virtual Status UnregisterLocalMemory(void* ptr) {
    (void)ptr;
    return Status();
  }

  // Whether this transport could reach the segment at all (cheap; no I/O). Reads this transport's
  // blob in the descriptor, which is hostile input: a malformed one means "cannot reach".
  virtual bool CanReach(const SegmentDescriptor& descriptor) const = 0;
  // Opens the segment on this route (may do I/O: the shm handoff). Errors say why the route
  // cannot be used; the engine then tries the next one.
  virtual Result<std::shared_ptr<RemoteSegment>> Open(const SegmentDescriptor& descriptor) = 0;
  // Moves every slice and reports each to `done`. Never blocks on a peer for longer than the
  // slices' deadlines. REQUIRES: segment came from this transport's Open; slices are in range.
  virtual void Submit(RemoteSegment& segment, std::span<Slice* const> slices,
                      SliceCallback* done) = 0;
};

}  // namespace transfer
}  // namespace larder
