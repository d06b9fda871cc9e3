// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// AttachedStoreClient: a StoreClient whose calls larder-client serves
// (include/larder/standalone.h).
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>

#include "client/store_client_internal.h"
#include "common/env.h"
#include "common/memory.h"
#include "common/mutex.h"
#include "larder/standalone.h"
#include "standalone/channel.h"

namespace larder {

Result<AttachOptions> AttachOptions::FromEnvironment() {
  AttachOptions options;
  if (std::string socket = GetEnv("LARDER_CLIENT_SOCKET"); !socket.empty()) {
    options.socket = socket;
  }
  if (std::string size = GetEnv("LARDER_LOCAL_BUFFER_SIZE"); !size.empty()) {
    auto parsed = ParseByteSize(size, /*allow_zero=*/true);
    if (!parsed.ok()) return parsed.status().WithContext("LARDER_LOCAL_BUFFER_SIZE");
    options.staging_bytes = *parsed;
  }
  return options;
}

namespace {

using standalone::Channel;
using standalone::KeyedBuffer;
using standalone::MessageType;
using standalone::PayloadReader;
using standalone::PayloadWriter;
using standalone::SlicedKey;
using standalone::StagedItem;
using standalone::WireRange;
using standalone::WireSlice;

constexpr uint64_t kStagingAlignment = 64;

uint64_t Address(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr); }

std::string RangeText(const void* ptr, size_t size) {
  return "[" + FormatHex(Address(ptr)) + ", +" + std::to_string(size) + ")";
}

Status Mismatched() { return InvalidArgumentError("batch arguments have different lengths"); }

template <typename T>
std::vector<Result<T>> Fill(size_t n, const Status& status) {
  return std::vector<Result<T>>(n, status);
}

// Memory shared with the daemon, by its address here.
struct SharedRegion {
  size_t size = 0;
  std::shared_ptr<MemoryRegion> memory;  // set for AllocateShared memory, which we own
};

uint64_t RegionLength(const SharedRegion& region) { return region.size; }

class AttachedStoreClientImpl final : public AttachedStoreClient {
 public:
  AttachedStoreClientImpl(AttachOptions options, std::unique_ptr<Channel> channel)
      : options_(std::move(options)), channel_(std::move(channel)) {}

  ~AttachedStoreClientImpl() override {
    channel_.reset();  // the daemon releases its mappings; ours go below
    MutexLock lock(regions_mu_);
    regions_.clear();
  }

  Status Init() {
    PayloadWriter hello;
    standalone::HelloRequest request;
    request.client_name =
        options_.client_name.empty() ? "pid " + std::to_string(getpid()) : options_.client_name;
    Encode(request, &hello);
    LARDER_RETURN_IF_ERROR(Call(MessageType::kHello, hello, [&](PayloadReader* in) {
      hello_ = standalone::DecodeHelloReply(in);
    }));
    if (hello_.version != standalone::kProtocolVersion) {
      return FailedPreconditionError("larder-client at " + socket_address() +
                                     " speaks protocol version " + std::to_string(hello_.version) +
                                     "; this client speaks " +
                                     std::to_string(standalone::kProtocolVersion));
    }
    hello_.max_frame_bytes = std::min(hello_.max_frame_bytes, standalone::kMaxFrameBytes);
    hello_.max_batch_keys = std::min(hello_.max_batch_keys, kMaxBatchKeys);
    TransferEngineOptions engine;
    engine.protocol = "local";
    LARDER_ASSIGN_OR_RETURN(engine_, TransferEngine::Create(engine));
    if (options_.staging_bytes > 0) {
      LARDER_ASSIGN_OR_RETURN(void* staging, AllocateShared(options_.staging_bytes));
      staging_ = static_cast<char*>(staging);
      staging_size_ = options_.staging_bytes;
    }
    return Status::Ok();
  }

  const std::string& socket_address() const override { return channel_->address().display; }
  const std::string& segment_name() const override { return hello_.segment_name; }
  const std::string& client_id() const override { return hello_.client_id; }
  TransferEngine& engine() override { return *engine_; }

  // ---- shared memory ----

  Result<void*> AllocateShared(size_t size) override {
    if (size == 0) return InvalidArgumentError("AllocateShared: size 0");
    LARDER_ASSIGN_OR_RETURN(std::shared_ptr<MemoryRegion> memory,
                            AllocateMemfd("larder-attach", size, HugePages::kOff));
    LARDER_RETURN_IF_ERROR(Share(memory->data(), memory->size(), memory->fd(), 0, memory));
    return memory->data();
  }

  Status FreeShared(void* ptr) override {
    std::shared_ptr<MemoryRegion> memory;  // unmapped last, after the daemon let go of it
    {
      MutexLock lock(regions_mu_);
      auto it = regions_.find(Address(ptr));
      if (it == regions_.end() || !it->second.memory) {
        return NotFoundError("FreeShared: " + FormatHex(Address(ptr)) +
                             " is not memory from AllocateShared");
      }
      memory = std::move(it->second.memory);
      EraseBuffersIn(Address(ptr), it->second.size);
      regions_.erase(it);
    }
    Status unshared = Unshare(ptr);
    // A daemon that is gone has unmapped it already.
    return unshared.code() == StatusCode::kUnavailable ? Status::Ok() : unshared;
  }

  Status RegisterSharedBuffer(void* ptr, size_t size, int fd, uint64_t fd_offset) override {
    if (ptr == nullptr || size == 0) {
      return InvalidArgumentError("RegisterSharedBuffer: null or empty range");
    }
    if (fd < 0) return InvalidArgumentError("RegisterSharedBuffer: no fd");
    const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    if (fd_offset % page != 0) {
      return InvalidArgumentError("RegisterSharedBuffer: fd offset " + std::to_string(fd_offset) +
                                  " is not a multiple of the page size " + std::to_string(page));
    }
    return Share(ptr, size, fd, fd_offset, nullptr);
  }

  Status RegisterBuffer(void* ptr, size_t size) override {
    if (ptr == nullptr || size == 0) return InvalidArgumentError("RegisterBuffer: null or empty");
    const uint64_t begin = Address(ptr);
    MutexLock lock(regions_mu_);
    if (!InsideShared(begin, size)) {
      return FailedPreconditionError(
          "RegisterBuffer: " + RangeText(ptr, size) +
          " is not memory shared with larder-client at " + socket_address() +
          "; allocate it with AllocateShared or share a memfd mapping with RegisterSharedBuffer");
    }
    if (client::OverlapsRange(buffers_, begin, size)) {
      return InvalidArgumentError("RegisterBuffer: " + RangeText(ptr, size) +
                                  " overlaps a registered buffer");
    }
    buffers_.emplace(begin, size);
    return Status::Ok();
  }

  Status UnregisterBuffer(void* ptr) override {
    {
      MutexLock lock(regions_mu_);
      if (buffers_.erase(Address(ptr)) > 0) return Status::Ok();
      auto it = regions_.find(Address(ptr));
      if (it == regions_.end() || it->second.memory) {
        return NotFoundError("UnregisterBuffer: no buffer registered at " +
                             FormatHex(Address(ptr)) +
                             " (memory from AllocateShared is released with FreeShared)");
      }
      EraseBuffersIn(Address(ptr), it->second.size);
      regions_.erase(it);
    }
    Status unshared = Unshare(ptr);
    return unshared.code() == StatusCode::kUnavailable ? Status::Ok() : unshared;
  }

  // ---- copying API ----

  std::vector<Status> BatchPut(std::span<const std::string> keys,
                               std::span<const std::span<const std::byte>> values,
                               const PutConfig& config) override {
    if (keys.size() != values.size()) return std::vector<Status>(keys.size(), Mismatched());
    std::vector<Status> results(keys.size());
    MutexLock lock(staging_mu_);
    // Rounds of values that fit in the staging area together.
    size_t next = 0;
    while (next < keys.size()) {
      std::vector<size_t> round;
      std::vector<KeyedBuffer> items;
      uint64_t used = 0;
      for (; next < keys.size(); ++next) {
        const size_t size = values[next].size();
        if (size > staging_size_) {
          results[next] = StagingTooSmall(keys[next], size);
          continue;
        }
        const uint64_t at = AlignUp(used);
        if (at > staging_size_ || size > staging_size_ - at) break;
        if (size > 0) std::memcpy(staging_ + at, values[next].data(), size);
        used = at + size;
        round.push_back(next);
        items.push_back(KeyedBuffer{keys[next], WireSlice{Address(staging_ + at), size}});
      }
      if (round.empty()) continue;
      client::ScatterResults(round, PutBuffers(items, config), &results);
    }
    return results;
  }

  std::vector<Result<std::string>> BatchGet(std::span<const std::string> keys) override {
    std::vector<std::string> values(keys.size());
    std::vector<Status> statuses = GetStaged(keys, [&](size_t i, const char* data, uint64_t size) {
      values[i].assign(data, size);
      return Status::Ok();
    });
    return client::ValuesOrErrors<std::string>(statuses, std::move(values));
  }

  std::vector<Result<size_t>> BatchGetAllocated(std::span<const std::string> keys,
                                                const Allocator& allocate) override {
    std::vector<size_t> sizes(keys.size(), 0);
    std::vector<Status> statuses = GetStaged(keys, [&](size_t i, const char* data, uint64_t size) {
      LARDER_ASSIGN_OR_RETURN(void* dst, allocate(i, size));
      if (size > 0) std::memcpy(dst, data, size);
      sizes[i] = size;
      return Status::Ok();
    });
    return client::ValuesOrErrors<size_t>(statuses, std::move(sizes));
  }

  // ---- zero-copy API ----

  std::vector<Status> BatchPutFrom(std::span<const std::string> keys, std::span<void* const> ptrs,
                                   std::span<const size_t> sizes,
                                   const PutConfig& config) override {
    if (keys.size() != ptrs.size() || keys.size() != sizes.size()) {
      return std::vector<Status>(keys.size(), Mismatched());
    }
    std::vector<KeyedBuffer> items;
    items.reserve(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      items.push_back(KeyedBuffer{keys[i], WireSlice{Address(ptrs[i]), sizes[i]}});
    }
    return PutBuffers(items, config);
  }

  std::vector<Result<size_t>> BatchGetInto(std::span<const std::string> keys,
                                           std::span<void* const> ptrs,
                                           std::span<const size_t> capacities) override {
    if (keys.size() != ptrs.size() || keys.size() != capacities.size()) {
      return Fill<size_t>(keys.size(), Mismatched());
    }
    std::vector<KeyedBuffer> items;
    items.reserve(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      items.push_back(KeyedBuffer{keys[i], WireSlice{Address(ptrs[i]), capacities[i]}});
    }
    return GetBuffers(items);
  }

  std::vector<Status> BatchPutFromSlices(std::span<const std::string> keys,
                                         std::span<const std::vector<BufferSlice>> slices,
                                         const PutConfig& config) override {
    if (keys.size() != slices.size()) return std::vector<Status>(keys.size(), Mismatched());
    if (Status limit = CheckBatch(keys.size()); !limit.ok()) {
      return std::vector<Status>(keys.size(), limit);
    }
    PayloadWriter request;
    request.PutConfig(config);
    EncodeSlicedKeys(ToSliced(keys, slices), &request);
    std::vector<Status> statuses;
    Status status = Call(MessageType::kBatchPutFromSlices, request, [&](PayloadReader* in) {
      statuses = standalone::DecodeStatuses(in, keys.size());
    });
    if (!status.ok()) return std::vector<Status>(keys.size(), status);
    return statuses;
  }

  std::vector<Result<size_t>> BatchGetIntoSlices(
      std::span<const std::string> keys,
      std::span<const std::vector<BufferSlice>> slices) override {
    if (keys.size() != slices.size()) return Fill<size_t>(keys.size(), Mismatched());
    if (Status limit = CheckBatch(keys.size()); !limit.ok()) {
      return Fill<size_t>(keys.size(), limit);
    }
    PayloadWriter request;
    EncodeSlicedKeys(ToSliced(keys, slices), &request);
    return CallSizes(MessageType::kBatchGetIntoSlices, request, keys.size());
  }

  std::vector<Result<size_t>> BatchGetRanges(std::span<const ObjectRange> ranges) override {
    if (Status limit = CheckBatch(ranges.size()); !limit.ok()) {
      return Fill<size_t>(ranges.size(), limit);
    }
    std::vector<WireRange> items;
    items.reserve(ranges.size());
    for (const ObjectRange& range : ranges) {
      items.push_back(
          WireRange{range.key, range.offset, WireSlice{Address(range.ptr), range.size}});
    }
    PayloadWriter request;
    EncodeRanges(items, &request);
    return CallSizes(MessageType::kBatchGetRanges, request, ranges.size());
  }

  // ---- metadata ----

  std::vector<Result<bool>> BatchExist(std::span<const std::string> keys) override {
    if (Status limit = CheckBatch(keys.size()); !limit.ok()) return Fill<bool>(keys.size(), limit);
    PayloadWriter request;
    request.Keys(keys);
    std::vector<Result<bool>> results;
    Status status = Call(MessageType::kBatchExist, request, [&](PayloadReader* in) {
      results = standalone::DecodeBools(in, keys.size());
    });
    if (!status.ok()) return Fill<bool>(keys.size(), status);
    return results;
  }

  Result<uint64_t> GetSize(std::string_view key) override {
    PayloadWriter request;
    request.String(key);
    uint64_t size = 0;
    LARDER_RETURN_IF_ERROR(
        Call(MessageType::kGetSize, request, [&](PayloadReader* in) { size = in->U64(); }));
    return size;
  }

  // kBatchRemove for whole objects; kBatchRemoveReplicas (protocol version 3) with a segment;
  // kBatchRemoveScoped (version 4) when objects in use are to stay.
  std::vector<Status> BatchRemoveReplicas(std::span<const std::string> keys,
                                          const RemoveScope& scope) override {
    Status bad = CheckBatch(keys.size());
    if (bad.ok()) bad = scope.Validate();
    if (!bad.ok()) return std::vector<Status>(keys.size(), bad);
    MessageType type = MessageType::kBatchRemove;
    PayloadWriter request;
    request.U8(scope.force ? 1 : 0);
    if (scope.unused_for.count() > 0) {
      type = MessageType::kBatchRemoveScoped;
      request.String(scope.segment);
      request.U32(static_cast<uint32_t>(scope.unused_for.count()));
    } else if (!scope.segment.empty()) {
      type = MessageType::kBatchRemoveReplicas;
      request.String(scope.segment);
    }
    request.Keys(keys);
    std::vector<Status> statuses;
    Status status = Call(type, request, [&](PayloadReader* in) {
      statuses = standalone::DecodeStatuses(in, keys.size());
    });
    if (!status.ok()) return std::vector<Status>(keys.size(), status);
    return statuses;
  }

  Result<uint64_t> RemoveAll(bool force) override {
    PayloadWriter request;
    request.U8(force ? 1 : 0);
    uint64_t removed = 0;
    LARDER_RETURN_IF_ERROR(
        Call(MessageType::kRemoveAll, request, [&](PayloadReader* in) { removed = in->U64(); }));
    return removed;
  }

  Result<uint64_t> RemoveByRegex(std::string_view pattern, bool force) override {
    PayloadWriter request;
    request.U8(force ? 1 : 0);
    request.String(pattern);
    uint64_t removed = 0;
    LARDER_RETURN_IF_ERROR(Call(MessageType::kRemoveByRegex, request,
                                [&](PayloadReader* in) { removed = in->U64(); }));
    return removed;
  }

  std::vector<Result<ObjectInfo>> BatchGetObjectInfo(std::span<const std::string> keys) override {
    if (Status limit = CheckBatch(keys.size()); !limit.ok()) {
      return Fill<ObjectInfo>(keys.size(), limit);
    }
    PayloadWriter request;
    request.Keys(keys);
    std::vector<Result<ObjectInfo>> infos;
    Status status = Call(MessageType::kBatchGetObjectInfo, request, [&](PayloadReader* in) {
      infos = standalone::DecodeObjectInfos(in, keys.size());
    });
    if (!status.ok()) return Fill<ObjectInfo>(keys.size(), status);
    return infos;
  }

  Result<RouteKind> RouteTo(std::string_view segment_name) override {
    return UnimplementedError("RouteTo('" + std::string(segment_name) + "'): larder-client at " +
                              socket_address() +
                              " chooses the routes of an attached client's transfers");
  }

 private:
  // Sends a request and, when its reply's status is OK, decodes the body with `decode`.
  // Errors: the daemon being gone, the reply's status, or Internal for a malformed reply.
  template <typename Decode>
  Status Call(MessageType type, const PayloadWriter& request, Decode&& decode, int fd = -1) {
    if (request.data().size() > hello_max_frame()) {
      return InvalidArgumentError(standalone::MessageTypeName(static_cast<uint16_t>(type)) +
                                  " request of " + std::to_string(request.data().size()) +
                                  " bytes exceeds larder-client's frame limit of " +
                                  std::to_string(hello_max_frame()) + "; split the batch");
    }
    LARDER_ASSIGN_OR_RETURN(std::string reply, channel_->Call(type, request.data(), fd));
    PayloadReader in(reply);
    Status status = in.GetStatus();
    if (in.ok() && status.ok()) decode(&in);
    if (Status malformed = in.Finish(); !malformed.ok()) {
      return InternalError("larder-client at " + socket_address() + " sent a malformed " +
                           standalone::MessageTypeName(static_cast<uint16_t>(type)) +
                           " reply: " + malformed.message());
    }
    return status;
  }

  uint32_t hello_max_frame() const {
    return hello_.max_frame_bytes == 0 ? standalone::kMaxFrameBytes : hello_.max_frame_bytes;
  }

  Status CheckBatch(size_t n) const {
    if (n <= hello_.max_batch_keys) return Status::Ok();
    return InvalidArgumentError("a batch of " + std::to_string(n) +
                                " keys exceeds larder-client's maximum of " +
                                std::to_string(hello_.max_batch_keys) + "; split it");
  }

  std::vector<Result<size_t>> CallSizes(MessageType type, const PayloadWriter& request, size_t n) {
    std::vector<Result<size_t>> sizes;
    Status status =
        Call(type, request, [&](PayloadReader* in) { sizes = standalone::DecodeSizes(in, n); });
    if (!status.ok()) return Fill<size_t>(n, status);
    return sizes;
  }

  std::vector<Status> PutBuffers(std::span<const KeyedBuffer> items, const PutConfig& config) {
    if (Status limit = CheckBatch(items.size()); !limit.ok()) {
      return std::vector<Status>(items.size(), limit);
    }
    PayloadWriter request;
    request.PutConfig(config);
    EncodeKeyedBuffers(items, &request);
    std::vector<Status> statuses;
    Status status = Call(MessageType::kBatchPutFrom, request, [&](PayloadReader* in) {
      statuses = standalone::DecodeStatuses(in, items.size());
    });
    if (!status.ok()) return std::vector<Status>(items.size(), status);
    return statuses;
  }

  std::vector<Result<size_t>> GetBuffers(std::span<const KeyedBuffer> items) {
    if (Status limit = CheckBatch(items.size()); !limit.ok()) {
      return Fill<size_t>(items.size(), limit);
    }
    PayloadWriter request;
    EncodeKeyedBuffers(items, &request);
    return CallSizes(MessageType::kBatchGetInto, request, items.size());
  }

  static std::vector<SlicedKey> ToSliced(std::span<const std::string> keys,
                                         std::span<const std::vector<BufferSlice>> slices) {
    std::vector<SlicedKey> items(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      items[i].key = keys[i];
      items[i].slices.reserve(slices[i].size());
      for (const BufferSlice& slice : slices[i]) {
        items[i].slices.push_back(WireSlice{Address(slice.ptr), slice.size});
      }
    }
    return items;
  }

  // Reads the values of `keys` through the staging area and hands each to `consume` (index,
  // bytes, size) while the area still holds it. Rounds repeat for values the daemon deferred
  // because the area was full.
  using ConsumeFn = std::function<Status(size_t index, const char* data, uint64_t size)>;
  std::vector<Status> GetStaged(std::span<const std::string> keys, const ConsumeFn& consume) {
    std::vector<Status> results(keys.size());
    if (keys.empty()) return results;
    if (Status limit = CheckBatch(keys.size()); !limit.ok()) {
      return std::vector<Status>(keys.size(), limit);
    }
    MutexLock lock(staging_mu_);
    if (staging_size_ == 0) {
      return std::vector<Status>(
          keys.size(), InvalidArgumentError("the copying API is off: AttachOptions::staging_bytes "
                                            "is 0; use GetInto on shared memory"));
    }
    std::vector<size_t> pending(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) pending[i] = i;
    while (!pending.empty()) {
      standalone::StagedGetRequest staged;
      staged.staging = WireSlice{Address(staging_), staging_size_};
      for (size_t i : pending) staged.keys.push_back(keys[i]);
      PayloadWriter request;
      Encode(staged, &request);
      std::vector<StagedItem> items;
      Status status = Call(MessageType::kBatchGetStaged, request, [&](PayloadReader* in) {
        items = standalone::DecodeStagedItems(in, pending.size());
      });
      if (!status.ok()) {
        for (size_t i : pending) results[i] = status;
        break;
      }
      std::vector<size_t> deferred;
      for (size_t j = 0; j < pending.size(); ++j) {
        const size_t i = pending[j];
        const StagedItem& item = items[j];
        if (item.kind == StagedItem::kDeferred) {
          deferred.push_back(i);
        } else if (item.kind == StagedItem::kFailed) {
          results[i] = item.status;
        } else if (item.offset > staging_size_ || item.size > staging_size_ - item.offset) {
          results[i] =
              InternalError("larder-client placed key '" + keys[i] + "' outside the staging area");
        } else {
          results[i] = consume(i, staging_ + item.offset, item.size);
        }
      }
      if (deferred.size() == pending.size()) {
        // Nothing fit in an empty area, which only a misbehaving daemon does.
        for (size_t i : deferred) {
          results[i] = InternalError("larder-client deferred key '" + keys[i] + "' forever");
        }
        break;
      }
      pending = std::move(deferred);
    }
    return results;
  }

  Status StagingTooSmall(const std::string& key, uint64_t size) const {
    return InvalidArgumentError(
        "value of key '" + key + "' has " + std::to_string(size) + " bytes; the copying API " +
        "stages values through " + std::to_string(staging_size_) +
        " bytes (AttachOptions::staging_bytes, LARDER_LOCAL_BUFFER_SIZE); use PutFrom/GetInto " +
        "on shared memory or raise the limit");
  }

  static uint64_t AlignUp(uint64_t n) {
    return (n + kStagingAlignment - 1) / kStagingAlignment * kStagingAlignment;
  }

  bool InsideShared(uint64_t begin, uint64_t size) const LARDER_REQUIRES(regions_mu_) {
    return client::FindEnclosingRange(regions_, begin, size, RegionLength) != regions_.end();
  }

  void EraseBuffersIn(uint64_t begin, uint64_t size) LARDER_REQUIRES(regions_mu_) {
    for (auto it = buffers_.lower_bound(begin); it != buffers_.end() && it->first < begin + size;) {
      it = buffers_.erase(it);
    }
  }

  // Records [ptr, ptr + size) as shared and has the daemon map `fd` at `fd_offset`.
  Status Share(void* ptr, size_t size, int fd, uint64_t fd_offset,
               std::shared_ptr<MemoryRegion> memory) {
    const uint64_t begin = Address(ptr);
    if (begin > UINT64_MAX - size) return InvalidArgumentError("RegisterSharedBuffer: wraps");
    {
      MutexLock lock(regions_mu_);
      if (client::OverlapsRange(regions_, begin, size, RegionLength)) {
        return InvalidArgumentError("RegisterSharedBuffer: " + RangeText(ptr, size) +
                                    " overlaps memory shared before");
      }
      // Recorded before the daemon is asked, so that two threads cannot share one range twice.
      regions_.emplace(begin, SharedRegion{size, memory});
    }
    PayloadWriter request;
    Encode(standalone::RegisterSharedRequest{begin, size, fd_offset}, &request);
    Status status = Call(
        MessageType::kRegisterShared, request, [](PayloadReader*) {}, fd);
    if (!status.ok()) {
      MutexLock lock(regions_mu_);
      regions_.erase(begin);
    }
    return status;
  }

  Status Unshare(void* ptr) {
    PayloadWriter request;
    request.U64(Address(ptr));
    return Call(MessageType::kUnregisterShared, request, [](PayloadReader*) {});
  }

  const AttachOptions options_;
  std::unique_ptr<Channel> channel_;
  standalone::HelloReply hello_;  // written by Init only
  std::unique_ptr<TransferEngine> engine_;

  Mutex regions_mu_;
  std::map<uint64_t, SharedRegion> regions_ LARDER_GUARDED_BY(regions_mu_);  // by address
  // RegisterBuffer ranges.
  std::map<uint64_t, size_t> buffers_ LARDER_GUARDED_BY(regions_mu_);

  Mutex staging_mu_;  // the copying API takes turns on the staging area
  // Set by Init only; the area's bytes are guarded by staging_mu_.
  char* staging_ LARDER_PT_GUARDED_BY(staging_mu_) = nullptr;
  uint64_t staging_size_ = 0;  // set by Init only
};

}  // namespace

Result<std::unique_ptr<AttachedStoreClient>> AttachedStoreClient::Attach(
    const AttachOptions& options) {
  AttachOptions resolved = options;
  if (resolved.socket.empty()) resolved.socket = GetEnv("LARDER_CLIENT_SOCKET");
  if (resolved.socket.empty()) resolved.socket = std::string(standalone::kDefaultSocket);
  if (resolved.timeout.count() <= 0) return InvalidArgumentError("AttachOptions::timeout <= 0");
  LARDER_ASSIGN_OR_RETURN(standalone::SocketAddress address,
                          standalone::ResolveSocketAddress(resolved.socket));
  LARDER_ASSIGN_OR_RETURN(std::unique_ptr<Channel> channel,
                          Channel::Open(address, resolved.timeout));
  auto client = std::make_unique<AttachedStoreClientImpl>(resolved, std::move(channel));
  LARDER_RETURN_IF_ERROR(client->Init());
  return std::unique_ptr<AttachedStoreClient>(std::move(client));
}

Result<std::unique_ptr<StoreClient>> AttachStoreClient(const AttachOptions& options) {
  LARDER_ASSIGN_OR_RETURN(std::unique_ptr<AttachedStoreClient> client,
                          AttachedStoreClient::Attach(options));
  return std::unique_ptr<StoreClient>(std::move(client));
}

}  // namespace larder
