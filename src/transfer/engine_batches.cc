// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The transfer engine's batches (engine_impl.h): requests checked and cut into slices, slices
// handed to their routes, retried over fallback routes until their deadline, and counted when
// they finish.
#include <algorithm>

#include "common/logging.h"
#include "transfer/engine_impl.h"

namespace larder::transfer {
namespace {

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

}  // namespace

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

}  // namespace larder::transfer
