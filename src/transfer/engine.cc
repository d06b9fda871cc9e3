// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The transfer engine: start-up, the segments it exports and opens, its counters (engine_impl.h;
// batches are in engine_batches.cc).
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>

#include "common/env.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/priority.h"
#include "transfer/bootstrap.h"
#include "transfer/engine_impl.h"
#include "transfer/engine_internal.h"
#include "transfer/transport_registry.h"

namespace larder {
namespace transfer {
namespace {

// The route name of traffic that `route` carried through pinned host staging.
RouteKind StagedRoute(RouteKind route) {
  return RouteKind(std::string(RouteKindName(route)) + "-staged");
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

}  // namespace

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
