// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "larder/store_client.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <unordered_map>

#include "client/lease_releaser.h"
#include "client/master_client.h"
#include "client/master_membership.h"
#include "client/store_client_internal.h"
#include "client/store_pieces.h"
#include "common/env.h"
#include "common/logging.h"
#include "common/memory.h"
#include "common/mutex.h"
#include "common/segment_descriptor_proto.h"

namespace larder {

namespace {

// The wire's soft-pin actions are the API's (larder/soft_pin.h).
static_assert(static_cast<int>(SoftPinAction::kPreserve) == proto::SOFT_PIN_PRESERVE);
static_assert(static_cast<int>(SoftPinAction::kEnable) == proto::SOFT_PIN_ENABLE);
static_assert(static_cast<int>(SoftPinAction::kDisable) == proto::SOFT_PIN_DISABLE);
static_assert(static_cast<int>(kLastSoftPinAction) == proto::SoftPinAction_MAX);

using client::AddTrafficReport;
using client::BatchTooLarge;
using client::CheckPutStartReply;
using client::CheckReplicaColumns;
using client::Fragment;
using client::FromItemStatus;
using client::ItemStatuses;
using client::MasterClient;
using client::ObjectInfos;
using client::ScopedKey;
using client::SegmentHandleRank;
using client::SegmentHandles;
using client::SingleSlices;
using client::ValidateTenant;
using Stub = proto::Master::Stub;
using SteadyClock = std::chrono::steady_clock;

// "23.0 GiB": memory sizes are rarely whole mebibytes.
std::string ApproxGiB(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f GiB", static_cast<double>(bytes) / (1ull << 30));
  return text;
}

class StoreClientImpl final : public StoreClient {
 public:
  StoreClientImpl(StoreClientOptions options, std::unique_ptr<TransferEngine> engine)
      : options_(std::move(options)),
        engine_(std::move(engine)),
        master_(client::MasterOptionsFor(options_, *engine_)) {}

  ~StoreClientImpl() override {
    releases_.Stop();
    if (membership_) membership_->Stop();
  }

  Status Init() {
    if (const uint64_t memory = HostMemoryBytes();
        !options_.sparse_segment && memory > 0 && options_.global_segment_size > memory) {
      return InvalidArgumentError(
          "global segment of " + FormatByteSize(options_.global_segment_size) +
          " is larger than the memory this process can fill (" + ApproxGiB(memory) +
          ", the host's RAM or its cgroup's limit): the kernel would kill it once the store "
          "filled the segment. Give a smaller segment size, or set LARDER_SPARSE_SEGMENT=1 "
          "(StoreClientOptions::sparse_segment) if it will never be filled");
    }
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
        if (descriptor.segment_id == local_segment_) descriptor_ = descriptor;
      }
    }
    client::MasterMembershipOptions membership;
    membership.client_id = engine_->id();
    membership.host_id = engine_->host_id();
    membership.segment_memory = segment_memory_;
    membership.segment_name = segment_name_;
    membership.descriptor = descriptor_;
    membership.heartbeat_interval = options_.heartbeat_interval;
    membership.connect_timeout = options_.master_connect_timeout;
    membership.add_traffic = [this](proto::HeartbeatRequest* request) {
      AddTrafficReport(engine_->Stats(), request);
    };
    membership.on_mount = [this] {
      MutexLock lock(cache_mu_);
      cache_.clear();  // segment ids of an earlier incarnation mean nothing now
    };
    membership.on_segments_changed = [this] { return CloseGoneSegments(); };
    membership_ = std::make_unique<client::MasterMembership>(&master_, std::move(membership));
    LARDER_RETURN_IF_ERROR(membership_->Start());
    releases_.Start();
    return Status::Ok();
  }

  const std::string& segment_name() const override { return segment_name_; }
  const std::string& client_id() const override { return engine_->id(); }
  TransferEngine& engine() override { return *engine_; }

  // ---- copying API ----

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
    SingleSlices single(ptrs, sizes);
    return PutImpl(keys, single.pieces, config);
  }

  std::vector<Result<std::string>> BatchGet(std::span<const std::string> keys) override {
    std::vector<std::string> values(keys.size());
    std::vector<Status> statuses =
        GetImpl(keys, [&](size_t i, uint64_t size, std::vector<Fragment>* out) {
          values[i].resize(size);
          out->push_back(Fragment{values[i].data(), 0, size});
          return Status::Ok();
        });
    return client::ValuesOrErrors<std::string>(statuses, std::move(values));
  }

  // ---- zero-copy API ----

  Status RegisterBuffer(void* ptr, size_t size) override {
    if (ptr == nullptr || size == 0) return InvalidArgumentError("RegisterBuffer: null or empty");
    auto begin = reinterpret_cast<uintptr_t>(ptr);
    {
      WriterLock lock(buffers_mu_);
      if (client::OverlapsRange(buffers_, begin, size)) {
        return InvalidArgumentError("RegisterBuffer: [" + FormatHex(begin) + ", +" +
                                    std::to_string(size) + ") overlaps a registered buffer");
      }
      buffers_.emplace(begin, size);
    }
    Status status = engine_->RegisterLocalMemory(ptr, size);
    if (!status.ok()) {
      WriterLock lock(buffers_mu_);
      buffers_.erase(begin);
    }
    return status;
  }

  Status UnregisterBuffer(void* ptr) override {
    {
      WriterLock lock(buffers_mu_);
      if (buffers_.erase(reinterpret_cast<uintptr_t>(ptr)) == 0) {
        return NotFoundError("UnregisterBuffer: no buffer registered at " +
                             FormatHex(reinterpret_cast<uintptr_t>(ptr)));
      }
    }
    return engine_->UnregisterLocalMemory(ptr);
  }

  std::vector<Status> BatchPutFrom(std::span<const std::string> keys, std::span<void* const> ptrs,
                                   std::span<const size_t> sizes,
                                   const PutConfig& config) override {
    if (keys.size() != ptrs.size() || keys.size() != sizes.size()) {
      return MismatchedStatuses(keys.size());
    }
    std::vector<const void*> srcs(ptrs.begin(), ptrs.end());
    SingleSlices single(srcs, sizes);
    return PutRegistered(keys, single.pieces, config);
  }

  std::vector<Status> BatchPutFromSlices(std::span<const std::string> keys,
                                         std::span<const std::vector<BufferSlice>> slices,
                                         const PutConfig& config) override {
    if (keys.size() != slices.size()) return MismatchedStatuses(keys.size());
    std::vector<std::span<const BufferSlice>> pieces(slices.begin(), slices.end());
    return PutRegistered(keys, pieces, config);
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
    std::vector<Status> statuses = GetImpl(keys, [&](size_t i, uint64_t size,
                                                     std::vector<Fragment>* out) {
      if (size > capacities[i]) {
        return InvalidArgumentError("value of key '" + keys[i] + "' has " + std::to_string(size) +
                                    " bytes; the buffer holds " + std::to_string(capacities[i]));
      }
      LARDER_RETURN_IF_ERROR(CheckRegistered(ptrs[i], capacities[i]));
      sizes[i] = size;
      out->push_back(Fragment{ptrs[i], 0, size});
      return Status::Ok();
    });
    return client::ValuesOrErrors<size_t>(statuses, std::move(sizes));
  }

  std::vector<Result<size_t>> BatchGetAllocated(std::span<const std::string> keys,
                                                const Allocator& allocate) override {
    std::vector<uint64_t> sizes(keys.size(), 0);
    std::vector<Status> statuses =
        GetImpl(keys, [&](size_t i, uint64_t size, std::vector<Fragment>* out) {
          LARDER_ASSIGN_OR_RETURN(void* dst, allocate(i, size));
          sizes[i] = size;
          out->push_back(Fragment{dst, 0, size});
          return Status::Ok();
        });
    return client::ValuesOrErrors<size_t>(statuses, std::move(sizes));
  }

  std::vector<Result<size_t>> BatchGetIntoSlices(
      std::span<const std::string> keys,
      std::span<const std::vector<BufferSlice>> slices) override {
    if (keys.size() != slices.size()) {
      std::vector<Status> mismatched = MismatchedStatuses(keys.size());
      return client::ValuesOrErrors<size_t>(mismatched, std::vector<uint64_t>(keys.size()));
    }
    std::vector<uint64_t> sizes(keys.size(), 0);
    std::vector<Status> statuses =
        GetImpl(keys, [&](size_t i, uint64_t size, std::vector<Fragment>* out) {
          uint64_t capacity = 0;
          for (const BufferSlice& slice : slices[i]) {
            LARDER_RETURN_IF_ERROR(CheckRegistered(slice.ptr, slice.size));
            capacity += slice.size;
          }
          if (size > capacity) {
            return InvalidArgumentError(
                "value of key '" + keys[i] + "' has " + std::to_string(size) + " bytes; its " +
                std::to_string(slices[i].size()) + " buffers hold " + std::to_string(capacity));
          }
          uint64_t offset = 0;
          for (const BufferSlice& slice : slices[i]) {
            if (offset == size) break;
            uint64_t n = std::min<uint64_t>(slice.size, size - offset);
            if (n > 0) out->push_back(Fragment{slice.ptr, offset, n});
            offset += n;
          }
          sizes[i] = size;
          return Status::Ok();
        });
    return client::ValuesOrErrors<size_t>(statuses, std::move(sizes));
  }

  std::vector<Result<size_t>> BatchGetRanges(std::span<const ObjectRange> ranges) override {
    // The distinct keys, and for each the ranges to read from it.
    std::vector<std::string> keys;
    std::unordered_map<std::string_view, size_t> key_index;
    std::vector<std::vector<size_t>> ranges_of;
    for (size_t r = 0; r < ranges.size(); ++r) {
      auto [it, inserted] = key_index.emplace(ranges[r].key, keys.size());
      if (inserted) {
        keys.push_back(ranges[r].key);
        ranges_of.emplace_back();
      }
      ranges_of[it->second].push_back(r);
    }
    std::vector<Status> range_status(ranges.size());
    std::vector<Status> statuses = GetImpl(keys, [&](size_t i, uint64_t size,
                                                     std::vector<Fragment>* out) {
      for (size_t r : ranges_of[i]) {
        const ObjectRange& range = ranges[r];
        if (range.offset > size || range.size > size - range.offset) {
          range_status[r] = OutOfRangeError("range [" + std::to_string(range.offset) + ", +" +
                                            std::to_string(range.size) + ") of key '" + range.key +
                                            "' runs past its " + std::to_string(size) + " bytes");
        } else if (Status registered = CheckRegistered(range.ptr, range.size); !registered.ok()) {
          range_status[r] = registered;
        } else if (range.size > 0) {
          out->push_back(Fragment{range.ptr, range.offset, range.size});
        }
      }
      return Status::Ok();
    });
    std::vector<Result<size_t>> results;
    results.reserve(ranges.size());
    for (size_t r = 0; r < ranges.size(); ++r) {
      const Status& key_status = statuses[key_index[ranges[r].key]];
      if (!key_status.ok()) {
        results.emplace_back(key_status);
      } else if (!range_status[r].ok()) {
        results.emplace_back(range_status[r]);
      } else {
        results.emplace_back(ranges[r].size);
      }
    }
    return results;
  }

  // ---- metadata ----

  std::vector<Result<bool>> BatchExist(std::span<const std::string> keys) override {
    proto::BatchKeysRequest request;
    proto::BatchExistReply reply;
    AddKeys(keys, request.mutable_keys());
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
    if (!status.ok()) return results;
    // A key the master could not ask about (oversize, say) is an error, not an absent key.
    for (const proto::KeyError& error : reply.errors()) {
      if (error.index() >= keys.size()) continue;  // a malformed reply names no key of ours
      Status item = client::FromItemStatus(error.status());
      results[error.index()] = item.ok() ? InternalError("larder-master sent an OK error") : item;
    }
    return results;
  }

  Result<uint64_t> GetSize(std::string_view key) override {
    proto::BatchKeysRequest request;
    proto::BatchGetReplicasReply reply;
    request.add_keys(ScopedKey(options_.tenant_id, key));
    request.set_metadata_only(true);  // no lease: nothing is copied
    LARDER_RETURN_IF_ERROR(Rpc("BatchGetReplicas", &Stub::BatchGetReplicas, &request, &reply));
    LARDER_RETURN_IF_ERROR(CheckReplicaColumns(reply, 1));
    LARDER_RETURN_IF_ERROR(ItemStatuses(1, reply.errors())[0]);
    return reply.size(0);
  }

  std::vector<Status> BatchRemoveReplicas(std::span<const std::string> keys,
                                          const RemoveScope& scope) override {
    if (Status bad = scope.Validate(); !bad.ok()) {
      return std::vector<Status>(keys.size(), bad);
    }
    proto::BatchKeysRequest request;
    proto::BatchStatusReply reply;
    AddKeys(keys, request.mutable_keys());
    request.set_force(scope.force);
    request.set_segment(scope.segment);
    request.set_unused_for_ms(static_cast<uint32_t>(scope.unused_for.count()));
    Status status = Rpc("BatchRemove", &Stub::BatchRemove, &request, &reply);
    if (!status.ok()) return std::vector<Status>(keys.size(), status);
    return ItemStatuses(keys.size(), reply.errors());
  }

  Result<uint64_t> RemoveAll(bool force) override {
    proto::RemoveAllRequest request;
    proto::RemoveAllReply reply;
    request.set_tenant(options_.tenant_id);
    request.set_force(force);
    LARDER_RETURN_IF_ERROR(Rpc("RemoveAll", &Stub::RemoveAll, &request, &reply));
    return reply.removed();
  }

  Result<uint64_t> RemoveByRegex(std::string_view pattern, bool force) override {
    proto::RemoveByRegexRequest request;
    proto::RemoveAllReply reply;
    request.set_tenant(options_.tenant_id);
    request.set_pattern(std::string(pattern));
    request.set_force(force);
    LARDER_RETURN_IF_ERROR(Rpc("RemoveByRegex", &Stub::RemoveByRegex, &request, &reply));
    return reply.removed();
  }

  std::vector<Result<ObjectInfo>> BatchGetObjectInfo(std::span<const std::string> keys) override {
    const size_t n = keys.size();
    if (n == 0) return {};
    proto::BatchKeysRequest request;
    proto::BatchGetReplicasReply reply;
    AddKeys(keys, request.mutable_keys());
    request.set_metadata_only(true);
    Status status = Rpc("BatchGetReplicas", &Stub::BatchGetReplicas, &request, &reply);
    if (status.ok()) status = CheckReplicaColumns(reply, n);
    proto::ListSegmentsReply segments;
    if (status.ok() && reply.segment_id_size() > 0) {
      proto::ListSegmentsRequest list;
      list.mutable_segment_id()->Add(reply.segment_id().begin(), reply.segment_id().end());
      status = master_.Call("ListSegments", &Stub::ListSegments, list, &segments);
    }
    if (!status.ok()) return std::vector<Result<ObjectInfo>>(n, status);
    return ObjectInfos(reply, segments);
  }

  uint64_t CatalogSize() const override { return membership_ ? membership_->catalog().size() : 0; }

  Result<RouteKind> RouteTo(std::string_view segment_name) override {
    proto::ListSegmentsRequest request;
    proto::ListSegmentsReply reply;
    LARDER_RETURN_IF_ERROR(master_.Call("ListSegments", &Stub::ListSegments, request, &reply));
    for (const proto::SegmentInfo& info : reply.segments()) {
      if (info.name() != segment_name) continue;
      uint64_t id = info.segment_id();
      SegmentHandles opened;
      std::vector<Status> failed;
      OpenSegments(std::span(&id, 1), &opened, &failed);
      const SegmentHandleRank* segment = opened.Find(id);
      if (segment == nullptr) {
        return UnavailableError("segment '" + info.name() + "' cannot be opened" +
                                (failed.empty() ? std::string() : ": " + failed.back().ToString()));
      }
      return engine_->SegmentRoute(segment->handle);
    }
    return NotFoundError("no segment named '" + std::string(segment_name) + "' is mounted");
  }

 private:
  // Where the value of keys[index] (of `size` bytes) goes: appends its fragments to `out`.
  using DestinationFn =
      std::function<Status(size_t index, uint64_t size, std::vector<Fragment>* out)>;

  // The key the master knows `key` of this client's tenant by.
  std::string MasterKey(std::string_view key) const { return ScopedKey(options_.tenant_id, key); }

  template <typename Repeated>
  void AddKeys(std::span<const std::string> keys, Repeated* out) const {
    out->Reserve(static_cast<int>(keys.size()));
    for (const std::string& key : keys) out->Add(MasterKey(key));
  }

  // Puts the keys whose every slice lies in a registered buffer; the others fail with
  // FailedPrecondition.
  std::vector<Status> PutRegistered(std::span<const std::string> keys,
                                    std::span<const std::span<const BufferSlice>> pieces,
                                    const PutConfig& config) {
    std::vector<Status> results(keys.size());
    std::vector<size_t> valid;
    for (size_t i = 0; i < keys.size(); ++i) {
      for (const BufferSlice& slice : pieces[i]) {
        results[i] = CheckRegistered(slice.ptr, slice.size);
        if (!results[i].ok()) break;
      }
      if (results[i].ok()) valid.push_back(i);
    }
    if (valid.size() == keys.size()) return PutImpl(keys, pieces, config);
    std::vector<std::string> sub_keys;
    std::vector<std::span<const BufferSlice>> sub_pieces;
    for (size_t i : valid) {
      sub_keys.push_back(keys[i]);
      sub_pieces.push_back(pieces[i]);
    }
    client::ScatterResults(valid, PutImpl(sub_keys, sub_pieces, config), &results);
    return results;
  }

  static std::vector<Status> MismatchedStatuses(size_t n) {
    return std::vector<Status>(n, InvalidArgumentError("batch arguments have different lengths"));
  }

  Status CheckRegistered(const void* ptr, size_t size) const {
    auto begin = reinterpret_cast<uintptr_t>(ptr);
    ReaderLock lock(buffers_mu_);
    if (client::FindEnclosingRange(buffers_, begin, size) != buffers_.end()) {
      return Status::Ok();
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
    uint64_t generation = membership_->generation();
    request->set_client_id(engine_->id());
    if constexpr (requires { request->mutable_release_leases(); }) {
      std::vector<uint64_t> releases = releases_.TakeForCall();
      request->mutable_release_leases()->Add(releases.begin(), releases.end());
    } else {
      // A call that cannot carry releases (RemoveAll, RemoveByRegex) sends them first, so that
      // this client's own finished reads never stand in its way.
      SendReleases(releases_.TakeForCall());
    }
    // MasterClient::Call repeats what a broken connection, a restarted master or a new leader
    // failed; this adds the one recovery that is the store client's own: a mount.
    Status status = master_.Call(name, method, *request, reply);
    // Only a master that does not know this client asks for a mount; any other
    // FailedPrecondition stands.
    if (status.detail() != ErrorDetail::kRemountRequired) return status;
    LARDER_RETURN_IF_ERROR(membership_->Remount(generation));
    reply->Clear();
    return master_.Call(name, method, *request, reply);
  }

  // Closes the opened segments the master no longer lists (unmounted, or lost with their owner),
  // so that their mappings go. False when the master could not be asked.
  bool CloseGoneSegments() {
    std::vector<uint64_t> ids;
    {
      MutexLock lock(cache_mu_);
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

  // Sends lease releases that no call carried (LeaseReleaser's thread, and Stop).
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

  // Opens (and caches) the segments; a segment that cannot be opened is left out of `opened`, and
  // why is appended to *failed (when given).
  void OpenSegments(std::span<const uint64_t> ids, SegmentHandles* opened,
                    std::vector<Status>* failed = nullptr) {
    std::vector<uint64_t> missing;
    {
      MutexLock lock(cache_mu_);
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
      if (failed != nullptr) failed->push_back(status);
      return;
    }
    for (const proto::SegmentInfo& info : reply.segments()) {
      auto descriptor = FromProto(info.segment_descriptor());
      if (!descriptor.ok()) {
        // Its replicas stay unreachable from here: their reads and writes say so per key.
        Log().warn("segment '{}' (id {}): the master's descriptor is not valid: {}", info.name(),
                   info.segment_id(), descriptor.status().ToString());
        if (failed != nullptr) failed->push_back(descriptor.status());
        continue;
      }
      auto handle = engine_->OpenSegment(*descriptor);
      if (!handle.ok()) {
        Log().warn("cannot open segment '{}': {}", info.name(), handle.status().ToString());
        if (failed != nullptr) failed->push_back(handle.status());
        continue;
      }
      auto route = engine_->SegmentRoute(*handle);
      SegmentHandleRank segment{*handle, RoutePreference(route.ok() ? *route : RouteKind::kTcp)};
      opened->Add(info.segment_id(), segment);
      MutexLock lock(cache_mu_);
      cache_[info.segment_id()] = segment;
    }
  }

  // A segment this client failed to reach is placed last in its puts for a while: until the
  // master drops it (its owner expired), or kAvoidFor, whichever comes first.
  static constexpr auto kAvoidFor = std::chrono::seconds(30);

  void MarkUnreachable(uint64_t id) {
    MutexLock lock(cache_mu_);
    unreachable_[id] = SteadyClock::now() + kAvoidFor;
  }

  void AddUnreachable(proto::BatchPutStartRequest* request) {
    MutexLock lock(cache_mu_);
    if (unreachable_.empty()) return;
    const auto now = SteadyClock::now();
    std::erase_if(unreachable_, [now](const auto& entry) { return entry.second < now; });
    for (const auto& [id, until] : unreachable_) {
      if (request->avoid_segments_size() >= 64) break;
      request->add_avoid_segments(id);
    }
  }

  void ForgetSegment(uint64_t id) {
    MutexLock lock(cache_mu_);
    auto it = cache_.find(id);
    if (it == cache_.end()) return;
    engine_->CloseSegment(it->second.handle).IgnoreError();
    cache_.erase(it);
  }

  // Object i is the concatenation of pieces[i].
  std::vector<Status> PutImpl(std::span<const std::string> keys,
                              std::span<const std::span<const BufferSlice>> pieces,
                              const PutConfig& config) {
    std::vector<Status> results(keys.size());
    if (keys.empty()) return results;
    if (keys.size() > kMaxBatchKeys)
      return std::vector<Status>(keys.size(), BatchTooLarge(keys.size()));
    std::vector<uint64_t> sizes(keys.size(), 0);
    for (size_t i = 0; i < keys.size(); ++i) {
      for (const BufferSlice& slice : pieces[i]) sizes[i] += slice.size;
    }
    proto::BatchPutStartRequest request;
    proto::BatchPutStartReply reply;
    request.mutable_items()->Reserve(static_cast<int>(keys.size()));
    for (size_t i = 0; i < keys.size(); ++i) {
      proto::PutItem* item = request.add_items();
      item->set_key(MasterKey(keys[i]));
      item->set_size(sizes[i]);
    }
    request.set_replica_num(config.replica_num != 0 ? config.replica_num : options_.replica_num);
    request.mutable_preferred_segments()->Add(config.preferred_segments.begin(),
                                              config.preferred_segments.end());
    request.set_pin(config.pin);
    request.set_soft_pin_action(static_cast<proto::SoftPinAction>(config.soft_pin_action));
    if (config.soft_pin_ttl) {
      request.set_soft_pin_ttl_ms(static_cast<uint64_t>(std::max<int64_t>(
          0, std::chrono::duration_cast<std::chrono::milliseconds>(*config.soft_pin_ttl).count())));
    }
    request.set_upsert(config.overwrite);
    AddUnreachable(&request);
    Status status = Rpc("BatchPutStart", &Stub::BatchPutStart, &request, &reply);
    if (status.ok()) status = CheckPutStartReply(reply, keys.size());
    if (!status.ok()) return std::vector<Status>(keys.size(), status);

    std::vector<uint64_t> segment_ids;
    for (const proto::PutStartResult& result : reply.results()) {
      for (const proto::Replica& replica : result.replicas()) {
        segment_ids.push_back(replica.segment_id());
      }
    }
    SegmentHandles opened;
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
        const SegmentHandleRank* segment = opened.Find(replica.segment_id());
        if (segment == nullptr) {
          results[i] = UnavailableError("key '" + keys[i] + "': segment " +
                                        std::to_string(replica.segment_id()) + " is unreachable");
          MarkUnreachable(replica.segment_id());
          break;
        }
        uint64_t offset = replica.offset();
        for (const BufferSlice& slice : pieces[i]) {
          if (slice.size == 0) continue;
          transfers.push_back(
              TransferRequest{TransferOp::kWrite, slice.ptr, segment->handle, offset, slice.size});
          owner.push_back(i);
          target_of.push_back(replica.segment_id());
          offset += slice.size;
        }
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
    // What went into this client's own segment is hashed for its catalog while still in cache.
    if (membership_ && membership_->catalog().verifies()) {
      const uint64_t own = membership_->segment_id();
      for (size_t i = 0; i < keys.size(); ++i) {
        if (!started[i] || !results[i].ok()) continue;
        for (const proto::Replica& replica : reply.results(static_cast<int>(i)).replicas()) {
          if (replica.segment_id() == own) {
            membership_->NoteWritten(replica.offset(), MasterKey(keys[i]), sizes[i]);
          }
        }
      }
    }
    // One RPC commits the written objects, one abandons the failed ones.
    proto::BatchKeysRequest end, revoke;
    std::vector<size_t> ended;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!started[i]) continue;
      if (results[i].ok()) {
        end.add_keys(MasterKey(keys[i]));
        ended.push_back(i);
      } else {
        revoke.add_keys(MasterKey(keys[i]));
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
      if (results[i].detail() == ErrorDetail::kLeaseExpired) {
        again.push_back(keys[i]);
        where.push_back(i);
      }
    }
    if (again.empty()) return results;
    std::vector<Status> retried =
        GetOnce(again, [&](size_t j, uint64_t size, std::vector<Fragment>* out) {
          return destination(where[j], size, out);
        });
    for (size_t j = 0; j < again.size(); ++j) results[where[j]] = retried[j];
    return results;
  }

  std::vector<Status> GetOnce(std::span<const std::string> keys, const DestinationFn& destination) {
    const size_t n = keys.size();
    if (n == 0) return {};
    proto::BatchKeysRequest request;
    proto::BatchGetReplicasReply reply;
    AddKeys(keys, request.mutable_keys());
    SteadyClock::time_point asked = SteadyClock::now();
    Status status = Rpc("BatchGetReplicas", &Stub::BatchGetReplicas, &request, &reply);
    if (status.ok()) status = CheckReplicaColumns(reply, n);
    if (!status.ok()) {
      releases_.Queue(reply.lease_id());  // a lease on a reply that cannot be used, if any
      return std::vector<Status>(n, status);
    }
    std::vector<Status> results = ItemStatuses(n, reply.errors());
    const SteadyClock::time_point lease_end = asked + std::chrono::milliseconds(reply.lease_ms());

    SegmentHandles opened;
    OpenSegments(std::span(reply.segment_id().data(), reply.segment_id_size()), &opened);

    // One job per key to read; its replicas are order[first, first + count), best route first,
    // and its fragments fragments[fragment, fragment + fragment_count).
    struct Job {
      size_t index;
      size_t fragment;
      size_t fragment_count;
      uint32_t first;
      uint32_t count;
      uint32_t next = 0;
      bool copied = false;
      bool tried = false;
    };
    std::vector<Fragment> fragments;
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
        const size_t before = fragments.size();
        Status placed = destination(i, reply.size(static_cast<int>(i)), &fragments);
        if (!placed.ok()) {
          fragments.resize(before);
          results[i] = placed;
        } else if (fragments.size() > before) {
          jobs.push_back(Job{i, before, fragments.size() - before, first, count});
        }
      }
      first += count;
    }
    // Each round reads every pending object from its best untried replica, in one batch.
    std::vector<Job*> pending;
    pending.reserve(jobs.size());
    for (Job& job : jobs) pending.push_back(&job);
    std::vector<TransferRequest> transfers;
    std::vector<std::pair<Job*, size_t>> sent;  // a job, and its first request in transfers
    while (!pending.empty()) {
      transfers.clear();
      sent.clear();
      for (Job* job : pending) {
        for (; job->next < job->count; ++job->next) {
          const int replica = static_cast<int>(order[job->first + job->next]);
          const SegmentHandleRank* segment = opened.Find(reply.segment_id(replica));
          if (segment == nullptr) continue;
          sent.emplace_back(job, transfers.size());
          for (size_t f = job->fragment; f < job->fragment + job->fragment_count; ++f) {
            transfers.push_back(
                TransferRequest{TransferOp::kRead, fragments[f].dst, segment->handle,
                                reply.offset(replica) + fragments[f].offset, fragments[f].size});
          }
          break;
        }
      }
      pending.clear();
      if (transfers.empty()) break;
      auto done = engine_->TransferSync(transfers, options_.transfer_timeout);
      for (const auto& [job, first_request] : sent) {
        job->tried = true;
        Status transfer = done.status();
        for (size_t f = 0; done.ok() && f < job->fragment_count && transfer.ok(); ++f) {
          transfer = (*done)[first_request + f].status;
        }
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
    releases_.Queue(reply.lease_id());
    for (const Job& job : jobs) {
      if (!job.tried) {
        results[job.index] =
            UnavailableError("key '" + keys[job.index] + "': no reachable replica");
      } else if (job.copied && lease_expired) {
        results[job.index] = UnavailableError("key '" + keys[job.index] +
                                              "': the read lease expired before the copy "
                                              "finished; retry")
                                 .WithDetail(ErrorDetail::kLeaseExpired);
      }
    }
    return results;
  }

  const StoreClientOptions options_;
  std::unique_ptr<TransferEngine> engine_;
  MasterClient master_;
  // The last call reached the master (or none was made yet): the next Unavailable is likely a
  // broken connection worth waiting out (Rpc).
  std::shared_ptr<MemoryRegion> segment_memory_;
  SegmentId local_segment_ = 0;
  std::string segment_name_;
  SegmentDescriptor descriptor_;  // of segment_memory_, as mounted

  std::unique_ptr<client::MasterMembership> membership_;

  Mutex cache_mu_;
  std::unordered_map<uint64_t, SegmentHandleRank> cache_ LARDER_GUARDED_BY(cache_mu_);
  // Avoid until.
  std::map<uint64_t, SteadyClock::time_point> unreachable_ LARDER_GUARDED_BY(cache_mu_);

  mutable SharedMutex buffers_mu_;
  std::map<uintptr_t, size_t> buffers_ LARDER_GUARDED_BY(buffers_mu_);

  // Declared last: destroyed first, while master_ can still send what is left.
  client::LeaseReleaser releases_{options_.lease_release_delay, [this](std::vector<uint64_t> ids) {
                                    SendReleases(std::move(ids));
                                  }};
};

}  // namespace

Result<std::unique_ptr<StoreClient>> StoreClient::Create(const StoreClientOptions& options) {
  if (options.master_address.empty()) return InvalidArgumentError("master_address is empty");
  if (options.replica_num == 0) return InvalidArgumentError("replica_num must be at least 1");
  LARDER_RETURN_IF_ERROR(ValidateTenant(options.tenant_id));
  LARDER_ASSIGN_OR_RETURN(std::unique_ptr<TransferEngine> engine,
                          TransferEngine::Create(client::StoreEngineOptions(options)));
  auto client = std::make_unique<StoreClientImpl>(options, std::move(engine));
  LARDER_RETURN_IF_ERROR(client->Init());
  return std::unique_ptr<StoreClient>(std::move(client));
}

}  // namespace larder
