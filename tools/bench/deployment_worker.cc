// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "bench/deployment_worker.h"

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
#include <random>
#include <thread>

#include "bench/process.h"
#include "bench/values.h"
#include "larder/store_client.h"
#include "larder/transfer_engine.h"

namespace larder::bench {
namespace {

using json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

constexpr RouteKind kRoutes[] = {RouteKind::kLocal, RouteKind::kSameHostShm, RouteKind::kTcp,
                                 RouteKind::kDevice};

// One JSON line on stdout; lines of different threads never interleave.
void Emit(const json& line) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::cout << line.dump(-1, ' ', false, json::error_handler_t::replace) << std::endl;
}

double SecondsSince(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

std::string PdPageKey(const std::string& prefill, uint64_t page) {
  return "pd/" + prefill + "/" + std::to_string(page);
}

// Reads commands from stdin until quit or EOF, handing each parsed command to `handle`.
template <typename Handler>
void CommandLoop(Handler handle) {
  std::string line;
  while (std::getline(std::cin, line)) {
    json cmd = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!cmd.is_object()) {
      std::cerr << "deployment worker: ignoring a command that is not a JSON object: " << line
                << "\n";
      continue;
    }
    if (cmd.value("cmd", "") == "quit") return;
    try {
      handle(cmd);
    } catch (const json::exception& e) {
      std::cerr << "deployment worker: bad command " << line << ": " << e.what() << "\n";
    }
  }
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
    pd_options.role = EngineRole::kStandalone;  // LARDER_PROTOCOL, else auto
    pd_options.listen_address = options_.pd_listen;
    LARDER_ASSIGN_OR_RETURN(pd_engine_, TransferEngine::Create(pd_options));
    uint64_t pages = options_.pd_segment_size / options_.pd_page_size;
    LARDER_ASSIGN_OR_RETURN(pd_memory_,
                            pd_engine_->AllocateSegmentMemory(pages * options_.pd_page_size));
    auto* base = static_cast<std::byte*>(pd_memory_->data());
    for (uint64_t i = 0; i < pages; ++i) {
      FillValue(PdPageKey(options_.name, i),
                std::span(base + i * options_.pd_page_size, options_.pd_page_size));
    }
    LARDER_RETURN_IF_ERROR(pd_engine_->RegisterSegment("pd", pd_memory_).status());

    capacity_pages_ = std::max<uint64_t>(options_.segment_size / options_.page_size / 2, 1);
    load_thread_ = std::thread([this] { LoadLoop(); });
    return Status::Ok();
  }

  json Ready() const {
    return {{"name", options_.name},
            {"pd", pd_engine_->address()},
            {"pd_engine_id", pd_engine_->id()},
            {"client_id", client_->client_id()},
            {"segment", client_->segment_name()},
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
      {
        std::lock_guard<std::mutex> lock(mu_);
        load_ = cmd.value("on", false);
      }
      cv_.notify_all();
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
    json by_route = json::object();
    json requests_by_route = json::object();
    for (RouteKind route : kRoutes) {
      TransferCounters counters = stats.ByRoute(route);
      if (counters.requests == 0) continue;
      by_route[std::string(RouteKindName(route))] = counters.bytes;
      requests_by_route[std::string(RouteKindName(route))] = counters.requests;
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
      TransferCounters tcp = stats.ByPeer(peer_id_, RouteKind::kTcp);
      same_host_tcp = tcp.bytes;
    }
    line["same_host_tcp_bytes"] = same_host_tcp;
    line["failures"] = failures_;
    line["first_error"] = first_error_;
    return line;
  }

 private:
  void CountFailure(const std::string& kind, const std::string& message) {
    std::lock_guard<std::mutex> lock(mu_);
    failures_[kind] = failures_.value(kind, 0) + 1;
    if (first_error_.empty()) first_error_ = options_.name + ": " + message;
  }

  // Waits while not loaded; false when stopping.
  bool WaitForLoad() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return stop_ || load_; });
    return !stop_;
  }

  void LoadLoop() {
    std::mt19937_64 rng(KeyHash(options_.name) ^ static_cast<uint64_t>(getpid()));
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
        FillValue(keys.back(), std::span(slot, page));
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
        if (VerifyValue(keys[j], value)) {
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
  json routes = json::object();
  std::map<std::string, PrefillCounters> by_prefill;
  std::vector<double> new_latencies_ms;  // since the last line
};

class Decode {
 public:
  explicit Decode(DeploymentDecodeOptions options) : options_(std::move(options)) {}

  ~Decode() {
    Stop();
    if (engine_ != nullptr && !buffer_.empty()) {
      engine_->UnregisterLocalMemory(buffer_.data()).IgnoreError();
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
    TransferEngineOptions engine_options;
    engine_options.role = EngineRole::kStandalone;
    engine_options.listen_address = options_.listen;
    LARDER_ASSIGN_OR_RETURN(engine_, TransferEngine::Create(engine_options));
    buffer_.assign(options_.pd_pages * options_.pd_page_size, std::byte{0});
    LARDER_RETURN_IF_ERROR(engine_->RegisterLocalMemory(buffer_.data(), buffer_.size()));
    for (Target& target : targets_) {
      // A prefill that cannot be opened now is retried by each of its requests.
      Status opened = Open(target);
      if (!opened.ok()) std::cerr << "deployment-decode: " << opened << "\n";
    }
    thread_ = std::thread([this] { Loop(); });
    return Status::Ok();
  }

  json Ready() const {
    return {{"name", "decode"}, {"pd", engine_->address()}, {"host_id", engine_->host_id()}};
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
    if (!target.open) failed = Open(target);
    if (failed.ok()) {
      std::vector<TransferRequest> requests(options_.pd_pages);
      std::vector<uint64_t> pages(options_.pd_pages);
      for (size_t j = 0; j < options_.pd_pages; ++j) {
        pages[j] = rng() % target.pages;
        std::byte* slot = buffer_.data() + j * options_.pd_page_size;
        std::memset(slot, 0, std::min<size_t>(options_.pd_page_size, 16));
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
      if (!failed.ok()) {
        failed = failed.WithContext(target.name + " (" + target.address + ")");
      } else {
        for (size_t j = 0; j < options_.pd_pages; ++j) {
          auto page = std::span<const std::byte>(buffer_.data() + j * options_.pd_page_size,
                                                 options_.pd_page_size);
          if (VerifyValue(PdPageKey(target.name, pages[j]), page)) {
            verified += options_.pd_page_size;
          } else {
            ++wrong;
          }
        }
      }
    }
    double ms = std::chrono::duration<double, std::milli>(SteadyClock::now() - start).count();

    std::lock_guard<std::mutex> lock(mu_);
    PhaseCounters& phase = phases_[phase_];
    PrefillCounters& prefill = phase.by_prefill[target.name];
    if (failed.ok()) phase.bytes += bytes;  // bytes of transfers that completed
    phase.verified_bytes += verified;
    if (route != RouteKind::kNone) {
      std::string name(RouteKindName(route));
      phase.routes[name] = phase.routes.value(name, 0) + 1;
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
  std::vector<std::byte> buffer_;
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
    CommandLoop([&](const json& cmd) { prefill.Handle(cmd); });
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
    CommandLoop([&](const json& cmd) { decode.Handle(cmd); });
  }
  decode.Stop();
  Emit(decode.Snapshot(true));
  return 0;
}

}  // namespace larder::bench
