// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "bench/deployment/deployment_worker.h"

#include "bench/common/json_commands.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <thread>

#include "common/child_process.h"
#include "larder/store_client.h"
#include "larder/transfer_engine.h"
#include "testing/values.h"
#include "transfer/device/device_transport.h"

namespace larder::bench {
namespace {

using json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

// A CPU route to device memory is counted under "<route>-staged"; the hairpin between the
// prefills is tcp either way.
const RouteKind kTcpStaged{"tcp-staged"};

// How long a "load off" command waits for the batch in flight.
constexpr std::chrono::seconds kLoadStopWait{30};

// Host bytes written into device memory per transfer while a PD segment is filled.
constexpr uint64_t kFillChunkBytes = 4ull << 20;

// One JSON line on stdout; lines of different threads never interleave.
void Emit(const json& line) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::cout << line.dump(-1, ' ', false, json::error_handler_t::replace) << std::endl;
}

// Binds device 0 to the calling thread: the device transport of an engine created after this
// initializes there (as a serving process calls cudaSetDevice before its engine starts).
Status BindDevice() { return transfer::DefaultDeviceBackend()->SetCurrentDevice(0); }

// Fails unless `memory` is device memory; `what` says whose, `protocol` which engine gave it.
Status RequireDeviceMemory(const MemoryRegion& memory, const std::string& what,
                           const std::string& protocol) {
  if (memory.kind() == MemoryKind::kDevice) return Status::Ok();
  return FailedPreconditionError(what + " is " + std::string(MemoryKindName(memory.kind())) +
                                 " memory, not device memory: its engine's protocol ('" + protocol +
                                 "') must name device");
}

// The handle of segment `id` of `engine` itself, opened by that engine.
Result<SegmentHandle> OpenOwnSegment(TransferEngine& engine, SegmentId id) {
  for (const SegmentDescriptor& descriptor : engine.ListSegments()) {
    if (descriptor.segment_id == id) return engine.OpenSegment(descriptor);
  }
  return NotFoundError("segment " + std::to_string(id) + " is not exported by this engine");
}

// One transfer through `engine`, waited for: OK when all of it moved.
Status TransferOne(TransferEngine& engine, const TransferRequest& request,
                   std::chrono::milliseconds timeout) {
  auto results = engine.TransferSync(std::span(&request, 1), timeout);
  if (!results.ok()) return results.status();
  return results->at(0).status;
}

double SecondsSince(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

std::string PdPageKey(const std::string& prefill, uint64_t page) {
  return "pd/" + prefill + "/" + std::to_string(page);
}

// Calls `tick` once a second until stopped.
class Ticker {
 public:
  explicit Ticker(std::function<void()> tick)
      : thread_([this, tick = std::move(tick)] {
          std::unique_lock<std::mutex> lock(mu_);
          while (!cv_.wait_for(lock, std::chrono::seconds(1), [this] { return stop_; })) {
            lock.unlock();
            tick();
            lock.lock();
          }
        }) {}
  ~Ticker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

// ---------------------------------------------------------------------------------------------
// Prefill

class Prefill {
 public:
  explicit Prefill(DeploymentPrefillOptions options) : options_(std::move(options)) {}

  ~Prefill() {
    StopLoad();
    if (client_ != nullptr) {
      if (!put_buffer_.empty()) client_->UnregisterBuffer(put_buffer_.data()).IgnoreError();
      if (!get_buffer_.empty()) client_->UnregisterBuffer(get_buffer_.data()).IgnoreError();
    }
  }

  Status Start() {
    if (options_.page_size == 0 || options_.batch == 0 || options_.pd_page_size == 0 ||
        options_.pd_segment_size < options_.pd_page_size) {
      return InvalidArgumentError("page sizes and batch must be > 0, pd segment >= one pd page");
    }
    // Both engines' device transports initialize on this thread's device.
    if (options_.device_memory) LARDER_RETURN_IF_ERROR(BindDevice());
    LARDER_ASSIGN_OR_RETURN(StoreClientOptions store_options,
                            StoreClientOptions::FromEnvironment());
    if (!options_.master.empty()) store_options.master_address = options_.master;
    store_options.global_segment_size = options_.segment_size;
    // The bench writes a bounded working set: the RFC's 700 GB segments run on a small machine.
    store_options.sparse_segment = true;
    store_options.segment_name = options_.name;
    LARDER_ASSIGN_OR_RETURN(client_, StoreClient::Create(store_options));

    put_buffer_.assign(options_.batch * options_.page_size, std::byte{0});
    get_buffer_.assign(options_.batch * options_.page_size, std::byte{0});
    LARDER_RETURN_IF_ERROR(client_->RegisterBuffer(put_buffer_.data(), put_buffer_.size()));
    LARDER_RETURN_IF_ERROR(client_->RegisterBuffer(get_buffer_.data(), get_buffer_.size()));

    TransferEngineOptions pd_options;
    pd_options.role = EngineRole::kPd;  // empty protocol: LARDER_PROTOCOL, else auto
    pd_options.protocol = options_.pd_protocol;
    pd_options.listen_address = options_.pd_listen;
    LARDER_ASSIGN_OR_RETURN(pd_engine_, TransferEngine::Create(pd_options));
    uint64_t pages = options_.pd_segment_size / options_.pd_page_size;
    LARDER_ASSIGN_OR_RETURN(pd_memory_,
                            pd_engine_->AllocateSegmentMemory(pages * options_.pd_page_size));
    if (options_.device_memory) {
      LARDER_RETURN_IF_ERROR(RequireDeviceMemory(
          *pd_memory_, "the PD segment", ResolveProtocol(pd_options.role, pd_options.protocol)));
      LARDER_ASSIGN_OR_RETURN(SegmentId pd, pd_engine_->RegisterSegment("pd", pd_memory_));
      LARDER_RETURN_IF_ERROR(WritePdPagesThroughEngine(pd, pages));
    } else {
      auto* base = static_cast<std::byte*>(pd_memory_->data());
      for (uint64_t i = 0; i < pages; ++i) {
        test::FillValue(PdPageKey(options_.name, i),
                        std::span(base + i * options_.pd_page_size, options_.pd_page_size));
      }
      LARDER_RETURN_IF_ERROR(pd_engine_->RegisterSegment("pd", pd_memory_).status());
    }

    capacity_pages_ = std::max<uint64_t>(options_.segment_size / options_.page_size / 2, 1);
    load_thread_ = std::thread([this] { LoadLoop(); });
    return Status::Ok();
  }

  json Ready() const {
    std::string store_memory = "none";
    for (const SegmentDescriptor& descriptor : client_->engine().ListSegments()) {
      if (descriptor.name == client_->segment_name()) {
        store_memory = std::string(MemoryKindName(descriptor.memory_kind));
      }
    }
    return {{"name", options_.name},
            {"pd", pd_engine_->address()},
            {"pd_engine_id", pd_engine_->id()},
            {"pd_memory", std::string(MemoryKindName(pd_memory_->kind()))},
            {"client_id", client_->client_id()},
            {"segment", client_->segment_name()},
            {"store_memory", store_memory},
            {"host_id", client_->engine().host_id()}};
  }

  void Handle(const json& cmd) {
    std::string name = cmd.value("cmd", "");
    if (name == "peer") {
      std::lock_guard<std::mutex> lock(mu_);
      peer_name_ = cmd.value("name", "");
      peer_id_ = cmd.value("client_id", "");
    } else if (name == "hw") {
      uint64_t written = cmd.value("written", uint64_t{0});
      if (written > peer_written_.load()) peer_written_.store(written);
    } else if (name == "load") {
      const bool on = cmd.value("on", false);
      {
        std::unique_lock<std::mutex> lock(mu_);
        load_ = on;
        load_stopped_ = false;
        cv_.notify_all();
        if (!on) {
          // Said once the batch in flight has ended (bounded by the store's own deadlines).
          load_stopped_ = cv_.wait_for(lock, kLoadStopWait, [this] { return !in_batch_; });
        }
      }
      if (!on) Emit(Snapshot(false));
    } else if (name == "peer_gone") {
      peer_gone_.store(true);
    } else {
      std::cerr << options_.name << ": unknown command '" << name << "'\n";
    }
  }

  void StopLoad() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (load_thread_.joinable()) load_thread_.join();
  }

  json Snapshot(bool final) {
    EngineStats stats = client_->engine().Stats();
    std::map<std::string, TransferCounters> routes;
    for (const PeerTransferStats& peer : stats.peers) {
      TransferCounters& counters = routes[RouteKindName(peer.route)];
      counters += peer.reads;
      counters += peer.writes;
    }
    json by_route = json::object();
    json requests_by_route = json::object();
    for (const auto& [route, counters] : routes) {
      if (counters.requests == 0) continue;
      by_route[route] = counters.bytes;
      requests_by_route[route] = counters.requests;
    }
    json line = {{"role", "prefill"},
                 {"name", options_.name},
                 {"t", SecondsSince(start_)},
                 {"puts", puts_.load()},
                 {"put_bytes", puts_.load() * options_.page_size},
                 {"gets", gets_.load()},
                 {"get_bytes", get_bytes_.load()},
                 {"missing", missing_.load()},
                 {"verified_bytes", verified_bytes_.load()},
                 {"wrong", wrong_.load()},
                 {"written", written_.load()},
                 {"bytes_by_route", by_route},
                 {"requests_by_route", requests_by_route},
                 {"mapped_segments", stats.mapped_segments},
                 {"mapped_bytes", stats.mapped_bytes},
                 {"final", final}};
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t same_host_tcp = 0;
    if (!peer_id_.empty()) {
      same_host_tcp =
          stats.ByPeer(peer_id_, RouteKind::kTcp).bytes + stats.ByPeer(peer_id_, kTcpStaged).bytes;
    }
    line["same_host_tcp_bytes"] = same_host_tcp;
    line["load_stopped"] = load_stopped_;
    line["failures"] = failures_;
    line["first_error"] = first_error_;
    return line;
  }

 private:
  // Device memory is not the CPU's to write: the pages are made in a host buffer and written
  // into segment `pd` by the PD engine, a chunk at a time.
  Status WritePdPagesThroughEngine(SegmentId pd, uint64_t pages) {
    const uint64_t page = options_.pd_page_size;
    LARDER_ASSIGN_OR_RETURN(SegmentHandle own, OpenOwnSegment(*pd_engine_, pd));
    const uint64_t per_chunk = std::max<uint64_t>(kFillChunkBytes / page, 1);
    std::vector<std::byte> host(std::min(per_chunk, pages) * page);
    Status status = pd_engine_->RegisterLocalMemory(host.data(), host.size());
    for (uint64_t first = 0; status.ok() && first < pages; first += per_chunk) {
      const uint64_t n = std::min(per_chunk, pages - first);
      for (uint64_t i = 0; i < n; ++i) {
        test::FillValue(PdPageKey(options_.name, first + i),
                        std::span(host.data() + i * page, page));
      }
      status =
          TransferOne(*pd_engine_, {TransferOp::kWrite, host.data(), own, first * page, n * page},
                      std::chrono::seconds(30));
    }
    pd_engine_->UnregisterLocalMemory(host.data()).IgnoreError();
    pd_engine_->CloseSegment(own).IgnoreError();
    return status.WithContext("writing the PD pages into device memory");
  }

  void CountFailure(const std::string& kind, const std::string& message) {
    std::lock_guard<std::mutex> lock(mu_);
    failures_[kind] = failures_.value(kind, 0) + 1;
    if (first_error_.empty()) first_error_ = options_.name + ": " + message;
  }

  // Waits while not loaded; false when stopping.
  bool WaitForLoad() {
    std::unique_lock<std::mutex> lock(mu_);
    in_batch_ = false;
    cv_.notify_all();
    cv_.wait(lock, [this] { return stop_ || load_; });
    in_batch_ = !stop_;
    return !stop_;
  }

  void LoadLoop() {
    std::mt19937_64 rng(test::KeyHash(options_.name) ^ static_cast<uint64_t>(getpid()));
    std::vector<std::string> keys;
    std::vector<void*> ptrs;
    std::vector<size_t> sizes;
    uint64_t next = 0;
    const size_t page = options_.page_size;
    while (WaitForLoad()) {
      // A batch of new pages into the store.
      keys.clear();
      ptrs.clear();
      sizes.clear();
      for (size_t j = 0; j < options_.batch; ++j) {
        keys.push_back(options_.name + "/" + std::to_string(next + j));
        std::byte* slot = put_buffer_.data() + j * page;
        test::FillValue(keys.back(), std::span(slot, page));
        ptrs.push_back(slot);
        sizes.push_back(page);
      }
      std::vector<Status> put = client_->BatchPutFrom(keys, ptrs, sizes);
      for (size_t j = 0; j < put.size(); ++j) {
        if (put[j].ok()) {
          puts_.fetch_add(1);
        } else {
          CountFailure("put." + std::string(StatusCodeName(put[j].code())),
                       "put " + keys[j] + ": " + put[j].ToString());
        }
      }
      next += options_.batch;
      written_.store(next);

      // A batch of the other prefill's recent pages out of the store.
      std::string peer;
      {
        std::lock_guard<std::mutex> lock(mu_);
        peer = peer_name_;
      }
      uint64_t peer_written = peer_written_.load();
      if (peer.empty() || peer_written == 0 || peer_gone_.load()) continue;
      uint64_t window = std::min(peer_written, capacity_pages_);
      keys.clear();
      ptrs.clear();
      sizes.clear();
      for (size_t j = 0; j < options_.batch; ++j) {
        uint64_t seq = peer_written - 1 - rng() % window;
        keys.push_back(peer + "/" + std::to_string(seq));
        std::byte* slot = get_buffer_.data() + j * page;
        std::memset(slot, 0, std::min<size_t>(page, 16));  // a get that moves nothing fails
        ptrs.push_back(slot);
        sizes.push_back(page);
      }
      std::vector<Result<size_t>> got = client_->BatchGetInto(keys, ptrs, sizes);
      for (size_t j = 0; j < got.size(); ++j) {
        if (!got[j].ok()) {
          if (got[j].status().code() == StatusCode::kNotFound) {
            missing_.fetch_add(1);  // evicted (or its put failed, which is counted there)
          } else {
            CountFailure("get." + std::string(StatusCodeName(got[j].status().code())),
                         "get " + keys[j] + ": " + got[j].status().ToString());
          }
          continue;
        }
        get_bytes_.fetch_add(*got[j]);
        auto value = std::span(static_cast<const std::byte*>(ptrs[j]), *got[j]);
        if (test::VerifyValue(keys[j], value)) {
          gets_.fetch_add(1);
          verified_bytes_.fetch_add(*got[j]);
        } else {
          wrong_.fetch_add(1);
          CountFailure("get.wrong", "get " + keys[j] + ": wrong bytes");
        }
      }
    }
  }

  const DeploymentPrefillOptions options_;
  const SteadyClock::time_point start_ = SteadyClock::now();
  std::unique_ptr<StoreClient> client_;
  std::unique_ptr<TransferEngine> pd_engine_;
  std::shared_ptr<MemoryRegion> pd_memory_;
  std::vector<std::byte> put_buffer_;
  std::vector<std::byte> get_buffer_;
  uint64_t capacity_pages_ = 1;
  std::thread load_thread_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool load_ = false;               // guarded by mu_
  bool stop_ = false;               // guarded by mu_
  bool in_batch_ = false;           // guarded by mu_: the load thread is between two waits
  bool load_stopped_ = false;       // guarded by mu_: "load off" done, no batch in flight
  std::string peer_name_;           // guarded by mu_
  std::string peer_id_;             // guarded by mu_
  json failures_ = json::object();  // guarded by mu_
  std::string first_error_;         // guarded by mu_
  std::atomic<uint64_t> peer_written_{0};
  std::atomic<bool> peer_gone_{false};
  std::atomic<uint64_t> puts_{0}, gets_{0}, get_bytes_{0}, missing_{0}, verified_bytes_{0},
      wrong_{0}, written_{0};
};

// ---------------------------------------------------------------------------------------------
// Decode

struct PrefillCounters {
  uint64_t transfers = 0;
  uint64_t failures = 0;
  json codes = json::object();
  std::string first_error;
  double fail_max_ms = 0;
};

struct PhaseCounters {
  uint64_t transfers = 0;
  uint64_t bytes = 0;
  uint64_t verified_bytes = 0;
  uint64_t wrong = 0;
  uint64_t failures = 0;
  json failures_by_kind = json::object();
  json routes = json::object();          // requests by route
  json bytes_by_route = json::object();  // bytes of completed requests by route
  std::map<std::string, PrefillCounters> by_prefill;
  std::vector<double> new_latencies_ms;  // since the last line
};

class Decode {
 public:
  explicit Decode(DeploymentDecodeOptions options) : options_(std::move(options)) {}

  ~Decode() {
    Stop();
    if (engine_ != nullptr && !host_.empty()) {
      engine_->UnregisterLocalMemory(host_.data()).IgnoreError();
    }
  }

  Status Start() {
    if (options_.pd_pages == 0 || options_.pd_page_size == 0) {
      return InvalidArgumentError("--pd-pages and --pd-page-size must be > 0");
    }
    for (const std::string& spec : options_.prefills) {
      size_t eq = spec.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) {
        return InvalidArgumentError("--prefill '" + spec + "': expected name=ip:port");
      }
      targets_.push_back({spec.substr(0, eq), spec.substr(eq + 1)});
    }
    if (targets_.empty()) return InvalidArgumentError("no --prefill given");
    // The engine's device transport initializes on this thread's device.
    if (options_.device_memory) LARDER_RETURN_IF_ERROR(BindDevice());
    TransferEngineOptions engine_options;
    engine_options.role = EngineRole::kPd;  // empty protocol: LARDER_PROTOCOL, else auto
    engine_options.protocol = options_.protocol;
    engine_options.listen_address = options_.listen;
    LARDER_ASSIGN_OR_RETURN(engine_, TransferEngine::Create(engine_options));
    const uint64_t bytes = options_.pd_pages * options_.pd_page_size;
    // Host memory: the KV buffers themselves. Device memory: where the KV buffers' pages are
    // copied to be checked.
    host_.assign(bytes, std::byte{0});
    LARDER_RETURN_IF_ERROR(engine_->RegisterLocalMemory(host_.data(), host_.size()));
    if (options_.device_memory) {
      LARDER_ASSIGN_OR_RETURN(device_kv_, engine_->AllocateSegmentMemory(bytes));
      LARDER_RETURN_IF_ERROR(
          RequireDeviceMemory(*device_kv_, "the KV buffer",
                              ResolveProtocol(engine_options.role, engine_options.protocol)));
      // A segment of its own, so that the engine copies it to host memory (the device route).
      LARDER_ASSIGN_OR_RETURN(SegmentId kv, engine_->RegisterSegment("kv", device_kv_));
      LARDER_ASSIGN_OR_RETURN(kv_handle_, OpenOwnSegment(*engine_, kv));
      kv_ = static_cast<std::byte*>(device_kv_->data());
    } else {
      kv_ = host_.data();
    }
    for (Target& target : targets_) {
      // A prefill that cannot be opened now is retried by each of its requests.
      Status opened = Open(target);
      if (!opened.ok()) std::cerr << "deployment-decode: " << opened << "\n";
    }
    thread_ = std::thread([this] { Loop(); });
    return Status::Ok();
  }

  json Ready() const {
    return {
        {"name", "decode"},
        {"pd", engine_->address()},
        {"host_id", engine_->host_id()},
        {"memory", options_.device_memory ? std::string(MemoryKindName(device_kv_->kind()))
                                          : std::string(MemoryKindName(MemoryKind::kAnonymous))}};
  }

  void Handle(const json& cmd) {
    if (cmd.value("cmd", "") == "phase") {
      std::lock_guard<std::mutex> lock(mu_);
      phase_ = cmd.value("phase", phase_);
      phases_[phase_];
      return;
    }
    std::cerr << "deployment-decode: unknown command " << cmd.dump() << "\n";
  }

  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }

  json Snapshot(bool final) {
    std::lock_guard<std::mutex> lock(mu_);
    json phases = json::object();
    for (auto& [name, phase] : phases_) {
      json by_prefill = json::object();
      for (const auto& [prefill, counters] : phase.by_prefill) {
        by_prefill[prefill] = {{"transfers", counters.transfers},
                               {"failures", counters.failures},
                               {"codes", counters.codes},
                               {"first_error", counters.first_error},
                               {"fail_max_ms", counters.fail_max_ms}};
      }
      phases[name] = {{"transfers", phase.transfers},
                      {"bytes", phase.bytes},
                      {"verified_bytes", phase.verified_bytes},
                      {"wrong", phase.wrong},
                      {"failures", phase.failures},
                      {"failures_by_kind", phase.failures_by_kind},
                      {"routes", phase.routes},
                      {"bytes_by_route", phase.bytes_by_route},
                      {"by_prefill", by_prefill},
                      {"lat_ms", phase.new_latencies_ms}};
      phase.new_latencies_ms.clear();
    }
    return {{"role", "decode"},
            {"t", SecondsSince(start_)},
            {"phase", phase_},
            {"phases", phases},
            {"final", final}};
  }

 private:
  struct Target {
    std::string name;
    std::string address;
    bool open = false;
    SegmentHandle handle = 0;
    uint64_t pages = 0;
  };

  Status Open(Target& target) {
    auto described = engine_->ListPeerSegments(target.address, options_.timeout);
    if (!described.ok()) {
      return described.status().WithContext(target.name + " (" + target.address + ")");
    }
    for (const SegmentDescriptor& descriptor : *described) {
      if (descriptor.name != "pd") continue;
      auto handle = engine_->OpenSegment(descriptor);
      if (!handle.ok()) {
        return handle.status().WithContext(target.name + " (" + target.address + "): open pd");
      }
      target.handle = *handle;
      target.pages = descriptor.size / options_.pd_page_size;
      if (target.pages == 0) {
        return FailedPreconditionError(target.name + ": pd segment smaller than a pd page");
      }
      target.open = true;
      return Status::Ok();
    }
    return NotFoundError(target.name + " (" + target.address + ") exports no segment 'pd'");
  }

  // One PD request against `target`: read pd_pages random pages, verify them. Its latency counts
  // from `start`, the time it was due.
  void Request(Target& target, std::mt19937_64& rng, SteadyClock::time_point start) {
    Status failed = Status::Ok();
    RouteKind route = RouteKind::kNone;
    uint64_t bytes = 0, verified = 0, wrong = 0;  // wrong: pages that failed verification
    std::optional<double> landed_ms;              // device memory: when the pull landed
    if (!target.open) failed = Open(target);
    if (failed.ok()) {
      std::vector<TransferRequest> requests(options_.pd_pages);
      std::vector<uint64_t> pages(options_.pd_pages);
      for (size_t j = 0; j < options_.pd_pages; ++j) {
        pages[j] = rng() % target.pages;
        std::byte* slot = kv_ + j * options_.pd_page_size;
        // A pull that moves nothing fails the check (device slots are cleared after each request).
        if (!options_.device_memory) {
          std::memset(slot, 0, std::min<size_t>(options_.pd_page_size, 16));
        }
        requests[j] = {TransferOp::kRead, slot, target.handle, pages[j] * options_.pd_page_size,
                       options_.pd_page_size};
      }
      auto results = engine_->TransferSync(requests, options_.timeout);
      if (!results.ok()) {
        failed = results.status();
      } else {
        for (const TransferResult& result : *results) {
          bytes += result.bytes;
          if (!result.status.ok() && failed.ok()) failed = result.status;
          if (result.route != RouteKind::kNone) route = result.route;
        }
      }
      if (failed.ok() && options_.device_memory) {
        landed_ms = MillisecondsSince(start);
        failed = CopyKvToHost();
      }
      if (!failed.ok()) {
        failed = failed.WithContext(target.name + " (" + target.address + ")");
      } else {
        for (size_t j = 0; j < options_.pd_pages; ++j) {
          auto page = std::span<const std::byte>(host_.data() + j * options_.pd_page_size,
                                                 options_.pd_page_size);
          if (test::VerifyValue(PdPageKey(target.name, pages[j]), page)) {
            verified += options_.pd_page_size;
          } else {
            ++wrong;
          }
        }
      }
    }
    double ms = landed_ms.value_or(MillisecondsSince(start));
    if (options_.device_memory) {
      // After a failed request too: some of its pages may have landed.
      Status cleared = ClearDeviceSlots();
      if (!cleared.ok() && failed.ok()) {
        failed = cleared.WithContext("clearing the KV buffer's slots");
        verified = 0;  // a failed request counts no bytes read
      }
    }

    std::lock_guard<std::mutex> lock(mu_);
    PhaseCounters& phase = phases_[phase_];
    PrefillCounters& prefill = phase.by_prefill[target.name];
    if (failed.ok()) phase.bytes += bytes;  // bytes of transfers that completed
    phase.verified_bytes += verified;
    if (route != RouteKind::kNone) {
      std::string name(RouteKindName(route));
      phase.routes[name] = phase.routes.value(name, 0) + 1;
      if (failed.ok()) {
        phase.bytes_by_route[name] = phase.bytes_by_route.value(name, uint64_t{0}) + bytes;
      }
    }
    std::string kind;
    std::string message;
    if (!failed.ok()) {
      kind = std::string(StatusCodeName(failed.code()));
      message = failed.ToString();
    } else if (wrong > 0) {
      phase.wrong += wrong;
      kind = "wrong";
      message = target.name + " (" + target.address + "): " + std::to_string(wrong) +
                " pages with wrong bytes";
    }
    if (kind.empty()) {
      ++phase.transfers;
      ++prefill.transfers;
      phase.new_latencies_ms.push_back(ms);
      return;
    }
    ++phase.failures;
    ++prefill.failures;
    std::string full_kind = target.name + "." + kind;
    phase.failures_by_kind[full_kind] = phase.failures_by_kind.value(full_kind, 0) + 1;
    prefill.codes[kind] = prefill.codes.value(kind, 0) + 1;
    if (prefill.first_error.empty()) prefill.first_error = message;
    prefill.fail_max_ms = std::max(prefill.fail_max_ms, ms);
  }

  static double MillisecondsSince(SteadyClock::time_point start) {
    return std::chrono::duration<double, std::milli>(SteadyClock::now() - start).count();
  }

  // Device memory: the engine copies the KV buffer to host_ (over the device route), where the
  // pages are checked. The head of each host page is cleared first, so that a copy that moves
  // nothing fails the check.
  Status CopyKvToHost() {
    for (size_t j = 0; j < options_.pd_pages; ++j) {
      std::memset(host_.data() + j * options_.pd_page_size, 0,
                  std::min<size_t>(options_.pd_page_size, 16));
    }
    return TransferOne(*engine_, {TransferOp::kRead, host_.data(), kv_handle_, 0, host_.size()},
                       options_.timeout)
        .WithContext("copying the KV buffer to host memory to check it");
  }

  // Device memory: the engine writes zeros over the head of each slot of the KV buffer, so that
  // the next pull into it that moves nothing fails the check.
  Status ClearDeviceSlots() {
    const size_t head = std::min<size_t>(options_.pd_page_size, 16);
    std::memset(host_.data(), 0, head);
    std::vector<TransferRequest> requests(options_.pd_pages);
    for (size_t j = 0; j < options_.pd_pages; ++j) {
      requests[j] = {TransferOp::kWrite, host_.data(), kv_handle_, j * options_.pd_page_size, head};
    }
    auto results = engine_->TransferSync(requests, options_.timeout);
    if (!results.ok()) return results.status();
    for (const TransferResult& result : *results) LARDER_RETURN_IF_ERROR(result.status);
    return Status::Ok();
  }

  void Loop() {
    std::mt19937_64 rng(static_cast<uint64_t>(getpid()));
    const auto interval = std::chrono::duration_cast<SteadyClock::duration>(
        std::chrono::duration<double>(options_.rate > 0 ? 1.0 / options_.rate : 0.0));
    SteadyClock::time_point due = SteadyClock::now();
    for (size_t i = 0; !stop_.load(); ++i) {
      if (options_.rate > 0) {
        // Sleep in short steps so that a stop is noticed; a request late behind a slow one
        // starts at once, and its latency includes the wait.
        for (auto now = SteadyClock::now(); now < due && !stop_.load(); now = SteadyClock::now()) {
          std::this_thread::sleep_for(std::min<SteadyClock::duration>(due - now, kStopCheck));
        }
        if (stop_.load()) break;
      } else {
        due = SteadyClock::now();
      }
      Request(targets_[i % targets_.size()], rng, due);
      due += interval;
    }
  }

  static constexpr std::chrono::milliseconds kStopCheck{50};

  const DeploymentDecodeOptions options_;
  const SteadyClock::time_point start_ = SteadyClock::now();
  std::unique_ptr<TransferEngine> engine_;
  // Host memory the pages are checked in (the KV buffers themselves without device memory).
  std::vector<std::byte> host_;
  // Device memory: the KV buffers, exported as this engine's segment "kv" and opened by it.
  std::shared_ptr<MemoryRegion> device_kv_;
  SegmentHandle kv_handle_ = 0;
  std::byte* kv_ = nullptr;      // the KV buffers: one page per slot
  std::vector<Target> targets_;  // used by the request thread only, after Start
  std::thread thread_;
  std::atomic<bool> stop_{false};

  std::mutex mu_;
  std::string phase_ = "idle";                   // guarded by mu_
  std::map<std::string, PhaseCounters> phases_;  // guarded by mu_
};

}  // namespace

int RunDeploymentPrefill(const DeploymentPrefillOptions& options) {
  Prefill prefill(options);
  Status started = prefill.Start();
  if (!started.ok()) {
    std::cerr << "deployment-prefill " << options.name << ": " << started << "\n";
    return 1;
  }
  AnnounceReady(prefill.Ready().dump());
  {
    Ticker ticker([&] { Emit(prefill.Snapshot(false)); });
    ServeJsonCommands([&](const json& cmd) {
      prefill.Handle(cmd);
      return json();
    });
  }
  prefill.StopLoad();
  Emit(prefill.Snapshot(true));
  return 0;
}

int RunDeploymentDecode(const DeploymentDecodeOptions& options) {
  Decode decode(options);
  Status started = decode.Start();
  if (!started.ok()) {
    std::cerr << "deployment-decode: " << started << "\n";
    return 1;
  }
  AnnounceReady(decode.Ready().dump());
  {
    Ticker ticker([&] { Emit(decode.Snapshot(false)); });
    ServeJsonCommands([&](const json& cmd) {
      decode.Handle(cmd);
      return json();
    });
  }
  decode.Stop();
  Emit(decode.Snapshot(true));
  return 0;
}

}  // namespace larder::bench
