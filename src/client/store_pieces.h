// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Pieces of StoreClientImpl (store_client.cc) that need none of its state: batch limits, route
// ranks, tenant-scoped keys, and the small types of its read and write paths. Not public API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "client/master_client.h"
#include "common/limits.h"
#include "larder/status.h"
#include "larder/store_client.h"
#include "larder/transfer_engine.h"
#include "master.grpc.pb.h"

namespace larder::client {

// Refusal of a batch past kMaxBatchKeys (common/limits.h, also the engine's default
// max_batch_requests): a put past it is refused before the master allocates anything for it.
Status BatchTooLarge(size_t items);

// The key the master stores for `key` of `tenant`: tenants' keys are "\0" + tenant + "\0" + key,
// and a default-tenant key that starts with a NUL byte is stored as if of tenant "" ("\0\0" +
// key), so that no key of one tenant can name a key of another (proto/master.proto).
std::string ScopedKey(const std::string& tenant, std::string_view key);

Status ValidateTenant(const std::string& tenant);

// Part of an object's bytes in caller memory: [dst, dst + size) holds bytes
// [offset, offset + size) of the value.
struct Fragment {
  void* dst = nullptr;
  uint64_t offset = 0;
  uint64_t size = 0;
};

// One BufferSlice per key, as the single-buffer calls pass them.
struct SingleSlices {
  SingleSlices(std::span<const void* const> ptrs, std::span<const size_t> sizes) {
    slices.reserve(ptrs.size());
    for (size_t i = 0; i < ptrs.size(); ++i) {
      slices.push_back(BufferSlice{const_cast<void*>(ptrs[i]), sizes[i]});
    }
    for (const BufferSlice& slice : slices) pieces.emplace_back(&slice, 1);
  }
  std::vector<BufferSlice> slices;
  std::vector<std::span<const BufferSlice>> pieces;
};

// A peer's segment as this client reaches it: the engine's handle and how good its route is.
struct SegmentHandleRank {
  SegmentHandle handle = 0;
  int rank = std::numeric_limits<int>::max() - 1;  // RoutePreference of its route
};

// The segments one batch touches, by master segment id: a few, so a flat list beats a map.
class SegmentHandles {
 public:
  const SegmentHandleRank* Find(uint64_t id) const {
    for (const auto& [key, segment] : list_) {
      if (key == id) return &segment;
    }
    return nullptr;
  }
  void Add(uint64_t id, SegmentHandleRank segment) {
    if (Find(id) == nullptr) list_.emplace_back(id, segment);
  }
  void Erase(uint64_t id) {
    std::erase_if(list_, [id](const auto& entry) { return entry.first == id; });
  }
  // Lower is better; segments that are not open rank last.
  int RankOf(uint64_t id) const {
    const SegmentHandleRank* segment = Find(id);
    return segment == nullptr ? std::numeric_limits<int>::max() : segment->rank;
  }

 private:
  std::vector<std::pair<uint64_t, SegmentHandleRank>> list_;
};

// The ObjectInfo of each key of a metadata-only BatchGetReplicas reply, with the names and
// addresses of `segments` (ListSegments of the reply's segment ids). A replica on a segment that
// is not listed (unmounted in between) is left out.
std::vector<Result<ObjectInfo>> ObjectInfos(const proto::BatchGetReplicasReply& reply,
                                            const proto::ListSegmentsReply& segments);

// The engine's counters, as a heartbeat reports them to the master (for its /metrics).
void AddTrafficReport(const EngineStats& stats, proto::HeartbeatRequest* request);

// How a store client reaches the master: its address and timeout, and the tokens and CA of
// `options`, else of LARDER_AUTH_TOKEN, LARDER_ADMIN_TOKEN and LARDER_TLS_CA; it acts for
// `engine`'s id, which the engine's key proves. `engine` must outlive the options' users.
MasterClientOptions MasterOptionsFor(const StoreClientOptions& options,
                                     const TransferEngine& engine);
// The options of a store client's engine (role kStore).
TransferEngineOptions StoreEngineOptions(const StoreClientOptions& options);

}  // namespace larder::client
