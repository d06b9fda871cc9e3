// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
// UcxWorker::Impl: transfers as slices: admission within the in-flight limits, issue, completion,
// deadlines, and endpoints closed after a slice outlived its grace.

#include "common/logging.h"
#include "transfer/ucx/ucx_worker_impl.h"

namespace larder::transfer::ucx {

using namespace internal;  // NOLINT: this file implements them

void UcxWorker::Impl::OnRequestDone(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  if (status != UCS_OK && op->ucs == UCS_OK) op->ucs = status;
  ucp_request_free(request);
  if (--op->parts == 0) op->completed->push_back(op);
}

void UcxWorker::Impl::Track(Op* op, ucs_status_ptr_t request) {
  if (request == nullptr) return;
  if (UCS_PTR_IS_ERR(request)) {
    if (op->ucs == UCS_OK) op->ucs = UCS_PTR_STATUS(request);
    return;
  }
  ++op->parts;
}

void UcxWorker::Impl::Complete(Op* op, Status status) {
  if (op->place == OpPlace::kQueued) queued.erase(op->in_list);
  if (op->place == OpPlace::kWaiting) op->key->waiting.erase(op->in_list);
  op->place = OpPlace::kNew;
  op->has_final = true;
  op->final_status = std::move(status);
  completed.push_back(op);
}

void UcxWorker::Impl::Admit(Op* op) {
  Key* key = op->key;
  const Slice& s = *op->slice;
  if (s.offset > key->size || s.length > key->size - s.offset) {
    return Complete(
        op, OutOfRangeError("ucx slice [" + std::to_string(s.offset) + ", +" +
                            std::to_string(s.length) + ") outside segment '" + key->owner.segment +
                            "' of " + std::to_string(key->size) + " bytes"));
  }
  if (key->detached) {
    return Complete(op, UnavailableError("segment '" + key->owner.segment + "' was closed"));
  }
  if (key->state == KeyState::kRevoked) return Complete(op, key->refusal);
  if (Clock::now() >= s.deadline) {
    return Complete(op, DeadlineExceededError("ucx slice to " + key->owner.ToString() +
                                              " passed its deadline before it was sent"));
  }
  Status attached = EnsureAttached(key);
  if (!attached.ok()) {
    return Complete(op, attached.WithContext("segment '" + key->owner.segment + "' of " +
                                             key->owner.ToString()));
  }
  op->timed = true;
  op->in_deadlines = deadlines.emplace(s.deadline, op);
  if (key->state == KeyState::kAttaching) {
    op->place = OpPlace::kWaiting;
    op->in_list = key->waiting.insert(key->waiting.end(), op);
  } else {
    op->place = OpPlace::kQueued;
    op->in_list = queued.insert(queued.end(), op);
  }
}

bool UcxWorker::Impl::IssueQueued() {
  bool issued = false;
  while (!queued.empty() && inflight_slices < kMaxInflightSlices &&
         (inflight_slices == 0 || inflight_bytes < kMaxInflightBytes)) {
    Op* op = queued.front();
    queued.pop_front();
    op->place = OpPlace::kNew;
    Issue(op);
    issued = true;
  }
  return issued;
}

void UcxWorker::Impl::Issue(Op* op) {
  Key* key = op->key;
  Peer* peer = key->peer.get();
  if (key->state == KeyState::kRevoked) return Complete(op, key->refusal);
  if (peer->ep == nullptr || key->generation != peer->generation ||
      key->state != KeyState::kReady) {
    Status why = peer->failure.ok() ? UnavailableError("ucx endpoint closed") : peer->failure;
    return Complete(
        op, why.WithContext("segment '" + key->owner.segment + "' of " + key->owner.ToString()));
  }
  Slice& s = *op->slice;
  op->place = OpPlace::kIssued;
  op->in_list = issued.insert(issued.end(), op);
  ++inflight_slices;
  inflight_bytes += s.length;
  ++key->inflight;
  ++peer->inflight;
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  params.cb.send = &Impl::OnRequestDone;
  params.user_data = op;
  ucp_request_param_t flush = params;
  if (op->memh != nullptr) {
    params.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    params.memh = op->memh;
  }
  uint64_t remote = key->base + s.offset;
  if (s.op == TransferOp::kRead) {
    Track(op, ucp_get_nbx(peer->ep, s.local, s.length, remote, key->rkey, &params));
  } else {
    Track(op, ucp_put_nbx(peer->ep, s.local, s.length, remote, key->rkey, &params));
    // A put is complete when its buffer may be reused; the flush completes once the owner's
    // memory holds the bytes, which is what a write promises.
    if (op->ucs == UCS_OK) Track(op, ucp_ep_flush_nbx(peer->ep, &flush));
  }
  if (op->parts == 0) completed.push_back(op);
}

bool UcxWorker::Impl::ProcessCompleted() {
  bool any = false;
  while (!completed.empty()) {
    std::vector<Op*> batch;
    batch.swap(completed);
    for (Op* op : batch) Finish(op);
    any = true;
  }
  return any;
}

void UcxWorker::Impl::Finish(Op* op) {
  // A slice that ended after its deadline reports it, whether or not ExpireDeadlines saw it
  // first (a long burst of progress may finish it in between): the outcome does not hang on
  // the worker's timing.
  if (op->timed && !op->has_final && Clock::now() > op->slice->deadline) op->expired = true;
  if (op->timed) deadlines.erase(op->in_deadlines);
  Key* key = op->key;
  Status status;
  if (op->has_final) {
    status = op->final_status;
  } else {
    issued.erase(op->in_list);
    --inflight_slices;
    inflight_bytes -= op->slice->length;
    --key->inflight;
    --key->peer->inflight;
    const char* what = op->slice->op == TransferOp::kRead ? "read" : "write";
    if (op->expired) {
      status =
          DeadlineExceededError(std::string("ucx ") + what + " of segment '" + key->owner.segment +
                                "' at " + key->owner.ToString() + " passed its deadline");
    } else if (op->ucs != UCS_OK) {
      status = UnavailableError(std::string("ucx ") + what + " of segment '" + key->owner.segment +
                                "' at " + key->owner.ToString() + " failed: " + UcsText(op->ucs));
    } else if (!key->peer->lanes_logged && key->peer->ep != nullptr) {
      LogLanes(key->peer.get(), key->owner);
    }
  }
  Slice* slice = op->slice;
  SliceCallback* done = op->done;
  delete op;
  --key->ops;
  done->OnSliceDone(slice, std::move(status));
  MaybeRelease(key);
}

void UcxWorker::Impl::ExpireDeadlines() {
  auto now = Clock::now();
  while (!deadlines.empty() && deadlines.begin()->first <= now) {
    Op* op = deadlines.begin()->second;
    deadlines.erase(deadlines.begin());
    op->timed = false;
    if (op->place == OpPlace::kIssued) {
      // UCX cannot cancel one RMA request, and the caller gets its buffer back only once the
      // slice has ended: it ends by itself, or the endpoint is force-closed, ending them all,
      // after kExpiredSliceGrace (see there). The next slice reconnects.
      op->expired = true;
      Peer* peer = op->key->peer.get();
      if (!peer->close_by) {
        peer->close_by = now + kExpiredSliceGrace;
        closing.insert(peer);
      }
    } else {
      Complete(op, DeadlineExceededError("ucx slice to " + op->key->owner.ToString() +
                                         " passed its deadline before it was sent"));
    }
  }
}

bool UcxWorker::Impl::SettleClosing() {
  const auto now = Clock::now();
  for (auto it = closing.begin(); it != closing.end();) {
    Peer* peer = *it;
    if (peer->inflight == 0 || peer->ep == nullptr) {
      peer->close_by.reset();
      it = closing.erase(it);
    } else if (now >= *peer->close_by) {
      peer->close_by.reset();
      it = closing.erase(it);
      CloseEndpoint(peer, UnavailableError("ucx endpoint closed: a slice passed its deadline "
                                           "and the owner did not answer within " +
                                           std::to_string(kExpiredSliceGrace.count()) + " s"));
    } else {
      ++it;
    }
  }
  return !closing.empty();
}

}  // namespace larder::transfer::ucx
