// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
// StoreClientImpl: the get path (BatchGetReplicas under a lease, reads from the best reachable
// replica, one retry of the reads a lease outran, waits for keys brought back from disk).

#include <google/protobuf/arena.h>

#include <algorithm>
#include <thread>

#include "client/store_client_impl.h"
#include "common/logging.h"

namespace larder::client {

std::vector<Status> StoreClientImpl::GetImpl(std::span<const std::string> keys,
                                             const DestinationFn& destination,
                                             const CallScope& scope) {
  std::vector<Status> results = GetOnce(keys, destination, scope);
  // A lease can run out while a peer's segment is opened (mapped) for the first time; the
  // segment is cached now, so one more try usually fits in a fresh lease. A key whose only copy is
  // on a disk is being put back into memory by its holder: asked again until it is there.
  const auto deadline = SteadyClock::now() + options_.transfer_timeout;
  auto wait = std::chrono::microseconds(500);
  bool lease_retried = false;
  for (;;) {
    std::vector<std::string> again;
    std::vector<size_t> where;
    bool on_disk = false;
    for (size_t i = 0; i < keys.size(); ++i) {
      const ErrorDetail detail = results[i].detail();
      if ((detail == ErrorDetail::kLeaseExpired && !lease_retried) ||
          (detail == ErrorDetail::kOnDisk && SteadyClock::now() < deadline)) {
        again.push_back(keys[i]);
        where.push_back(i);
        on_disk = on_disk || detail == ErrorDetail::kOnDisk;
      }
    }
    if (again.empty()) return results;
    if (on_disk) {
      // The holder reads the disk and puts the object back: a few milliseconds at least.
      std::this_thread::sleep_for(std::min<std::chrono::microseconds>(
          wait,
          std::chrono::duration_cast<std::chrono::microseconds>(deadline - SteadyClock::now())));
      wait = std::min<std::chrono::microseconds>(2 * wait, std::chrono::milliseconds(20));
    }
    lease_retried = true;
    std::vector<Status> retried = GetOnce(
        again,
        [&](size_t j, uint64_t size, std::vector<Fragment>* out) {
          return destination(where[j], size, out);
        },
        scope);
    for (size_t j = 0; j < again.size(); ++j) results[where[j]] = retried[j];
  }
}

std::vector<Status> StoreClientImpl::GetOnce(std::span<const std::string> keys,
                                             const DestinationFn& destination,
                                             const CallScope& scope) {
  const size_t n = keys.size();
  if (n == 0) return {};
  // The request and reply on an arena: the keys' string objects are not allocated one by one.
  google::protobuf::Arena arena;
  auto& request = *google::protobuf::Arena::CreateMessage<proto::BatchKeysRequest>(&arena);
  auto& reply = *google::protobuf::Arena::CreateMessage<proto::BatchGetReplicasReply>(&arena);
  AddKeys(keys, request.mutable_keys(), scope);
  request.set_quiet(scope.quiet);
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
          transfers.push_back(TransferRequest{TransferOp::kRead, fragments[f].dst, segment->handle,
                                              reply.offset(replica) + fragments[f].offset,
                                              fragments[f].size});
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
      results[job.index] = UnavailableError("key '" + keys[job.index] + "': no reachable replica");
    } else if (job.copied && lease_expired) {
      results[job.index] = UnavailableError("key '" + keys[job.index] +
                                            "': the read lease expired before the copy "
                                            "finished; retry")
                               .WithDetail(ErrorDetail::kLeaseExpired);
    }
  }
  return results;
}

}  // namespace larder::client
