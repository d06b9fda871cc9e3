// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <thread>
#include <unordered_map>

#include "common/engine_key.h"
#include "common/env.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "common/net.h"
#include "common/priority.h"
#include "common/thread_pool.h"
#include "transfer/batch.h"
#include "transfer/bootstrap.h"
#include "transfer/device/device_staging.h"
#include "transfer/engine_internal.h"
#include "transfer/segment_exports.h"
#include "transfer/staged_dispatch.h"
#include "transfer/transport_registry.h"
#include "transfer/wire/server.h"

namespace larder {
namespace transfer {

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

namespace {

// The route name of traffic that `route` carried through pinned host staging.
RouteKind StagedRoute(RouteKind route) {
  return RouteKind(std::string(RouteKindName(route)) + "-staged");
}

bool IsRetryable(const Status& s) {
  switch (s.code()) {
    case StatusCode::kUnavailable:
    case StatusCode::kDataLoss:
    case StatusCode::kInternal:
    case StatusCode::kAborted:
      return true;
    default:
      return false;
  }
}

std::string AdvertisedHost(const std::string& listen_host) {
  if (listen_host != "0.0.0.0") return listen_host;
  std::string chosen = "127.0.0.1";
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return chosen;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if ((a->ifa_flags & IFF_UP) == 0 || (a->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char ip[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, ip, sizeof(ip));
    chosen = ip;
    break;
  }
  freeifaddrs(list);
  return chosen;
}

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

OpenedSegment::Route Engine::MakeRoute(Transport* transport, const SegmentDescriptor& descriptor) {
  OpenedSegment::Route route;
  route.transport = transport;
  route.kind = transport->route();
  const bool cpu_route = transport != device_transport_;
  // The owner stages its device memory for a CPU route (tcp's server does).
  if (cpu_route && descriptor.memory_kind == MemoryKind::kDevice)
    route.kind = StagedRoute(route.kind);
  route.counters = CountersFor(descriptor, route.kind);
  if (staging_ != nullptr && cpu_route) {
    route.staged_kind = StagedRoute(transport->route());
    route.staged_counters = CountersFor(descriptor, route.staged_kind);
  } else {
    route.staged_kind = route.kind;
    route.staged_counters = route.counters;
  }
  return route;
}

PeerCounters* Engine::CountersFor(const SegmentDescriptor& descriptor, RouteKind route) {
  MutexLock lock(stats_mu_);
  auto& slot = counters_[{descriptor.engine_id, route}];
  if (!slot) {
    slot = std::make_unique<PeerCounters>();
    slot->engine_id = descriptor.engine_id;
    slot->host_id = descriptor.host_id;
    slot->address = descriptor.address;
    slot->route = route;
  }
  return slot.get();
}

EngineStats Engine::Stats() const {
  EngineStats stats;
  {
    MutexLock lock(stats_mu_);
    for (const auto& [key, c] : counters_) {
      PeerTransferStats peer;
      peer.engine_id = c->engine_id;
      peer.host_id = c->host_id;
      peer.address = c->address;
      peer.route = c->route;
      peer.reads = c->reads.Load();
      peer.writes = c->writes.Load();
      if (peer.reads.requests == 0 && peer.writes.requests == 0) continue;
      stats.peers.push_back(std::move(peer));
    }
  }
  for (const auto& t : transports_) t->AddStats(&stats);
  return stats;
}

Status Engine::Init() {
  context_.host_id = options_.host_id.empty() ? DefaultHostId() : options_.host_id;
  context_.auth_token =
      options_.auth_token.empty() ? GetEnv("LARDER_AUTH_TOKEN") : options_.auth_token;
  auto option_or_env = [](const std::string& option, const char* variable) {
    return option.empty() ? GetEnv(variable) : option;
  };
  context_.tls_cert_file = option_or_env(options_.tls_cert_file, "LARDER_TLS_CERT");
  context_.tls_key_file = option_or_env(options_.tls_key_file, "LARDER_TLS_KEY");
  context_.tls_ca_file = option_or_env(options_.tls_ca_file, "LARDER_TLS_CA");
  std::string non_dumpable = GetEnv("LARDER_NON_DUMPABLE");
  if (options_.non_dumpable || non_dumpable == "1" || non_dumpable == "true") {
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) {
      return ErrnoToStatus(errno, "prctl(PR_SET_DUMPABLE, 0)");
    }
  }
  context_.engine_id =
      context_.host_id + "/" + std::to_string(getpid()) + "/" + key_->fingerprint();
  context_.options = &options_;
  context_.exports = &exports_;
  std::string huge = options_.huge_pages;
  if (huge.empty()) huge = GetEnv("LARDER_HUGE_PAGES");
  if (huge.empty()) huge = options_.use_huge_pages ? "auto" : "off";
  auto huge_pages = ParseHugePages(huge);
  if (!huge_pages.ok()) {
    return huge_pages.status().WithContext(options_.huge_pages.empty() ? "LARDER_HUGE_PAGES"
                                                                       : "huge_pages");
  }
  context_.huge_pages = *huge_pages;
  if (options_.slice_bytes == 0) return InvalidArgumentError("slice_bytes must be > 0");
  if (options_.slice_bytes > (64ULL << 20)) {
    return InvalidArgumentError("slice_bytes must be at most 64 MiB");
  }
  context_.traffic_class = options_.traffic_class;
  if (context_.traffic_class == TrafficClass::kDefault) {
    if (std::string env = GetEnv("LARDER_TRAFFIC_CLASS"); !env.empty()) {
      auto parsed = ParseTrafficClass(env);
      if (!parsed.ok()) return parsed.status().WithContext("LARDER_TRAFFIC_CLASS");
      context_.traffic_class = *parsed;
    } else {
      context_.traffic_class =
          options_.role == EngineRole::kStore ? TrafficClass::kBulk : TrafficClass::kLatency;
    }
  }
  size_t threads = options_.copy_threads;
  if (threads == 0) threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 4);
  // A bulk engine's copy threads give way to the latency work of the host.
  copy_pool_ = std::make_unique<ThreadPool>(
      threads, "larder-copy", context_.traffic_class == TrafficClass::kBulk ? kBulkNice : 0);
  context_.copy_pool = copy_pool_.get();

  LARDER_ASSIGN_OR_RETURN(HostPort listen, ResolveHostPort(options_.listen_address));
  context_.listen_host = listen.host;
  context_.advertised_host = AdvertisedHost(listen.host);
  server_ = std::make_unique<wire::FrameServer>(context_);
  LARDER_RETURN_IF_ERROR(server_->Listen(listen));
  context_.engine_address = context_.advertised_host + ":" + std::to_string(server_->port());
  context_.frame_server = server_.get();
  server_->set_advertised_endpoint(context_.engine_address);
  ServeDescriptors(server_.get(), &exports_);

  for (auto& t : transports_) {
    if (DeviceStaging* staging = t->device_staging(); staging != nullptr) {
      device_transport_ = t.get();
      staging_ = staging;
      context_.device_staging = staging;
      staged_dispatch_ =
          std::make_unique<StagedDispatch>(staging, device_transport_, copy_pool_.get(), this);
    }
  }
  check_local_registration_ = options_.require_local_registration;
  std::string names;
  for (auto& t : transports_) {
    LARDER_RETURN_IF_ERROR(
        t->Start(context_).WithContext("starting transport " + std::string(t->name())));
    check_local_registration_ |= t->caps().needs_local_registration;
    names += (names.empty() ? "" : ",") + std::string(t->name());
  }
  server_->Serve();
  Log().info("engine {} up at {}, routes [{}], {} traffic", context_.engine_id,
             context_.engine_address, names, TrafficClassName(context_.traffic_class));
  return Status();
}

Result<std::shared_ptr<MemoryRegion>> Engine::AllocateSegmentMemory(size_t size) {
  if (size == 0) return InvalidArgumentError("segment size must be > 0");
  Transport* chosen = nullptr;
  for (auto& t : transports_) {
    if (!t->caps().allocates_exportable_memory) continue;
    if (chosen == nullptr || t->caps().allocation_rank > chosen->caps().allocation_rank) {
      chosen = t.get();
    }
  }
  if (chosen == nullptr) {
    return FailedPreconditionError("no enabled transport can allocate segment memory");
  }
  return chosen->Allocate(size, context_.huge_pages);
}

Result<SegmentId> Engine::RegisterSegment(std::string name, std::shared_ptr<MemoryRegion> memory) {
  if (!memory) return InvalidArgumentError("segment '" + name + "' has no memory");
  auto* base = static_cast<uint8_t*>(memory->data());
  size_t size = memory->size();
  MemoryKind kind = memory->kind();
  size_t page_size = memory->page_size();
  return Export(std::move(name), base, size, kind, page_size, std::move(memory));
}

Result<SegmentId> Engine::RegisterSegment(std::string name, void* base, size_t size) {
  if (base == nullptr || size == 0) {
    return InvalidArgumentError("segment '" + name + "' needs a non-null base and size > 0");
  }
  // The caller's device memory (a framework's tensor) is exported as device memory: the device
  // route reaches it natively, the CPU's routes through staging. Its native registration covers
  // the owner's staging copies.
  if (staging_ != nullptr && staging_->IsDeviceMemory(base, size)) {
    LARDER_RETURN_IF_ERROR(device_transport_->RegisterLocalMemory(base, size)
                               .WithContext("registering device memory of segment '" + name + "'"));
    Result<SegmentId> id =
        Export(std::move(name), static_cast<uint8_t*>(base), size, MemoryKind::kDevice,
               static_cast<size_t>(sysconf(_SC_PAGESIZE)), nullptr);
    if (!id.ok()) device_transport_->UnregisterLocalMemory(base).IgnoreError();
    return id;
  }
  return Export(std::move(name), static_cast<uint8_t*>(base), size, MemoryKind::kAnonymous,
                static_cast<size_t>(sysconf(_SC_PAGESIZE)), nullptr);
}

Result<SegmentId> Engine::Export(std::string name, uint8_t* base, uint64_t size, MemoryKind kind,
                                 size_t page_size, std::shared_ptr<MemoryRegion> memory) {
  SegmentDescriptor d;
  d.name = std::move(name);
  d.engine_id = context_.engine_id;
  d.host_id = context_.host_id;
  d.address = context_.engine_address;
  d.size = size;
  d.memory_kind = kind;
  d.page_size = page_size;
  if (base == nullptr || size == 0) {
    return InvalidArgumentError("segment '" + d.name + "' has no memory");
  }
  LARDER_RETURN_IF_ERROR(exports_.Reserve(&d));
  const SegmentId id = d.segment_id;
  for (size_t i = 0; i < transports_.size(); ++i) {
    Transport& t = *transports_[i];
    Result<std::string> blob = t.Export(d, base);
    if (!blob.ok()) {
      for (size_t k = 0; k < i; ++k) transports_[k]->Unexport(id);
      exports_.Abandon(d.name);
      return blob.status().WithContext("exporting segment '" + d.name + "' through " +
                                       std::string(t.name()));
    }
    if (!blob->empty()) d.transports.emplace(std::string(t.name()), std::move(blob).value());
  }
  std::string label = d.name;
  exports_.Publish(std::move(d), base, std::move(memory));
  Log().info("exported segment '{}' (id {}, {} bytes, {}, {} pages) from engine {}", label, id,
             size, MemoryKindName(kind), FormatByteSize(page_size), context_.engine_id);
  return id;
}

Status Engine::UnregisterSegment(SegmentId id) {
  Result<ExportedSegment> exported = exports_.Get(id);
  LARDER_RETURN_IF_ERROR(exports_.Remove(id));
  for (auto& t : transports_) t->Unexport(id);
  // The caller's device memory was registered with the device transport for the segment.
  if (exported.ok() && exported->memory == nullptr &&
      exported->descriptor.memory_kind == MemoryKind::kDevice && device_transport_ != nullptr) {
    device_transport_->UnregisterLocalMemory(exported->base).IgnoreError();
  }
  return Status();
}

Status Engine::RegisterLocalMemory(void* ptr, size_t size) {
  if (ptr == nullptr || size == 0)
    return InvalidArgumentError("local memory needs a pointer and size > 0");
  auto start = reinterpret_cast<uintptr_t>(ptr);
  if (start > UINTPTR_MAX - size) return InvalidArgumentError("local memory range overflows");
  WriterLock lock(local_mu_);
  auto next = local_regions_.lower_bound(start);
  if (next != local_regions_.end() && next->first < start + size) {
    return AlreadyExistsError("local memory overlaps a registration");
  }
  if (next != local_regions_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > start)
      return AlreadyExistsError("local memory overlaps a registration");
  }
  for (auto& t : transports_) LARDER_RETURN_IF_ERROR(t->RegisterLocalMemory(ptr, size));
  local_regions_.emplace(start, size);
  return Status();
}

Status Engine::UnregisterLocalMemory(void* ptr) {
  WriterLock lock(local_mu_);
  auto it = local_regions_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == local_regions_.end())
    return NotFoundError("no local memory registered at that address");
  for (auto& t : transports_) LARDER_RETURN_IF_ERROR(t->UnregisterLocalMemory(ptr));
  local_regions_.erase(it);
  return Status();
}

bool Engine::LocalRangeRegistered(const void* ptr, uint64_t length) const {
  auto start = reinterpret_cast<uintptr_t>(ptr);
  ReaderLock lock(local_mu_);
  auto it = local_regions_.upper_bound(start);
  if (it == local_regions_.begin()) return false;
  --it;
  return start >= it->first && start - it->first <= it->second &&
         length <= it->second - (start - it->first);
}

Result<std::vector<SegmentDescriptor>> Engine::ListPeerSegments(const std::string& address,
                                                                std::chrono::milliseconds timeout) {
  LARDER_ASSIGN_OR_RETURN(HostPort hp, ResolveHostPort(address));
  return FetchDescriptors(hp, context_, Clock::now() + timeout);
}

Result<SegmentHandle> Engine::OpenSegment(const SegmentDescriptor& descriptor) {
  auto opened = std::make_shared<OpenedSegment>();
  opened->descriptor = descriptor;
  Status last;
  // Device memory goes native when the device route reaches it, whatever the routes' order: the
  // CPU's routes reach it only through staging copies.
  std::vector<Transport*> order;
  order.reserve(transports_.size());
  const bool native_first = device_transport_ != nullptr &&
                            descriptor.memory_kind == MemoryKind::kDevice &&
                            device_transport_->CanReach(descriptor);
  if (native_first) order.push_back(device_transport_);
  for (auto& t : transports_) {
    if (!native_first || t.get() != device_transport_) order.push_back(t.get());
  }
  for (Transport* t : order) {
    if (!t->CanReach(descriptor)) continue;
    if (opened->routes.empty()) {
      auto remote = t->Open(descriptor);
      if (!remote.ok()) {
        last = remote.status();
        WarnOnce(std::string(t->name()) + "-fallback/" + descriptor.engine_id,
                 "opening segment '" + descriptor.name + "' of engine " + descriptor.engine_id +
                     " on " + std::string(t->name()) + " failed (" + last.ToString() +
                     "); trying the next route");
        continue;
      }
      opened->routes.push_back(MakeRoute(t, descriptor));
      opened->primary = std::move(remote).value();
    } else {
      // Opened on first need.
      opened->routes.push_back(MakeRoute(t, descriptor));
    }
  }
  if (opened->routes.empty()) {
    if (!last.ok()) return last;
    std::string enabled;
    for (RouteKind route : routes()) {
      enabled += (enabled.empty() ? "" : ", ") + std::string(RouteKindName(route));
    }
    return NotFoundError("no enabled route reaches segment '" + descriptor.name + "' of engine " +
                         descriptor.engine_id + " (" +
                         std::string(MemoryKindName(descriptor.memory_kind)) +
                         " memory; this engine's routes: " + enabled + ")");
  }
  {
    MutexLock lock(opened->mu);
    opened->fallbacks.resize(opened->routes.size() - 1);
  }
  WriterLock lock(opened_mu_);
  opened->handle = next_handle_++;
  opened_[opened->handle] = opened;
  Log().info("segment '{}' of engine {}: route {}", descriptor.name, descriptor.engine_id,
             RouteKindName(opened->routes[0].kind));
  return opened->handle;
}

Result<SegmentHandle> Engine::OpenSegment(const std::string& address, const std::string& name) {
  LARDER_ASSIGN_OR_RETURN(auto descriptors, ListPeerSegments(address, std::chrono::seconds(5)));
  std::string names;
  for (const auto& d : descriptors) {
    if (d.name == name) return OpenSegment(d);
    names += (names.empty() ? "" : ", ") + d.name;
  }
  return NotFoundError("engine at " + address + " exports no segment '" + name +
                       "' (it has: " + (names.empty() ? "none" : names) + ")");
}

Status Engine::CloseSegment(SegmentHandle handle) {
  std::shared_ptr<OpenedSegment> closed;
  {
    WriterLock lock(opened_mu_);
    auto it = opened_.find(handle);
    if (it == opened_.end())
      return NotFoundError("no open segment handle " + std::to_string(handle));
    closed = std::move(it->second);
    opened_.erase(it);
    close_version_.fetch_add(1);
  }
  // Idle batches may keep the OpenedSegment itself a while (their cache); its mappings go now.
  closed->primary->Close();
  MutexLock lock(closed->mu);
  for (OpenedSegment::Fallback& fallback : closed->fallbacks) {
    if (fallback.remote) fallback.remote->Close();
  }
  return Status();
}

OpenedSegment* Engine::LookupForBatch(BatchState* batch, SegmentHandle handle) const {
  uint64_t version = close_version_.load(std::memory_order_acquire);
  if (batch->cached_segment && batch->cached_segment->handle == handle &&
      batch->cached_version == version) {
    return batch->cached_segment.get();
  }
  std::shared_ptr<OpenedSegment> found = FindOpened(handle);
  if (!found) return nullptr;
  // Earlier requests of this batch may still use the segment being replaced in the cache.
  if (batch->cached_segment) batch->keepalive.push_back(std::move(batch->cached_segment));
  batch->cached_segment = std::move(found);
  batch->cached_version = version;
  return batch->cached_segment.get();
}

Result<RouteKind> Engine::SegmentRoute(SegmentHandle handle) const {
  auto s = FindOpened(handle);
  if (!s) return NotFoundError("no open segment handle " + std::to_string(handle));
  return s->routes[0].kind;
}

Result<SegmentDescriptor> Engine::SegmentInfo(SegmentHandle handle) const {
  auto s = FindOpened(handle);
  if (!s) return NotFoundError("no open segment handle " + std::to_string(handle));
  return s->descriptor;
}

Status Engine::ValidateRequest(const TransferRequest& r, const OpenedSegment* segment) const {
  if (segment == nullptr) {
    return NotFoundError("no open segment handle " + std::to_string(r.segment));
  }
  if (r.local == nullptr) return InvalidArgumentError("null local buffer");
  if (r.op != TransferOp::kRead && r.op != TransferOp::kWrite) {
    return InvalidArgumentError("unknown transfer op");
  }
  LARDER_RETURN_IF_ERROR(SegmentExports::CheckRange(segment->descriptor, r.offset, r.length));
  if (reinterpret_cast<uintptr_t>(r.local) > UINTPTR_MAX - r.length) {
    return InvalidArgumentError("local buffer range overflows");
  }
  if (check_local_registration_ && !LocalRangeRegistered(r.local, r.length)) {
    return FailedPreconditionError(
        "local buffer [" + std::to_string(reinterpret_cast<uintptr_t>(r.local)) + ", +" +
        std::to_string(r.length) + ") is not inside registered local memory");
  }
  return Status();
}

Result<BatchId> Engine::Submit(std::span<const TransferRequest> requests,
                               std::chrono::milliseconds timeout, TrafficClass traffic_class) {
  if (traffic_class == TrafficClass::kDefault) traffic_class = context_.traffic_class;
  const bool latency = traffic_class == TrafficClass::kLatency;
  if (requests.empty()) return InvalidArgumentError("empty batch");
  if (requests.size() > options_.max_batch_requests) {
    return InvalidArgumentError("batch of " + std::to_string(requests.size()) +
                                " requests exceeds max_batch_requests (" +
                                std::to_string(options_.max_batch_requests) + ")");
  }
  Deadline deadline = CoarseNow() + (timeout.count() > 0 ? timeout : options_.default_timeout);
  LARDER_ASSIGN_OR_RETURN(auto acquired, batches_.Acquire());
  auto [id, batch] = acquired;
  batch->Prepare(requests.size());

  // Pass 1: validate and count, so every counter is final before the first slice can complete.
  size_t valid = 0, total_slices = 0;
  OpenedSegment* segment = nullptr;
  for (size_t i = 0; i < requests.size(); ++i) {
    const TransferRequest& r = requests[i];
    if (segment == nullptr || segment->handle != r.segment)
      segment = LookupForBatch(batch, r.segment);
    Status st = ValidateRequest(r, segment);
    if (!st.ok()) {
      batch->progress[i].status = st.WithContext("request " + std::to_string(i));
      batch->failed_requests.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    const bool local_device = staging_ != nullptr && staging_->IsDeviceMemory(r.local, r.length);
    batch->local_device[i] = local_device;
    uint64_t slices = SliceCount(r.length, local_device);
    batch->progress[i].pending_slices.store(static_cast<uint32_t>(slices),
                                            std::memory_order_relaxed);
    total_slices += slices;
    ++valid;
    batch->request_segment[i] = segment;
  }
  batch->pending_requests.store(valid);
  if (valid == 0) return id;

  // Pass 2: cut slices, then hand each run of requests on one segment to its primary route.
  batch->slices.reserve(total_slices);
  for (size_t i = 0; i < requests.size(); ++i) {
    if (batch->request_segment[i] == nullptr) continue;
    const TransferRequest& r = requests[i];
    const bool local_device = batch->local_device[i] != 0;
    const uint64_t slice_bytes = SliceBytes(local_device);
    for (uint64_t off = 0; off < r.length; off += slice_bytes) {
      Slice s;
      s.op = r.op;
      s.local = static_cast<uint8_t*>(r.local) + off;
      s.offset = r.offset + off;
      s.length = std::min<uint64_t>(slice_bytes, r.length - off);
      s.local_device = local_device;
      s.deadline = deadline;
      s.latency = latency;
      s.batch = batch;
      s.request = static_cast<uint32_t>(i);
      batch->slices.push_back(s);
    }
  }
  size_t next_slice = 0;
  size_t i = 0;
  while (i < requests.size()) {
    OpenedSegment* seg = batch->request_segment[i];
    if (seg == nullptr) {
      ++i;
      continue;
    }
    batch->dispatch.clear();
    for (; i < requests.size() &&
           (batch->request_segment[i] == seg || batch->request_segment[i] == nullptr);
         ++i) {
      if (batch->request_segment[i] == nullptr) continue;
      uint64_t n = SliceCount(requests[i].length, batch->local_device[i] != 0);
      for (uint64_t k = 0; k < n; ++k) batch->dispatch.push_back(&batch->slices[next_slice++]);
    }
    // Transports copy what they keep of the span; no one else can reach this batch before
    // Submit returns its id, so reusing `dispatch` for the next run is safe.
    Dispatch(seg->routes[0].transport, *seg->primary, batch->dispatch);
  }
  return id;
}

std::shared_ptr<RemoteSegment> Engine::NextRoute(OpenedSegment* segment, uint32_t* attempt) {
  MutexLock lock(segment->mu);
  for (uint32_t next = *attempt + 1; next < segment->routes.size(); ++next) {
    Transport* transport = segment->routes[next].transport;
    OpenedSegment::Fallback& fallback = segment->fallbacks[next - 1];
    if (fallback.failed) continue;
    if (!fallback.remote) {
      auto remote = transport->Open(segment->descriptor);
      if (!remote.ok()) {
        fallback.failed = true;
        Log().warn("fallback route {} to segment '{}' failed to open: {}", transport->name(),
                   segment->descriptor.name, remote.status().ToString());
        continue;
      }
      fallback.remote = std::move(remote).value();
    }
    *attempt = next;
    return fallback.remote;
  }
  return nullptr;
}

void Engine::OnSliceDone(Slice* slice, Status status) {
  auto* batch = static_cast<BatchState*>(slice->batch);
  OpenedSegment* segment = batch->request_segment[slice->request];
  const OpenedSegment::Route& used = segment->routes[slice->attempt];
  RouteKind route = used.kind;
  if (!status.ok() && IsRetryable(status) && Clock::now() < slice->deadline) {
    uint32_t attempt = slice->attempt;
    if (std::shared_ptr<RemoteSegment> remote = NextRoute(segment, &attempt)) {
      Transport* next = segment->routes[attempt].transport;
      WarnOnce("retry/" + segment->descriptor.engine_id + "/" + std::string(next->name()),
               "slice to segment '" + segment->descriptor.name + "' failed on " +
                   std::string(RouteKindName(route)) + " (" + status.ToString() +
                   "); retrying on " + std::string(next->name()));
      slice->attempt = attempt;
      Slice* one[1] = {slice};
      Dispatch(next, *remote, one);
      return;
    }
  }
  FinishSlice(batch, slice, status, used);
}

void Engine::FinishSlice(BatchState* batch, Slice* slice, const Status& status,
                         const OpenedSegment::Route& used) {
  const bool staged = slice->local_device && used.transport != device_transport_;
  const RouteKind route = staged ? used.staged_kind : used.kind;
  PeerCounters* peer = staged ? used.staged_counters : used.counters;
  PeerCounters::Op& counters = slice->op == TransferOp::kRead ? peer->reads : peer->writes;
  if (status.ok()) counters.bytes.fetch_add(slice->length, std::memory_order_relaxed);
  RequestProgress& p = batch->progress[slice->request];
  // When this is the request's last slice no other thread touches its counters, so plain
  // stores replace read-modify-writes (the common single-slice case stays cheap).
  bool last_slice = p.pending_slices.load(std::memory_order_acquire) == 1;
  if (status.ok()) {
    if (last_slice) {
      p.bytes.store(p.bytes.load(std::memory_order_relaxed) + slice->length,
                    std::memory_order_relaxed);
    } else {
      p.bytes.fetch_add(slice->length, std::memory_order_relaxed);
    }
    p.route.store(
        static_cast<uint8_t>((slice->attempt + 1) | (staged ? RequestProgress::kStagedRoute : 0)),
        std::memory_order_relaxed);
  } else {
    MutexLock lock(batch->mu);
    if (p.status.ok()) {
      p.status = status.WithContext("request " + std::to_string(slice->request) + " via " +
                                    std::string(RouteKindName(route)));
      batch->failed_requests.fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (last_slice) {
    p.pending_slices.store(0, std::memory_order_release);
  } else if (p.pending_slices.fetch_sub(1, std::memory_order_acq_rel) != 1) {
    return;
  }
  counters.requests.fetch_add(1, std::memory_order_relaxed);
  if (batch->failed_requests.load(std::memory_order_relaxed) > 0) {
    MutexLock lock(batch->mu);
    if (!p.status.ok()) counters.failures.fetch_add(1, std::memory_order_relaxed);
  }
  if (batch->pending_requests.load(std::memory_order_acquire) == 1) {
    batch->pending_requests.store(0, std::memory_order_seq_cst);
  } else if (batch->pending_requests.fetch_sub(1) != 1) {
    return;
  }
  if (batch->waiters.load() > 0) {
    MutexLock lock(batch->mu);
    batch->cv.SignalAll();
  }
}

Result<bool> Engine::Poll(BatchId id) {
  BatchState* batch = batches_.Find(id);
  if (batch == nullptr) return NotFoundError("no batch " + std::to_string(id));
  return batch->pending_requests.load() == 0;
}

Status Engine::Wait(BatchId id, std::chrono::milliseconds timeout) {
  BatchState* batch = batches_.Find(id);
  if (batch == nullptr) return NotFoundError("no batch " + std::to_string(id));
  if (batch->pending_requests.load() == 0) return Status();
  batch->waiters.fetch_add(1);
  bool done;
  {
    MutexLock lock(batch->mu);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (batch->pending_requests.load() != 0 && batch->cv.WaitUntil(lock, deadline)) {
    }
    done = batch->pending_requests.load() == 0;
  }
  batch->waiters.fetch_sub(1);
  if (done) return Status();
  return DeadlineExceededError("batch " + std::to_string(id) + ": " +
                               std::to_string(batch->pending_requests.load()) + " of " +
                               std::to_string(batch->count) + " requests still running after " +
                               std::to_string(timeout.count()) + " ms");
}

Result<std::vector<TransferResult>> Engine::Results(BatchId id) {
  BatchState* batch = batches_.Find(id);
  if (batch == nullptr) return NotFoundError("no batch " + std::to_string(id));
  if (batch->pending_requests.load() != 0) {
    return FailedPreconditionError("batch " + std::to_string(id) + " is still running");
  }
  std::vector<TransferResult> out(batch->count);
  MutexLock lock(batch->mu);
  for (size_t i = 0; i < batch->count; ++i) {
    out[i].status = batch->progress[i].status;
    out[i].bytes = batch->progress[i].bytes.load(std::memory_order_relaxed);
    // progress.route is 1 + the index of the route (in the request's segment) that moved bytes.
    const uint8_t route = batch->progress[i].route.load(std::memory_order_relaxed);
    const uint8_t used = route & ~RequestProgress::kStagedRoute;
    const OpenedSegment* segment = batch->request_segment[i];
    if (used != 0 && segment != nullptr && used <= segment->routes.size()) {
      const OpenedSegment::Route& r = segment->routes[used - 1];
      out[i].route = (route & RequestProgress::kStagedRoute) != 0 ? r.staged_kind : r.kind;
    }
  }
  return out;
}

Status Engine::BatchStatus(BatchId id) {
  BatchState* batch = batches_.Find(id);
  if (batch == nullptr) return NotFoundError("no batch " + std::to_string(id));
  if (batch->pending_requests.load() != 0) {
    return FailedPreconditionError("batch " + std::to_string(id) + " is still running");
  }
  if (batch->failed_requests.load() == 0) return Status();
  MutexLock lock(batch->mu);
  for (size_t i = 0; i < batch->count; ++i) {
    if (!batch->progress[i].status.ok()) return batch->progress[i].status;
  }
  return Status();
}

}  // namespace

Result<std::vector<std::unique_ptr<Transport>>> CreateTransports(
    const std::vector<RouteKind>& routes) {
  std::vector<std::unique_ptr<Transport>> transports;
  for (RouteKind route : routes) {
    const TransportFactory* factory = TransportRegistry::Global().Find(route.name());
    if (factory == nullptr) {
      return UnimplementedError("no transport '" + std::string(route.name()) +
                                "' is built into this binary (it has: " +
                                TransportRegistry::Global().ProtocolNames() + ")");
    }
    transports.push_back(factory->create(TransportSelection{.named = true}));
  }
  return transports;
}

Result<std::unique_ptr<TransferEngine>> CreateEngineWithTransports(
    const TransferEngineOptions& options, std::vector<std::unique_ptr<Transport>> transports) {
  if (transports.empty()) return InvalidArgumentError("an engine needs at least one transport");
  auto engine = std::make_unique<Engine>(options, std::move(transports));
  LARDER_RETURN_IF_ERROR(engine->Init());
  return std::unique_ptr<TransferEngine>(std::move(engine));
}

}  // namespace transfer

Result<std::unique_ptr<TransferEngine>> TransferEngine::Create(
    const TransferEngineOptions& options) {
  std::string protocol = ResolveProtocol(options.role, options.protocol);
  LARDER_ASSIGN_OR_RETURN(auto selected, transfer::TransportRegistry::Global().Select(protocol));
  std::vector<std::unique_ptr<transfer::Transport>> transports;
  for (const transfer::SelectedTransport& s : selected) {
    transports.push_back(s.factory->create(s.selection));
  }
  return transfer::CreateEngineWithTransports(options, std::move(transports));
}

Result<std::vector<TransferResult>> TransferEngine::TransferSync(
    std::span<const TransferRequest> requests, std::chrono::milliseconds timeout) {
  LARDER_ASSIGN_OR_RETURN(BatchId batch, Submit(requests, timeout));
  // Every request ends by its deadline (slices in flight fail then), so this loop terminates;
  // waiting to the end keeps the batch releasable and the caller's buffers untouched afterwards.
  while (!Wait(batch, std::chrono::seconds(1)).ok()) {
  }
  auto results = Results(batch);
  LARDER_RETURN_IF_ERROR(Release(batch));
  return results;
}

}  // namespace larder
