// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "larder/store_client.h"

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <unordered_map>

#include "client/master_client.h"
#include "common/env.h"
#include "common/logging.h"

namespace larder {

Result<StoreClientOptions> StoreClientOptions::FromEnvironment() {
  StoreClientOptions options;
  auto set_string = [](const char* name, std::string* field) {
    std::string value = GetEnv(name);
    if (!value.empty()) *field = value;
  };
  set_string("LARDER_MASTER", &options.master_address);
  set_string("LARDER_LOCAL_HOSTNAME", &options.local_hostname);
  set_string("LARDER_SEGMENT_NAME", &options.segment_name);
  set_string("LARDER_AUTH_TOKEN", &options.auth_token);
  set_string("LARDER_ADMIN_TOKEN", &options.admin_token);
  set_string("LARDER_TLS_CA", &options.tls_ca_file);
  set_string("LARDER_TLS_CERT", &options.tls_cert_file);
  set_string("LARDER_TLS_KEY", &options.tls_key_file);
  set_string("LARDER_HOST_ID", &options.host_id);
  for (auto [name, field] : {std::pair{"LARDER_GLOBAL_SEGMENT_SIZE", &options.global_segment_size},
                             std::pair{"LARDER_LOCAL_BUFFER_SIZE", &options.local_buffer_size}}) {
    std::string value = GetEnv(name);
    if (value.empty()) continue;
    auto parsed = ParseByteSize(value, /*allow_zero=*/true);
    if (!parsed.ok()) return parsed.status().WithContext(name);
    *field = *parsed;
  }
  if (std::string value = GetEnv("LARDER_LEASE_RELEASE_DELAY"); !value.empty()) {
    auto parsed = ParseDuration(value);
    if (!parsed.ok()) return parsed.status().WithContext("LARDER_LEASE_RELEASE_DELAY");
    options.lease_release_delay = *parsed;
  }
  if (std::string value = GetEnv("LARDER_REPLICA_NUM"); !value.empty()) {
    char* end = nullptr;
    unsigned long n = std::strtoul(value.c_str(), &end, 10);
    if (end == value.c_str() || *end != '\0' || n == 0 || n > 64) {
      return InvalidArgumentError("LARDER_REPLICA_NUM: '" + value + "' is not a number in 1..64");
    }
    options.replica_num = static_cast<uint32_t>(n);
  }
  return options;
}

namespace {

using client::CheckReplicaColumns;
using client::FromItemStatus;
using client::ItemStatuses;
using client::MasterClient;
using Stub = proto::Master::Stub;
using SteadyClock = std::chrono::steady_clock;

// Largest batch of one call: the master's limit (kMaxBatchItems) and the engine's default
// max_batch_requests. A put past it is refused before the master allocates anything for it.
constexpr size_t kMaxBatch = 65536;

Status BatchTooLarge(size_t items) {
  return InvalidArgumentError("a batch of " + std::to_string(items) +
                              " keys exceeds the maximum of " + std::to_string(kMaxBatch) +
                              "; split it");
}

// Lower is better: same process, then same host, then the network.
int RouteRank(RouteKind route) {
  switch (route) {
    case RouteKind::kLocal:
      return 0;
    case RouteKind::kSameHostShm:
    case RouteKind::kDevice:
      return 1;
    default:
      return 2;
  }
}

struct OpenedSegment {
  SegmentHandle handle = 0;
  int rank = 2;
};

// The segments one batch touches, by master segment id: a few, so a flat list beats a map.
class OpenedSegments {
 public:
  const OpenedSegment* Find(uint64_t id) const {
    for (const auto& [key, segment] : list_) {
      if (key == id) return &segment;
    }
    return nullptr;
  }
  void Add(uint64_t id, OpenedSegment segment) {
    if (Find(id) == nullptr) list_.emplace_back(id, segment);
  }
  void Erase(uint64_t id) {
    std::erase_if(list_, [id](const auto& entry) { return entry.first == id; });
  }
  // Lower is better; segments that are not open rank last.
  int RankOf(uint64_t id) const {
    const OpenedSegment* segment = Find(id);
    return segment == nullptr ? 3 : segment->rank;
  }

 private:
  std::vector<std::pair<uint64_t, OpenedSegment>> list_;
};

class StoreClientImpl final : public StoreClient {
 public:
  StoreClientImpl(StoreClientOptions options, std::unique_ptr<TransferEngine> engine)
      : options_(std::move(options)),
        engine_(std::move(engine)),
        master_(MasterOptionsFor(options_, engine_->id())) {}

  static client::MasterClientOptions MasterOptionsFor(const StoreClientOptions& options,
                                                      const std::string& client_id) {
    auto option_or_env = [](const std::string& option, const char* variable) {
      return option.empty() ? GetEnv(variable) : option;
    };
    client::MasterClientOptions out;
    out.address = options.master_address;
    out.timeout = options.rpc_timeout;
    out.client_id = client_id;
    out.auth_token = option_or_env(options.auth_token, "LARDER_AUTH_TOKEN");
    out.admin_token = option_or_env(options.admin_token, "LARDER_ADMIN_TOKEN");
    out.tls_ca_file = option_or_env(options.tls_ca_file, "LARDER_TLS_CA");
    return out;
  }

  ~StoreClientImpl() override {
    {
      std::lock_guard lock(heartbeat_mu_);
      stopping_ = true;
    }
    heartbeat_cv_.notify_all();
    if (heartbeat_.joinable()) heartbeat_.join();
    {
      std::lock_guard lock(release_mu_);
      release_stopping_ = true;
    }
    release_cv_.notify_all();
    if (releaser_.joinable()) releaser_.join();
    SendReleases(TakeReleases());
    proto::UnmountSegmentsRequest request;
    proto::UnmountSegmentsReply reply;
    request.set_client_id(engine_->id());
    if (master_segment_id_ != 0) request.add_segment_id(master_segment_id_);
    request.set_unregister_client(true);
    Status status = master_.Call("UnmountSegments", &Stub::UnmountSegments, request, &reply);
    if (!status.ok()) Log().debug("leaving the master: {}", status.ToString());
  }

  Status Init() {
    if (options_.global_segment_size > 0) {
      LARDER_ASSIGN_OR_RETURN(segment_memory_,
                              engine_->AllocateSegmentMemory(options_.global_segment_size));
      segment_name_ = options_.segment_name;
      if (segment_name_.empty()) {
        segment_name_ = engine_->address().empty() ? engine_->id() : engine_->address();
      }
      LARDER_ASSIGN_OR_RETURN(local_segment_,
                              engine_->RegisterSegment(segment_name_, segment_memory_));
      for (const SegmentDescriptor& descriptor : engine_->ListSegments()) {
        if (descriptor.segment_id == local_segment_) descriptor_json_ = descriptor.ToJson();
      }
    }
    LARDER_RETURN_IF_ERROR(Mount(mount_generation_));
    heartbeat_ = std::thread([this] { HeartbeatLoop(); });
    releaser_ = std::thread([this] { ReleaseLoop(); });
    return Status::Ok();
  }

  const std::string& segment_name() const override { return segment_name_; }
  const std::string& client_id() const override { return engine_->id(); }
  TransferEngine& engine() override { return *engine_; }

  // ---- copying API ----

  Status Put(std::string_view key, std::span<const std::byte> value,
             const PutConfig& config) override {
    std::string k(key);
    const void* ptr = value.data();
    size_t size = value.size();
    return PutImpl(std::span(&k, 1), std::span(&ptr, 1), std::span(&size, 1), config)[0];
  }

  Result<std::string> Get(std::string_view key) override {
    std::string k(key);
    return std::move(BatchGet(std::span(&k, 1))[0]);
  }

  std::vector<Status> BatchPut(std::span<const std::string> keys,
                               std::span<const std::span<const std::byte>> values,
                               const PutConfig& config) override {
    if (keys.size() != values.size()) return MismatchedStatuses(keys.size());
    std::vector<const void*> ptrs;
    std::vector<size_t> sizes;
    for (const auto& value : values) {
      ptrs.push_back(value.data());
      sizes.push_back(value.size());
    }
    return PutImpl(keys, ptrs, sizes, config);
  }

  std::vector<Result<std::string>> BatchGet(std::span<const std::string> keys) override {
    std::vector<std::string> values(keys.size());
    std::vector<Status> statuses = GetImpl(keys, [&](size_t i, uint64_t size) -> Result<void*> {
      values[i].resize(size);
      return static_cast<void*>(values[i].data());
    });
    std::vector<Result<std::string>> results;
    results.reserve(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      if (statuses[i].ok()) {
        results.emplace_back(std::move(values[i]));
      } else {
        results.emplace_back(statuses[i]);
      }
    }
    return results;
  }

  // ---- zero-copy API ----

  Status RegisterBuffer(void* ptr, size_t size) override {
    if (ptr == nullptr || size == 0) return InvalidArgumentError("RegisterBuffer: null or empty");
    auto begin = reinterpret_cast<uintptr_t>(ptr);
    {
      std::unique_lock lock(buffers_mu_);
      auto next = buffers_.lower_bound(begin);
      bool overlaps =
          (next != buffers_.end() && next->first < begin + size) ||
          (next != buffers_.begin() && std::prev(next)->first + std::prev(next)->second > begin);
      if (overlaps) {
        return InvalidArgumentError("RegisterBuffer: [" + FormatHex(begin) + ", +" +
                                    std::to_string(size) + ") overlaps a registered buffer");
      }
      buffers_.emplace(begin, size);
    }
    Status status = engine_->RegisterLocalMemory(ptr, size);
    if (!status.ok()) {
      std::unique_lock lock(buffers_mu_);
      buffers_.erase(begin);
    }
    return status;
  }

  Status UnregisterBuffer(void* ptr) override {
    {
      std::unique_lock lock(buffers_mu_);
      if (buffers_.erase(reinterpret_cast<uintptr_t>(ptr)) == 0) {
        return NotFoundError("UnregisterBuffer: no buffer registered at " +
                             FormatHex(reinterpret_cast<uintptr_t>(ptr)));
      }
    }
    return engine_->UnregisterLocalMemory(ptr);
  }

  Status PutFrom(std::string_view key, const void* ptr, size_t size,
                 const PutConfig& config) override {
    std::string k(key);
    void* p = const_cast<void*>(ptr);
    return BatchPutFrom(std::span(&k, 1), std::span(&p, 1), std::span(&size, 1), config)[0];
  }

  Result<size_t> GetInto(std::string_view key, void* ptr, size_t capacity) override {
    std::string k(key);
    return std::move(
        BatchGetInto(std::span(&k, 1), std::span(&ptr, 1), std::span(&capacity, 1))[0]);
  }

  std::vector<Status> BatchPutFrom(std::span<const std::string> keys, std::span<void* const> ptrs,
                                   std::span<const size_t> sizes,
                                   const PutConfig& config) override {
    if (keys.size() != ptrs.size() || keys.size() != sizes.size()) {
      return MismatchedStatuses(keys.size());
    }
    std::vector<Status> results(keys.size());
    std::vector<size_t> valid;
    for (size_t i = 0; i < keys.size(); ++i) {
      results[i] = CheckRegistered(ptrs[i], sizes[i]);
      if (results[i].ok()) valid.push_back(i);
    }
    if (valid.size() == keys.size()) {
      std::vector<const void*> srcs(ptrs.begin(), ptrs.end());
      return PutImpl(keys, srcs, sizes, config);
    }
    std::vector<std::string> sub_keys;
    std::vector<const void*> sub_ptrs;
    std::vector<size_t> sub_sizes;
    for (size_t i : valid) {
      sub_keys.push_back(keys[i]);
      sub_ptrs.push_back(ptrs[i]);
      sub_sizes.push_back(sizes[i]);
    }
    std::vector<Status> sub = PutImpl(sub_keys, sub_ptrs, sub_sizes, config);
    for (size_t j = 0; j < valid.size(); ++j) results[valid[j]] = sub[j];
    return results;
  }

  std::vector<Result<size_t>> BatchGetInto(std::span<const std::string> keys,
                                           std::span<void* const> ptrs,
                                           std::span<const size_t> capacities) override {
    std::vector<Result<size_t>> results;
    if (keys.size() != ptrs.size() || keys.size() != capacities.size()) {
      for (const Status& status : MismatchedStatuses(keys.size())) results.emplace_back(status);
      return results;
    }
    std::vector<uint64_t> sizes(keys.size(), 0);
    std::vector<Status> statuses = GetImpl(keys, [&](size_t i, uint64_t size) -> Result<void*> {
      if (size > capacities[i]) {
        return InvalidArgumentError("value of key '" + keys[i] + "' has " + std::to_string(size) +
                                    " bytes; the buffer holds " + std::to_string(capacities[i]));
      }
      LARDER_RETURN_IF_ERROR(CheckRegistered(ptrs[i], capacities[i]));
      sizes[i] = size;
      return ptrs[i];
    });
    for (size_t i = 0; i < keys.size(); ++i) {
      if (statuses[i].ok()) {
        results.emplace_back(static_cast<size_t>(sizes[i]));
      } else {
        results.emplace_back(statuses[i]);
      }
    }
    return results;
  }

  // ---- metadata ----

  Result<bool> Exist(std::string_view key) override {
    std::string k(key);
    return std::move(BatchExist(std::span(&k, 1))[0]);
  }

  std::vector<Result<bool>> BatchExist(std::span<const std::string> keys) override {
    proto::BatchKeysRequest request;
    proto::BatchExistReply reply;
    request.mutable_keys()->Add(keys.begin(), keys.end());
    Status status = Rpc("BatchExist", &Stub::BatchExist, &request, &reply);
    if (status.ok() && static_cast<size_t>(reply.exists_size()) != keys.size()) {
      status = InternalError(
          "larder-master sent a malformed Exist reply: " + std::to_string(reply.exists_size()) +
          " answers for " + std::to_string(keys.size()) + " keys");
    }
    std::vector<Result<bool>> results;
    results.reserve(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      if (status.ok()) {
        results.emplace_back(reply.exists(static_cast<int>(i)));
      } else {
        results.emplace_back(status);
      }
    }
    return results;
  }

  Result<uint64_t> GetSize(std::string_view key) override {
    proto::BatchKeysRequest request;
    proto::BatchGetReplicasReply reply;
    request.add_keys(std::string(key));
    request.set_metadata_only(true);  // no lease: nothing is copied
    LARDER_RETURN_IF_ERROR(Rpc("BatchGetReplicas", &Stub::BatchGetReplicas, &request, &reply));
    LARDER_RETURN_IF_ERROR(CheckReplicaColumns(reply, 1));
    LARDER_RETURN_IF_ERROR(ItemStatuses(1, reply.errors())[0]);
    return reply.size(0);
  }

  Status Remove(std::string_view key) override {
    std::string k(key);
    return BatchRemove(std::span(&k, 1))[0];
  }

  std::vector<Status> BatchRemove(std::span<const std::string> keys) override {
    proto::BatchKeysRequest request;
    proto::BatchStatusReply reply;
    request.mutable_keys()->Add(keys.begin(), keys.end());
    Status status = Rpc("BatchRemove", &Stub::BatchRemove, &request, &reply);
    if (!status.ok()) return std::vector<Status>(keys.size(), status);
    return ItemStatuses(keys.size(), reply.errors());
  }

  Result<uint64_t> RemoveAll() override {
    proto::RemoveAllRequest request;
    proto::RemoveAllReply reply;
    LARDER_RETURN_IF_ERROR(Rpc("RemoveAll", &Stub::RemoveAll, &request, &reply));
    return reply.removed();
  }

  Result<RouteKind> RouteTo(std::string_view segment_name) override {
    proto::ListSegmentsRequest request;
    proto::ListSegmentsReply reply;
    LARDER_RETURN_IF_ERROR(master_.Call("ListSegments", &Stub::ListSegments, request, &reply));
    for (const proto::SegmentInfo& info : reply.segments()) {
      if (info.name() != segment_name) continue;
      uint64_t id = info.segment_id();
      OpenedSegments opened;
      OpenSegments(std::span(&id, 1), &opened);
      const OpenedSegment* segment = opened.Find(id);
      if (segment == nullptr) {
        return UnavailableError("segment '" + info.name() + "' cannot be opened");
      }
      return engine_->SegmentRoute(segment->handle);
    }
    return NotFoundError("no segment named '" + std::string(segment_name) + "' is mounted");
  }

 private:
  using DestinationFn = std::function<Result<void*>(size_t index, uint64_t size)>;

  static std::vector<Status> MismatchedStatuses(size_t n) {
    return std::vector<Status>(n, InvalidArgumentError("batch arguments have different lengths"));
  }

  Status CheckRegistered(const void* ptr, size_t size) const {
    auto begin = reinterpret_cast<uintptr_t>(ptr);
    std::shared_lock lock(buffers_mu_);
    auto it = buffers_.upper_bound(begin);
    if (it != buffers_.begin()) {
      --it;
      if (begin >= it->first && begin + size <= it->first + it->second) return Status::Ok();
    }
    return FailedPreconditionError(
        "buffer [" + FormatHex(begin) + ", +" + std::to_string(size) +
        ") is not inside a registered buffer; call RegisterBuffer first");
  }

  // Calls the master for this client; when the master no longer knows the client (it expired or
  // the master restarted), mounts again and retries once. Calls whose request can carry lease
  // releases take every release waiting to be sent.
  template <typename Request, typename Reply>
  Status Rpc(const char* name,
             grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Reply*),
             Request* request, Reply* reply) {
    uint64_t generation = mount_generation_.load();
    request->set_client_id(engine_->id());
    if constexpr (requires { request->mutable_release_leases(); }) {
      std::vector<uint64_t> releases = TakeReleasesForCall();
      request->mutable_release_leases()->Add(releases.begin(), releases.end());
    }
    Status status = master_.Call(name, method, *request, reply);
    if (status.code() == StatusCode::kUnavailable) {
      // A broken connection (e.g. the master restarted) fails the first call on it; every call
      // is safe to repeat, so try once more on a fresh connection.
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      reply->Clear();
      status = master_.Call(name, method, *request, reply);
    }
    if (status.code() != StatusCode::kFailedPrecondition) return status;
    LARDER_RETURN_IF_ERROR(Mount(generation));
    reply->Clear();
    return master_.Call(name, method, *request, reply);
  }

  // Mounts (again) unless another thread already did since `seen_generation`.
  Status Mount(uint64_t seen_generation) {
    std::lock_guard lock(mount_mu_);
    if (mount_generation_.load() != seen_generation) return Status::Ok();
    proto::MountSegmentsRequest request;
    proto::MountSegmentsReply reply;
    request.set_client_id(engine_->id());
    request.set_host_id(engine_->host_id());
    if (segment_memory_) {
      proto::SegmentInfo* segment = request.add_segments();
      segment->set_name(segment_name_);
      segment->set_base(reinterpret_cast<uintptr_t>(segment_memory_->data()));
      segment->set_size(segment_memory_->size());
      segment->set_descriptor_json(descriptor_json_);
    }
    LARDER_RETURN_IF_ERROR(master_.Call("MountSegments", &Stub::MountSegments, request, &reply));
    if (segment_memory_) {
      Status status = FromItemStatus(reply.status(0));
      if (!status.ok()) return status.WithContext("mounting segment '" + segment_name_ + "'");
      master_segment_id_ = reply.segment_id(0);
    }
    if (mount_generation_.load() > 0) {
      Log().warn(
          "larder-master {} had lost this client (it expired, or the master restarted); segment "
          "'{}' mounted again. Objects stored before are no longer in the pool.",
          master_.address(), segment_name_);
    }
    incarnation_ = reply.master_incarnation();
    {
      std::lock_guard cache_lock(cache_mu_);
      cache_.clear();  // segment ids of an earlier incarnation mean nothing now
    }
    mount_generation_.fetch_add(1);
    return Status::Ok();
  }

  void HeartbeatLoop() {
    bool reachable = true;
    auto interval = options_.heartbeat_interval;
    std::unique_lock lock(heartbeat_mu_);
    while (!stopping_) {
      heartbeat_cv_.wait_for(lock, interval, [this] { return stopping_; });
      if (stopping_) break;
      lock.unlock();
      uint64_t generation = mount_generation_.load();
      proto::HeartbeatRequest request;
      proto::HeartbeatReply reply;
      request.set_client_id(engine_->id());
      AddTraffic(&request);
      Status status = master_.Call("Heartbeat", &Stub::Heartbeat, request, &reply);
      if (!status.ok()) {
        if (reachable) Log().warn("heartbeat failed: {}", status.ToString());
        reachable = false;
      } else {
        if (!reachable) Log().info("larder-master {} reachable again", master_.address());
        reachable = true;
        // Three heartbeats per client TTL, so that one late beat never expires us.
        auto ttl = std::chrono::milliseconds(reply.client_ttl_ms());
        if (ttl.count() > 0) interval = std::min(options_.heartbeat_interval, ttl / 3);
        if (reply.remount_required() || reply.master_incarnation() != incarnation_) {
          Status mounted = Mount(generation);
          if (!mounted.ok()) Log().warn("remount failed: {}", mounted.ToString());
        }
        if (reply.segments_version() != segments_version_) {
          if (CloseGoneSegments()) segments_version_ = reply.segments_version();
        }
      }
      lock.lock();
    }
  }

  // The engine's counters, for the master's /metrics.
  void AddTraffic(proto::HeartbeatRequest* request) const {
    EngineStats stats = engine_->Stats();
    for (const PeerTransferStats& peer : stats.peers) {
      if (request->traffic_size() >= 1024) break;
      proto::RouteTraffic* t = request->add_traffic();
      t->set_peer_client_id(peer.engine_id);
      t->set_route(std::string(RouteKindName(peer.route)));
      t->set_requests(peer.reads.requests + peer.writes.requests);
      t->set_bytes(peer.reads.bytes + peer.writes.bytes);
      t->set_failures(peer.reads.failures + peer.writes.failures);
    }
    request->set_mapped_segments(stats.mapped_segments);
    request->set_mapped_bytes(stats.mapped_bytes);
  }

  // Closes the opened segments the master no longer lists (unmounted, or lost with their owner),
  // so that their mappings go. False when the master could not be asked.
  bool CloseGoneSegments() {
    std::vector<uint64_t> ids;
    {
      std::lock_guard lock(cache_mu_);
      for (const auto& [id, segment] : cache_) ids.push_back(id);
    }
    if (ids.empty()) return true;
    proto::ListSegmentsRequest request;
    proto::ListSegmentsReply reply;
    request.mutable_segment_id()->Add(ids.begin(), ids.end());
    Status status = master_.Call("ListSegments", &Stub::ListSegments, request, &reply);
    if (!status.ok()) {
      Log().debug("cannot check opened segments: {}", status.ToString());
      return false;
    }
    std::vector<uint64_t> live;
    for (const proto::SegmentInfo& info : reply.segments()) live.push_back(info.segment_id());
    size_t closed = 0;
    for (uint64_t id : ids) {
      if (std::find(live.begin(), live.end(), id) != live.end()) continue;
      ForgetSegment(id);
      ++closed;
    }
    if (closed > 0) Log().info("closed {} segment(s) the master no longer has", closed);
    return true;
  }

  // ---- lease releases ----
  //
  // A get's lease is released as soon as its copy has ended: the id waits in pending_releases_
  // for the client's next master call to carry it (no round trip of its own while the client is
  // busy), and the releaser thread sends whatever is still waiting after lease_release_delay. A
  // release that is lost (the call carrying it failed) costs nothing but the lease's TTL.
  //
  // Every release queued before a call starts reaches the master before that call does: the call
  // carries it, or waits for the releaser's call that carries it. So a client that read a key and
  // then removes it never finds its own read in the way.

  void QueueRelease(uint64_t lease_id) {
    if (lease_id == 0) return;
    bool wake;
    {
      std::lock_guard lock(release_mu_);
      if (pending_releases_.empty()) oldest_pending_ = SteadyClock::now();
      pending_releases_.push_back(lease_id);
      // The releaser is woken only when it sleeps with nothing to do: a busy reader's gets cost
      // no wake-up each.
      wake = releaser_idle_;
      releaser_idle_ = false;
    }
    if (wake) release_cv_.notify_all();
  }

  std::vector<uint64_t> TakeReleases() {
    std::vector<uint64_t> taken;
    std::lock_guard lock(release_mu_);
    taken.swap(pending_releases_);
    return taken;
  }

  std::vector<uint64_t> TakeReleasesForCall() {
    std::vector<uint64_t> taken;
    std::unique_lock lock(release_mu_);
    if (pending_releases_.empty() && !releases_in_flight_) return taken;
    release_cv_.wait(lock, [this] { return !releases_in_flight_; });
    taken.swap(pending_releases_);
    return taken;
  }

  void SendReleases(std::vector<uint64_t> ids) {
    if (ids.empty()) return;
    proto::ReleaseLeasesRequest request;
    proto::ReleaseLeasesReply reply;
    request.set_client_id(engine_->id());
    request.mutable_lease_id()->Add(ids.begin(), ids.end());
    Status status = master_.Call("ReleaseLeases", &Stub::ReleaseLeases, request, &reply);
    if (!status.ok()) {
      Log().debug("releasing {} lease(s): {} (they end at their TTL)", ids.size(),
                  status.ToString());
    } else if (reply.errors_size() > 0) {
      Log().warn("larder-master refused to release {} lease(s): {}", reply.errors_size(),
                 reply.errors(0).status().message());
    }
  }

  void ReleaseLoop() {
    std::unique_lock lock(release_mu_);
    while (!release_stopping_) {
      if (pending_releases_.empty()) {
        releaser_idle_ = true;
        release_cv_.wait(lock, [this] { return release_stopping_ || !pending_releases_.empty(); });
        releaser_idle_ = false;
        continue;
      }
      // Give a call the time to carry them; a call may take them, and newer ones arrive.
      auto due = oldest_pending_ + options_.lease_release_delay;
      if (SteadyClock::now() < due) {
        release_cv_.wait_until(lock, due, [this] { return release_stopping_; });
        continue;
      }
      std::vector<uint64_t> ids;
      ids.swap(pending_releases_);
      releases_in_flight_ = true;
      lock.unlock();
      SendReleases(std::move(ids));
      lock.lock();
      releases_in_flight_ = false;
      release_cv_.notify_all();
    }
  }

  // Opens (and caches) the segments; a segment that cannot be opened is left out of `opened`.
  void OpenSegments(std::span<const uint64_t> ids, OpenedSegments* opened) {
    std::vector<uint64_t> missing;
    {
      std::lock_guard lock(cache_mu_);
      uint64_t previous = 0;
      for (uint64_t id : ids) {
        if (id == previous || opened->Find(id) != nullptr) continue;  // batches repeat ids
        previous = id;
        auto it = cache_.find(id);
        if (it != cache_.end()) {
          opened->Add(id, it->second);
        } else if (std::find(missing.begin(), missing.end(), id) == missing.end()) {
          missing.push_back(id);
        }
      }
    }
    if (missing.empty()) return;
    proto::ListSegmentsRequest request;
    proto::ListSegmentsReply reply;
    request.mutable_segment_id()->Add(missing.begin(), missing.end());
    Status status = master_.Call("ListSegments", &Stub::ListSegments, request, &reply);
    if (!status.ok()) {
      Log().warn("cannot resolve segments: {}", status.ToString());
      return;
    }
    for (const proto::SegmentInfo& info : reply.segments()) {
      auto descriptor = SegmentDescriptor::FromJson(info.descriptor_json());
      if (!descriptor.ok()) continue;
      auto handle = engine_->OpenSegment(*descriptor);
      if (!handle.ok()) {
        Log().warn("cannot open segment '{}': {}", info.name(), handle.status().ToString());
        continue;
      }
      auto route = engine_->SegmentRoute(*handle);
      OpenedSegment segment{*handle, RouteRank(route.ok() ? *route : RouteKind::kTcp)};
      opened->Add(info.segment_id(), segment);
      std::lock_guard lock(cache_mu_);
      cache_[info.segment_id()] = segment;
    }
  }

  // A segment this client failed to reach is placed last in its puts for a while: until the
  // master drops it (its owner expired), or kAvoidFor, whichever comes first.
  static constexpr auto kAvoidFor = std::chrono::seconds(30);

  void MarkUnreachable(uint64_t id) {
    std::lock_guard lock(cache_mu_);
    unreachable_[id] = SteadyClock::now() + kAvoidFor;
  }

  void AddUnreachable(proto::BatchPutStartRequest* request) {
    std::lock_guard lock(cache_mu_);
    if (unreachable_.empty()) return;
    const auto now = SteadyClock::now();
    std::erase_if(unreachable_, [now](const auto& entry) { return entry.second < now; });
    for (const auto& [id, until] : unreachable_) {
      if (request->avoid_segments_size() >= 64) break;
      request->add_avoid_segments(id);
    }
  }

  void ForgetSegment(uint64_t id) {
    std::lock_guard lock(cache_mu_);
    auto it = cache_.find(id);
    if (it == cache_.end()) return;
    engine_->CloseSegment(it->second.handle).IgnoreError();
    cache_.erase(it);
  }

  std::vector<Status> PutImpl(std::span<const std::string> keys, std::span<const void* const> srcs,
                              std::span<const size_t> sizes, const PutConfig& config) {
    std::vector<Status> results(keys.size());
    if (keys.empty()) return results;
    if (keys.size() > kMaxBatch)
      return std::vector<Status>(keys.size(), BatchTooLarge(keys.size()));
    proto::BatchPutStartRequest request;
    proto::BatchPutStartReply reply;
    request.mutable_items()->Reserve(static_cast<int>(keys.size()));
    for (size_t i = 0; i < keys.size(); ++i) {
      proto::PutItem* item = request.add_items();
      item->set_key(keys[i]);
      item->set_size(sizes[i]);
    }
    request.set_replica_num(config.replica_num != 0 ? config.replica_num : options_.replica_num);
    request.mutable_preferred_segments()->Add(config.preferred_segments.begin(),
                                              config.preferred_segments.end());
    request.set_pin(config.pin);
    AddUnreachable(&request);
    Status status = Rpc("BatchPutStart", &Stub::BatchPutStart, &request, &reply);
    if (!status.ok()) return std::vector<Status>(keys.size(), status);

    std::vector<uint64_t> segment_ids;
    for (const proto::PutStartResult& result : reply.results()) {
      for (const proto::Replica& replica : result.replicas()) {
        segment_ids.push_back(replica.segment_id());
      }
    }
    OpenedSegments opened;
    OpenSegments(segment_ids, &opened);

    std::vector<TransferRequest> transfers;
    std::vector<size_t> owner;        // transfers[j] writes a replica of keys[owner[j]]
    std::vector<uint64_t> target_of;  // ... into master segment target_of[j]
    std::vector<bool> started(keys.size(), false);
    for (size_t i = 0; i < keys.size(); ++i) {
      const proto::PutStartResult& result = reply.results(static_cast<int>(i));
      results[i] = FromItemStatus(result.status());
      if (!results[i].ok() || result.already_exists()) continue;
      started[i] = true;
      for (const proto::Replica& replica : result.replicas()) {
        const OpenedSegment* segment = opened.Find(replica.segment_id());
        if (segment == nullptr) {
          results[i] = UnavailableError("key '" + keys[i] + "': segment " +
                                        std::to_string(replica.segment_id()) + " is unreachable");
          MarkUnreachable(replica.segment_id());
          break;
        }
        transfers.push_back(TransferRequest{TransferOp::kWrite, const_cast<void*>(srcs[i]),
                                            segment->handle, replica.offset(), sizes[i]});
        owner.push_back(i);
        target_of.push_back(replica.segment_id());
      }
    }
    if (!transfers.empty()) {
      auto done = engine_->TransferSync(transfers, options_.transfer_timeout);
      for (size_t j = 0; j < transfers.size(); ++j) {
        Status transfer = done.ok() ? (*done)[j].status : done.status();
        if (transfer.code() == StatusCode::kUnavailable) MarkUnreachable(target_of[j]);
        if (!transfer.ok() && results[owner[j]].ok()) {
          results[owner[j]] = transfer.WithContext("writing key '" + keys[owner[j]] + "'");
        }
      }
    }
    // One RPC commits the written objects, one abandons the failed ones.
    proto::BatchKeysRequest end, revoke;
    std::vector<size_t> ended;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!started[i]) continue;
      if (results[i].ok()) {
        end.add_keys(keys[i]);
        ended.push_back(i);
      } else {
        revoke.add_keys(keys[i]);
      }
    }
    if (end.keys_size() > 0) {
      proto::BatchStatusReply end_reply;
      Status end_status = Rpc("BatchPutEnd", &Stub::BatchPutEnd, &end, &end_reply);
      std::vector<Status> end_results = end_status.ok()
                                            ? ItemStatuses(ended.size(), end_reply.errors())
                                            : std::vector<Status>(ended.size(), end_status);
      for (size_t j = 0; j < ended.size(); ++j) results[ended[j]] = std::move(end_results[j]);
    }
    if (revoke.keys_size() > 0) {
      proto::BatchStatusReply revoke_reply;
      Status revoked = Rpc("BatchPutRevoke", &Stub::BatchPutRevoke, &revoke, &revoke_reply);
      if (!revoked.ok()) Log().debug("revoke failed: {}", revoked.ToString());
    }
    return results;
  }

  std::vector<Status> GetImpl(std::span<const std::string> keys, const DestinationFn& destination) {
    std::vector<Status> results = GetOnce(keys, destination);
    // A lease can run out while a peer's segment is opened (mapped) for the first time; the
    // segment is cached now, so one more try usually fits in a fresh lease.
    std::vector<std::string> again;
    std::vector<size_t> where;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (results[i].code() == StatusCode::kUnavailable &&
          results[i].message().find("lease expired") != std::string::npos) {
        again.push_back(keys[i]);
        where.push_back(i);
      }
    }
    if (again.empty()) return results;
    std::vector<Status> retried =
        GetOnce(again, [&](size_t j, uint64_t size) { return destination(where[j], size); });
    for (size_t j = 0; j < again.size(); ++j) results[where[j]] = retried[j];
    return results;
  }

  std::vector<Status> GetOnce(std::span<const std::string> keys, const DestinationFn& destination) {
    const size_t n = keys.size();
    if (n == 0) return {};
    proto::BatchKeysRequest request;
    proto::BatchGetReplicasReply reply;
    request.mutable_keys()->Add(keys.begin(), keys.end());
    SteadyClock::time_point asked = SteadyClock::now();
    Status status = Rpc("BatchGetReplicas", &Stub::BatchGetReplicas, &request, &reply);
    if (status.ok()) status = CheckReplicaColumns(reply, n);
    if (!status.ok()) {
      QueueRelease(reply.lease_id());  // a lease on a reply that cannot be used, if any
      return std::vector<Status>(n, status);
    }
    std::vector<Status> results = ItemStatuses(n, reply.errors());
    const SteadyClock::time_point lease_end = asked + std::chrono::milliseconds(reply.lease_ms());

    OpenedSegments opened;
    OpenSegments(std::span(reply.segment_id().data(), reply.segment_id_size()), &opened);

    // One job per key to read; its replicas are order[first, first + count), best route first.
    struct Job {
      size_t index;
      void* dst;
      uint64_t size;
      uint32_t first;
      uint32_t count;
      uint32_t next = 0;
      bool copied = false;
      bool tried = false;
    };
    std::vector<Job> jobs;
    jobs.reserve(n);
    std::vector<uint32_t> order(static_cast<size_t>(reply.segment_id_size()));
    uint32_t first = 0;
    for (size_t i = 0; i < n; ++i) {
      const uint32_t count = reply.replica_count(static_cast<int>(i));
      for (uint32_t r = 0; r < count; ++r) order[first + r] = first + r;
      if (count > 1) {
        std::stable_sort(order.begin() + first, order.begin() + first + count,
                         [&](uint32_t a, uint32_t b) {
                           return opened.RankOf(reply.segment_id(static_cast<int>(a))) <
                                  opened.RankOf(reply.segment_id(static_cast<int>(b)));
                         });
      }
      if (results[i].ok()) {
        auto dst = destination(i, reply.size(static_cast<int>(i)));
        if (dst.ok()) {
          jobs.push_back(Job{i, *dst, reply.size(static_cast<int>(i)), first, count});
        } else {
          results[i] = dst.status();
        }
      }
      first += count;
    }
    // Each round reads every pending object from its best untried replica, in one batch.
    std::vector<Job*> pending;
    pending.reserve(jobs.size());
    for (Job& job : jobs) pending.push_back(&job);
    std::vector<TransferRequest> transfers;
    std::vector<Job*> sent;
    while (!pending.empty()) {
      transfers.clear();
      sent.clear();
      for (Job* job : pending) {
        for (; job->next < job->count; ++job->next) {
          const int replica = static_cast<int>(order[job->first + job->next]);
          const OpenedSegment* segment = opened.Find(reply.segment_id(replica));
          if (segment == nullptr) continue;
          transfers.push_back(TransferRequest{TransferOp::kRead, job->dst, segment->handle,
                                              reply.offset(replica), job->size});
          sent.push_back(job);
          break;
        }
      }
      pending.clear();
      if (transfers.empty()) break;
      auto done = engine_->TransferSync(transfers, options_.transfer_timeout);
      for (size_t j = 0; j < sent.size(); ++j) {
        Job* job = sent[j];
        job->tried = true;
        Status transfer = done.ok() ? (*done)[j].status : done.status();
        if (transfer.ok()) {
          job->copied = true;
          results[job->index] = Status::Ok();
          continue;
        }
        uint64_t segment_id = reply.segment_id(static_cast<int>(order[job->first + job->next]));
        results[job->index] = transfer.WithContext("reading key '" + keys[job->index] + "'");
        ForgetSegment(segment_id);
        opened.Erase(segment_id);
        if (++job->next < job->count) pending.push_back(job);
      }
    }
    // The lease protected the bytes only until lease_end; past it they may have been evicted
    // and reused while we copied. The copy is over either way: the lease can go.
    const bool lease_expired = SteadyClock::now() > lease_end;
    QueueRelease(reply.lease_id());
    for (const Job& job : jobs) {
      if (!job.tried) {
        results[job.index] =
            UnavailableError("key '" + keys[job.index] + "': no reachable replica");
      } else if (job.copied && lease_expired) {
        results[job.index] = UnavailableError("key '" + keys[job.index] +
                                              "': the read lease expired before the copy "
                                              "finished; retry");
      }
    }
    return results;
  }

  const StoreClientOptions options_;
  std::unique_ptr<TransferEngine> engine_;
  MasterClient master_;
  std::shared_ptr<MemoryRegion> segment_memory_;
  SegmentId local_segment_ = 0;
  std::string segment_name_;
  std::string descriptor_json_;

  std::mutex mount_mu_;
  std::atomic<uint64_t> mount_generation_{0};
  uint64_t master_segment_id_ = 0;  // guarded by mount_mu_
  uint64_t incarnation_ = 0;        // written under mount_mu_; read by the heartbeat thread
  uint64_t segments_version_ = 0;   // the heartbeat thread's

  std::mutex cache_mu_;
  std::unordered_map<uint64_t, OpenedSegment> cache_;        // guarded by cache_mu_
  std::map<uint64_t, SteadyClock::time_point> unreachable_;  // avoid until; guarded by cache_mu_

  mutable std::shared_mutex buffers_mu_;
  std::map<uintptr_t, size_t> buffers_;  // guarded by buffers_mu_

  std::mutex heartbeat_mu_;
  std::condition_variable heartbeat_cv_;
  bool stopping_ = false;  // guarded by heartbeat_mu_
  std::thread heartbeat_;

  // Everything below but the thread is guarded by release_mu_.
  std::mutex release_mu_;
  std::condition_variable release_cv_;
  std::vector<uint64_t> pending_releases_;
  SteadyClock::time_point oldest_pending_;  // when pending_releases_[0] was queued
  bool releaser_idle_ = false;              // the releaser sleeps until a release is queued
  bool releases_in_flight_ = false;         // the releaser is sending some
  bool release_stopping_ = false;
  std::thread releaser_;
};

}  // namespace

Result<std::unique_ptr<StoreClient>> StoreClient::Create(const StoreClientOptions& options) {
  if (options.master_address.empty()) return InvalidArgumentError("master_address is empty");
  if (options.replica_num == 0) return InvalidArgumentError("replica_num must be at least 1");
  TransferEngineOptions engine_options;
  engine_options.role = EngineRole::kStore;
  engine_options.protocol = options.protocol;
  engine_options.listen_address = options.local_hostname + ":0";
  engine_options.auth_token = options.auth_token;
  engine_options.tls_ca_file = options.tls_ca_file;
  engine_options.tls_cert_file = options.tls_cert_file;
  engine_options.tls_key_file = options.tls_key_file;
  engine_options.host_id = options.host_id;
  engine_options.huge_pages = options.huge_pages;
  engine_options.default_timeout = options.transfer_timeout;
  LARDER_ASSIGN_OR_RETURN(std::unique_ptr<TransferEngine> engine,
                          TransferEngine::Create(engine_options));
  auto client = std::make_unique<StoreClientImpl>(options, std::move(engine));
  LARDER_RETURN_IF_ERROR(client->Init());
  return std::unique_ptr<StoreClient>(std::move(client));
}

}  // namespace larder
