// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// One UCP context and worker with the thread that drives them: the ucx transport's engine room.
// Every UCP call on the worker (endpoints, rkeys, RMA, active messages) runs on that one thread,
// so the worker is created single-threaded and nothing in here takes a lock on the data path but
// the task queue's.
//
// Besides RMA, workers speak a small active-message protocol with each other:
//
//   attach   initiator -> owner   "I will access segment S" (token T, S, my worker address)
//   reply    owner -> initiator   attached, or NotFound (S is not exported)
//   revoke   owner -> initiator   S was unregistered: stop, and ack once your accesses to it ended
//   ack      initiator -> owner
//   detach   initiator -> owner   T is closed
//
// It exists because UCX's software-emulated RMA (tcp, shared memory) does not check rkeys: once a
// worker can reach ours, it can read and write any address of this process, and ucp_mem_unmap
// revokes nothing on those lanes. The protocol makes well-behaved peers stop touching a segment
// before UnregisterSegment returns; it does not stop a hostile one (see docs/transfer-engine.md).
//
// Thread safety: every public method may be called from any thread, except that Export, Unexport,
// MapLocal and Attach block until the worker thread has run them, so they must not be called from
// inside a SliceCallback.
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <memory>
#include <span>
#include <string>

#include "larder/status.h"
#include "transfer/transport.h"
#include "transfer/ucx/ucx_blob.h"

namespace larder::transfer::ucx {

// Who owns a remote segment, for error messages.
struct PeerName {
  std::string engine_id;
  std::string host_id;
  std::string address;
  std::string segment;
  // "engine <id> (host <host>, <address>)".
  std::string ToString() const;
};

// A slice and the native registration its local buffer lies in (null: none).
struct LocalSlice {
  Slice* slice = nullptr;
  ucp_mem_h memh = nullptr;
};

class UcxWorker {
 public:
  // Reads the UCX configuration from the environment (UCX_TLS, UCX_NET_DEVICES, ...), creates the
  // context (RMA, AM, wakeup) and worker, and starts the worker thread. With `rdma_only` and no
  // UCX_TLS, UCX's tcp lanes stay closed. With a `cluster_token`, every attach reply carries the
  // owner's proof of the engine id it answers for, which the initiator checks against the
  // segment's descriptor (see internal::AttachProof). Unavailable with UCX's status when UCX
  // cannot start.
  static Result<std::shared_ptr<UcxWorker>> Create(const std::string& engine_id,
                                                   bool rdma_only = false,
                                                   std::string cluster_token = {});
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  // Stops the thread: queued slices fail with Cancelled, slices in flight with Unavailable once
  // their endpoints are closed. Later calls fail with Unavailable. Idempotent.
  void Stop();

  // This worker's address (what peers connect to).
  const std::string& address() const { return address_; }
  // Whether the context has an RDMA transport (rc, dc, ud: InfiniBand or RoCE).
  bool has_rdma_lane() const { return rdma_; }
  // The context's transport resources, e.g. "tcp/lo tcp/eth0 cma/memory".
  const std::string& resources() const { return resources_; }

  // Maps [base, base + size) of segment `id` and returns its packed rkey.
  Result<std::string> Export(SegmentId id, uint8_t* base, uint64_t size);
  // Stops new attaches to `id`, asks attached peers to stop and waits (up to `wait`) for their
  // acks, then unmaps the memory. No-op for ids not exported.
  void Unexport(SegmentId id, std::chrono::milliseconds wait);

  // Registers local memory [begin, begin + length) for zero-copy; kept until the worker is
  // destroyed.
  Result<ucp_mem_h> MapLocal(uint64_t begin, uint64_t length);

  // Connects to the owner of `blob` (one endpoint per owner worker address, reused), unpacks the
  // rkey and attaches. Returns a key for Submit. Unavailable (unreachable owner, no reply before
  // `deadline`), NotFound (the owner no longer exports the segment), InvalidArgument (an rkey
  // that UCX refuses).
  Result<uint64_t> Attach(const UcxBlob& blob, PeerName owner, Deadline deadline);
  // Forgets `key` once its slices in flight have ended (the rkey is destroyed then).
  void Detach(uint64_t key);
  // Moves every slice (get for kRead, put then endpoint flush for kWrite) and reports each to
  // `done`, from the worker thread. REQUIRES: `key` came from Attach and was not detached.
  void Submit(uint64_t key, std::span<const LocalSlice> slices, SliceCallback* done);

 private:
  struct Impl;
  explicit UcxWorker(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
  std::string address_;
  std::string resources_;
  bool rdma_ = false;
};

}  // namespace larder::transfer::ucx
