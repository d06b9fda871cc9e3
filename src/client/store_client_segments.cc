// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
// StoreClientImpl: the peers' segments it has opened (a cache the master's segment list keeps
// true), those it failed to reach, and lease releases no call carried.

#include <algorithm>

#include "client/store_client_impl.h"
#include "common/logging.h"
#include "common/segment_descriptor_proto.h"

namespace larder::client {

bool StoreClientImpl::CloseGoneSegments() {
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

void StoreClientImpl::SendReleases(std::vector<uint64_t> ids) {
  if (ids.empty()) return;
  proto::ReleaseLeasesRequest request;
  proto::ReleaseLeasesReply reply;
  request.set_client_id(engine_->id());
  request.mutable_lease_id()->Add(ids.begin(), ids.end());
  Status status = master_.Call("ReleaseLeases", &Stub::ReleaseLeases, request, &reply);
  if (!status.ok()) {
    Log().debug("releasing {} lease(s): {} (they end at their TTL)", ids.size(), status.ToString());
  } else if (reply.errors_size() > 0) {
    Log().warn("larder-master refused to release {} lease(s): {}", reply.errors_size(),
               reply.errors(0).status().message());
  }
}

void StoreClientImpl::OpenSegments(std::span<const uint64_t> ids, SegmentHandles* opened,
                                   std::vector<Status>* failed) {
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

void StoreClientImpl::MarkUnreachable(uint64_t id) {
  MutexLock lock(cache_mu_);
  unreachable_[id] = SteadyClock::now() + kAvoidFor;
}

void StoreClientImpl::AddUnreachable(proto::BatchPutStartRequest* request) {
  MutexLock lock(cache_mu_);
  if (unreachable_.empty()) return;
  const auto now = SteadyClock::now();
  std::erase_if(unreachable_, [now](const auto& entry) { return entry.second < now; });
  for (const auto& [id, until] : unreachable_) {
    if (request->avoid_segments_size() >= 64) break;
    request->add_avoid_segments(id);
  }
}

void StoreClientImpl::ForgetSegment(uint64_t id) {
  MutexLock lock(cache_mu_);
  auto it = cache_.find(id);
  if (it == cache_.end()) return;
  engine_->CloseSegment(it->second.handle).IgnoreError();
  cache_.erase(it);
}

}  // namespace larder::client
