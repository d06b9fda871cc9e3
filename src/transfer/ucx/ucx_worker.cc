// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/ucx/ucx_worker.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <list>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "common/mutex.h"
#include "common/net.h"
#include "transfer/ucx/ucx_worker_internal.h"

namespace larder::transfer::ucx {

using namespace internal;  // NOLINT: this file implements them

std::string PeerName::ToString() const {
  return "engine " + engine_id + " (host " + host_id + ", " + address + ")";
}

std::array<uint8_t, 32> internal::AttachProof(std::string_view cluster_token,
                                              const std::array<uint8_t, 32>& nonce,
                                              std::string_view owner_engine_id, uint64_t segment_id,
                                              uint64_t exported) {
  MacInput input("larder-ucx-attach-v1");
  input.Add(nonce.data(), nonce.size()).Add(owner_engine_id).Add(segment_id).Add(exported);
  return input.Sign(cluster_token);
}

struct UcxWorker::Impl {
  std::string engine_id;
  std::string cluster_token;  // empty: no proofs
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::string own_address;
  Fd epoll;
  Fd wake;
  std::thread thread;

  Mutex mu;
  std::deque<std::function<void()>> tasks LARDER_GUARDED_BY(mu);
  bool stopped LARDER_GUARDED_BY(mu) = false;  // no more tasks are accepted
  std::atomic<bool> stopping{false};

  // Everything below belongs to the worker thread.
  std::map<std::string, std::shared_ptr<Peer>> peers;  // by padded worker address
  std::map<ucp_ep_h, Peer*> by_ep;
  std::map<uint64_t, std::unique_ptr<Key>> keys;  // by token
  std::map<SegmentId, Exported> exports;
  std::map<uint64_t, std::pair<std::shared_ptr<Revocation>, uint64_t>> revocations;  // id -> token
  uint64_t next_revoke = 1;
  std::list<Op*> queued;
  std::list<Op*> issued;  // in flight in UCX
  size_t inflight_slices = 0;
  uint64_t inflight_bytes = 0;
  std::multimap<Deadline, Op*> deadlines;
  std::set<Peer*> closing;  // endpoints with a slice past its deadline (SettleClosing)
  std::vector<Op*> completed;
  std::vector<ucp_mem_h> local_memhs;
  std::mt19937_64 random{std::random_device{}()};
  Clock::time_point last_work = Clock::now();

  static thread_local Impl* current;

  // ---- Tasks ----

  bool Post(std::function<void()> task) {
    {
      MutexLock lock(mu);
      if (stopped) return false;
      tasks.push_back(std::move(task));
    }
    uint64_t one = 1;
    if (write(wake.get(), &one, sizeof(one)) < 0) {
      // The counter only saturates; the thread wakes either way.
    }
    return true;
  }

  // Runs `fn` on the worker thread and returns its result.
  template <typename T>
  Result<T> RunSync(std::function<Result<T>()> fn) {
    if (current == this) return fn();
    std::promise<Result<T>> promise;
    auto future = promise.get_future();
    if (!Post([&] { promise.set_value(fn()); })) {
      return UnavailableError("the ucx worker has stopped");
    }
    return future.get();
  }

  bool RunTasks() {
    std::deque<std::function<void()>> batch;
    {
      MutexLock lock(mu);
      batch.swap(tasks);
    }
    for (auto& task : batch) task();
    return !batch.empty();
  }

  // ---- The loop ----

  void Loop() {
    current = this;
    for (;;) {
      bool worked = RunTasks();
      worked |= IssueQueued();
      while (ucp_worker_progress(worker) != 0) worked = true;
      worked |= ProcessCompleted();
      ExpireDeadlines();
      worked |= ProcessCompleted();
      // Slices past their deadline still in flight: progress until they end (or their grace).
      worked |= SettleClosing();
      if (stopping.load()) {
        MutexLock lock(mu);
        if (tasks.empty()) break;
        continue;
      }
      auto now = Clock::now();
      if (worked) {
        last_work = now;
        continue;
      }
      if (now - last_work < kSpinWindow) continue;
      Sleep();
    }
    Teardown();
    current = nullptr;
  }

  void Sleep() {
    ucs_status_t armed = ucp_worker_arm(worker);
    if (armed == UCS_ERR_BUSY) return;  // events are pending: progress again
    int timeout = kMaxSleepMs;
    if (!deadlines.empty()) {
      auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(deadlines.begin()->first -
                                                                        Clock::now()) +
                  std::chrono::milliseconds(1);
      timeout = static_cast<int>(std::clamp<int64_t>(wait.count(), 0, kMaxSleepMs));
    }
    epoll_event events[4];
    epoll_wait(epoll.get(), events, 4, timeout);
    uint64_t count;
    if (read(wake.get(), &count, sizeof(count)) < 0) {
      // EAGAIN: nobody posted.
    }
    last_work = Clock::now();
  }

  // ---- Peers and endpoints ----

  std::shared_ptr<Peer> PeerFor(const std::string& worker_address) {
    std::string padded = Padded(worker_address);
    auto& peer = peers[padded];
    if (!peer) {
      peer = std::make_shared<Peer>();
      peer->worker_address = std::move(padded);
    }
    return peer;
  }

  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* impl = static_cast<Impl*>(arg);
    auto it = impl->by_ep.find(ep);
    if (it == impl->by_ep.end()) return;
    impl->CloseEndpoint(it->second, UnavailableError("ucx endpoint failed: " + UcsText(status)));
  }

  Status Connect(Peer* peer) {
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(peer->worker_address.data());
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &Impl::OnEndpointError;
    params.err_handler.arg = this;
    ucp_ep_h ep = nullptr;
    ucs_status_t status = ucp_ep_create(worker, &params, &ep);
    if (status != UCS_OK) {
      peer->failure = UnavailableError("ucx cannot create an endpoint: " + UcsText(status));
      return peer->failure;
    }
    peer->ep = ep;
    ++peer->generation;
    by_ep[ep] = peer;
    return Status();
  }

  // Force-closes the peer's endpoint: UCX ends its requests (their callbacks run) and nothing of
  // theirs touches local memory afterwards. Slices waiting for an attach reply fail with `why`.
  void CloseEndpoint(Peer* peer, Status why) {
    if (peer->ep == nullptr) return;
    ucp_ep_h ep = peer->ep;
    peer->ep = nullptr;
    peer->failure = why;
    by_ep.erase(ep);
    ucp_request_param_t params{};
    params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    params.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &params);
    if (UCS_PTR_IS_PTR(request)) ucp_request_free(request);
    for (Key* key : peer->keys) {
      if (key->state != KeyState::kAttaching) continue;
      Status failed =
          why.WithContext("segment '" + key->owner.segment + "' of " + key->owner.ToString());
      FailWaiting(key, failed);
      SettleAttach(key, failed);
    }
  }

  void LogLanes(Peer* peer, const PeerName& owner) {
    peer->lanes_logged = true;
    std::string text = PrintToString([&](FILE* f) { ucp_ep_print_info(peer->ep, f); });
    std::string lanes;
    std::set<std::string> seen;
    for (std::string lane : TokensAfter(text, "]:", false)) {
      if (size_t colon = lane.find(':'); colon != std::string::npos) lane = lane.substr(colon + 1);
      if (seen.insert(lane).second) lanes += (lanes.empty() ? "" : " ") + lane;
    }
    Log().info("ucx endpoint to {}: transports [{}]", owner.ToString(), lanes);
  }

  // ---- Active messages ----

  static void OnAmSent(void* request, ucs_status_t, void* user_data) {
    delete static_cast<AmMessage*>(user_data);
    ucp_request_free(request);
  }

  bool SendAm(ucp_ep_h ep, unsigned id, std::string header, std::string data, bool reply) {
    if (ep == nullptr) return false;
    auto* message = new AmMessage{std::move(header), std::move(data)};
    ucp_request_param_t params{};
    params.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    params.flags = reply ? UCP_AM_SEND_FLAG_REPLY : 0;
    params.cb.send = &Impl::OnAmSent;
    params.user_data = message;
    ucs_status_ptr_t request = ucp_am_send_nbx(
        ep, id, message->header.data(), message->header.size(),
        message->data.empty() ? nullptr : message->data.data(), message->data.size(), &params);
    if (UCS_PTR_IS_PTR(request)) return true;
    delete message;
    return !UCS_PTR_IS_ERR(request);
  }

  template <typename Msg>
  static std::string Bytes(const Msg& msg) {
    return std::string(reinterpret_cast<const char*>(&msg), sizeof(msg));
  }

  template <typename Msg>
  static bool Read(const void* header, size_t length, Msg* msg) {
    if (length != sizeof(Msg)) return false;  // peers' bytes: exact sizes only
    std::memcpy(msg, header, sizeof(Msg));
    return true;
  }

  // Owner side: an initiator attaches to one of our segments.
  static ucs_status_t OnAttach(void* arg, const void* header, size_t header_length, void* data,
                               size_t length, const ucp_am_recv_param_t* param) {
    auto* impl = static_cast<Impl*>(arg);
    AttachMsg msg;
    if (!Read(header, header_length, &msg) || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ||
        !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || length == 0 ||
        length > kMaxWorkerAddressBytes) {
      return UCS_OK;
    }
    auto it = impl->exports.find(msg.segment_id);
    ReplyMsg reply{msg.token, it == impl->exports.end() ? 0u : 1u, {}};
    if (!impl->cluster_token.empty()) {
      reply.proof = AttachProof(impl->cluster_token, msg.nonce, impl->engine_id, msg.segment_id,
                                reply.exported);
    }
    if (it != impl->exports.end()) {
      it->second.attached[msg.token] =
          impl->PeerFor(std::string(static_cast<const char*>(data), length));
    }
    impl->SendAm(param->reply_ep, kAmReply, Bytes(reply), std::string(), false);
    return UCS_OK;
  }

  // Initiator side: the owner's answer to an attach.
  static ucs_status_t OnReply(void* arg, const void* header, size_t header_length, void*, size_t,
                              const ucp_am_recv_param_t*) {
    auto* impl = static_cast<Impl*>(arg);
    ReplyMsg msg;
    if (!Read(header, header_length, &msg)) return UCS_OK;
    auto it = impl->keys.find(msg.token);
    if (it == impl->keys.end() || it->second->state != KeyState::kAttaching) return UCS_OK;
    Key* key = it->second.get();
    if (!impl->cluster_token.empty()) {
      const std::array<uint8_t, 32> expected = AttachProof(
          impl->cluster_token, key->nonce, key->owner.engine_id, key->segment_id, msg.exported);
      if (!DigestEqual(expected.data(), msg.proof.data())) {
        impl->Revoke(key, PermissionDeniedError(
                              "the ucx worker at the address of segment '" + key->owner.segment +
                              "' did not prove it is " + key->owner.ToString() +
                              ": the descriptor points at another engine's memory, or the peer "
                              "lacks the cluster token"));
        return UCS_OK;
      }
    }
    if (msg.exported == 1) {
      key->state = KeyState::kReady;
      for (Op* op : key->waiting) {
        op->place = OpPlace::kQueued;
        op->in_list = impl->queued.insert(impl->queued.end(), op);
      }
      key->waiting.clear();
      impl->SettleAttach(key, Status());
    } else {
      impl->Revoke(key, NotFoundError("segment '" + key->owner.segment + "' is not exported by " +
                                      key->owner.ToString() + " any more"));
    }
    return UCS_OK;
  }

  // Initiator side: the owner unregistered a segment we attached to.
  static ucs_status_t OnRevoke(void* arg, const void* header, size_t header_length, void*, size_t,
                               const ucp_am_recv_param_t* param) {
    auto* impl = static_cast<Impl*>(arg);
    RevokeMsg msg;
    if (!Read(header, header_length, &msg)) return UCS_OK;
    auto it = impl->keys.find(msg.token);
    if (it != impl->keys.end()) {
      Key* key = it->second.get();
      impl->Revoke(key, NotFoundError("segment '" + key->owner.segment + "' was unregistered by " +
                                      key->owner.ToString()));
      if (key->inflight > 0) {
        key->acks.push_back(msg.revoke_id);
        return UCS_OK;
      }
    }
    if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) {
      impl->SendAm(param->reply_ep, kAmAck, Bytes(AckMsg{msg.revoke_id}), std::string(), false);
    }
    return UCS_OK;
  }

  // Owner side: an initiator stopped accessing a segment we revoked.
  static ucs_status_t OnAck(void* arg, const void* header, size_t header_length, void*, size_t,
                            const ucp_am_recv_param_t*) {
    auto* impl = static_cast<Impl*>(arg);
    AckMsg msg;
    if (Read(header, header_length, &msg)) impl->Acknowledged(msg.revoke_id);
    return UCS_OK;
  }

  static ucs_status_t OnDetach(void* arg, const void* header, size_t header_length, void*, size_t,
                               const ucp_am_recv_param_t*) {
    auto* impl = static_cast<Impl*>(arg);
    DetachMsg msg;
    if (!Read(header, header_length, &msg)) return UCS_OK;
    for (auto& [id, exported] : impl->exports) exported.attached.erase(msg.token);
    std::vector<uint64_t> settled;
    for (auto& [revoke_id, entry] : impl->revocations) {
      if (entry.second == msg.token) settled.push_back(revoke_id);
    }
    for (uint64_t revoke_id : settled) impl->Acknowledged(revoke_id);
    return UCS_OK;
  }

  void Acknowledged(uint64_t revoke_id) {
    auto it = revocations.find(revoke_id);
    if (it == revocations.end()) return;
    std::shared_ptr<Revocation> revocation = it->second.first;
    revocations.erase(it);
    MutexLock lock(revocation->mu);
    if (revocation->remaining > 0 && --revocation->remaining == 0) revocation->cv.SignalAll();
  }

  Status SetHandler(unsigned id, ucp_am_recv_callback_t cb) {
    ucp_am_handler_param_t params{};
    params.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                        UCP_AM_HANDLER_PARAM_FIELD_ARG;
    params.id = id;
    params.cb = cb;
    params.arg = this;
    ucs_status_t status = ucp_worker_set_am_recv_handler(worker, &params);
    if (status != UCS_OK) return UnavailableError("ucx active-message handler: " + UcsText(status));
    return Status();
  }

  // ---- Keys ----

  // Makes `key` usable on its peer's current endpoint: connects when there is none, and unpacks
  // the rkey and attaches again when the endpoint changed.
  Status EnsureAttached(Key* key) {
    Peer* peer = key->peer.get();
    if (peer->ep == nullptr) LARDER_RETURN_IF_ERROR(Connect(peer));
    if (key->generation == peer->generation && key->rkey != nullptr) return Status();
    if (key->rkey != nullptr) ucp_rkey_destroy(key->rkey);
    key->rkey = nullptr;
    ucs_status_t status = ucp_ep_rkey_unpack(peer->ep, key->packed_rkey.data(), &key->rkey);
    if (status != UCS_OK) {
      key->rkey = nullptr;
      return InvalidArgumentError("ucx refuses the rkey of segment '" + key->owner.segment +
                                  "' of " + key->owner.ToString() + ": " + UcsText(status));
    }
    key->generation = peer->generation;
    key->state = KeyState::kAttaching;
    RandomBytes(key->nonce.data(), key->nonce.size());
    AttachMsg msg{key->token, key->segment_id, key->nonce};
    if (!SendAm(peer->ep, kAmAttach, Bytes(msg), own_address, true)) {
      return UnavailableError("ucx cannot send to " + key->owner.ToString());
    }
    return Status();
  }

  void SettleAttach(Key* key, const Status& status) {
    if (!key->attach_done) return;
    key->attach_done->set_value(status);
    key->attach_done.reset();
  }

  void FailWaiting(Key* key, const Status& status) {
    std::list<Op*> waiting;
    waiting.swap(key->waiting);
    for (Op* op : waiting) {
      op->place = OpPlace::kNew;
      Complete(op, status);
    }
  }

  void Revoke(Key* key, Status why) {
    key->state = KeyState::kRevoked;
    key->refusal = why;
    FailWaiting(key, why);
    SettleAttach(key, why);
  }

  // Once nothing of `key` is in flight: acks pending revocations; destroys a detached key.
  void MaybeRelease(Key* key) {
    if (key->inflight == 0 && !key->acks.empty()) {
      for (uint64_t id : key->acks) {
        SendAm(key->peer->ep, kAmAck, Bytes(AckMsg{id}), std::string(), false);
      }
      key->acks.clear();
    }
    if (!key->detached || key->ops > 0) return;
    if (key->rkey != nullptr) ucp_rkey_destroy(key->rkey);
    key->rkey = nullptr;
    if (key->state != KeyState::kRevoked && key->peer->ep != nullptr) {
      SendAm(key->peer->ep, kAmDetach, Bytes(DetachMsg{key->token}), std::string(), false);
    }
    key->peer->keys.erase(key);
    SettleAttach(key, CancelledError("detached"));
    keys.erase(key->token);
  }

  // ---- Slices ----

  static void OnRequestDone(void* request, ucs_status_t status, void* user_data) {
    auto* op = static_cast<Op*>(user_data);
    if (status != UCS_OK && op->ucs == UCS_OK) op->ucs = status;
    ucp_request_free(request);
    if (--op->parts == 0) op->completed->push_back(op);
  }

  void Track(Op* op, ucs_status_ptr_t request) {
    if (request == nullptr) return;
    if (UCS_PTR_IS_ERR(request)) {
      if (op->ucs == UCS_OK) op->ucs = UCS_PTR_STATUS(request);
      return;
    }
    ++op->parts;
  }

  // Ends an op that is not issued, with `status`.
  void Complete(Op* op, Status status) {
    if (op->place == OpPlace::kQueued) queued.erase(op->in_list);
    if (op->place == OpPlace::kWaiting) op->key->waiting.erase(op->in_list);
    op->place = OpPlace::kNew;
    op->has_final = true;
    op->final_status = std::move(status);
    completed.push_back(op);
  }

  void Admit(Op* op) {
    Key* key = op->key;
    const Slice& s = *op->slice;
    if (s.offset > key->size || s.length > key->size - s.offset) {
      return Complete(
          op, OutOfRangeError("ucx slice [" + std::to_string(s.offset) + ", +" +
                              std::to_string(s.length) + ") outside segment '" +
                              key->owner.segment + "' of " + std::to_string(key->size) + " bytes"));
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

  bool IssueQueued() {
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

  void Issue(Op* op) {
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

  bool ProcessCompleted() {
    bool any = false;
    while (!completed.empty()) {
      std::vector<Op*> batch;
      batch.swap(completed);
      for (Op* op : batch) Finish(op);
      any = true;
    }
    return any;
  }

  void Finish(Op* op) {
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
        status = DeadlineExceededError(std::string("ucx ") + what + " of segment '" +
                                       key->owner.segment + "' at " + key->owner.ToString() +
                                       " passed its deadline");
      } else if (op->ucs != UCS_OK) {
        status =
            UnavailableError(std::string("ucx ") + what + " of segment '" + key->owner.segment +
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

  void ExpireDeadlines() {
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

  // Endpoints with a slice past its deadline: those whose slices have all ended stay as they are;
  // those past their grace are force-closed. True when some are still waiting.
  bool SettleClosing() {
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

  // ---- Shutdown ----

  void Teardown() {
    Status stopped_status = CancelledError("the ucx transport stopped");
    while (!queued.empty()) Complete(queued.front(), stopped_status);
    for (auto& [token, key] : keys) FailWaiting(key.get(), stopped_status);
    for (auto& [token, key] : keys) SettleAttach(key.get(), stopped_status);
    for (auto& [address, peer] : peers) CloseEndpoint(peer.get(), stopped_status);
    auto give_up = Clock::now() + std::chrono::seconds(2);
    while (inflight_slices > 0 && Clock::now() < give_up) {
      ucp_worker_progress(worker);
      ProcessCompleted();
    }
    ProcessCompleted();
    std::vector<Op*> stranded(issued.begin(), issued.end());
    issued.clear();
    for (auto& [token, key] : keys) {
      if (key->rkey != nullptr) ucp_rkey_destroy(key->rkey);
      key->rkey = nullptr;
    }
    for (auto& [id, exported] : exports) ucp_mem_unmap(context, exported.memh);
    exports.clear();
    for (ucp_mem_h memh : local_memhs) ucp_mem_unmap(context, memh);
    local_memhs.clear();
    ucp_worker_destroy(worker);
    worker = nullptr;
    // With the worker gone nothing can complete or touch these buffers any more.
    for (Op* op : stranded) {
      op->has_final = true;
      op->final_status = stopped_status;
      op->timed = false;
      Finish(op);
    }
    deadlines.clear();
    closing.clear();
    keys.clear();
    peers.clear();
  }
};

thread_local UcxWorker::Impl* UcxWorker::Impl::current = nullptr;

UcxWorker::UcxWorker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::shared_ptr<UcxWorker>> UcxWorker::Create(const std::string& engine_id, bool rdma_only,
                                                     std::string cluster_token) {
  auto impl = std::make_unique<Impl>();
  impl->engine_id = engine_id;
  impl->cluster_token = std::move(cluster_token);
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK) return UnavailableError("ucx configuration: " + UcsText(status));
  // UCX's software RMA checks no rkey (see the header): a worker that only RDMA peers should
  // reach opens no tcp lane, unless the operator chose the lanes (UCX_TLS) himself.
  if (rdma_only && std::getenv("UCX_TLS") == nullptr) {
    status = ucp_config_modify(config, "TLS", "^tcp");
    if (status != UCS_OK) {
      ucp_config_release(config);
      return UnavailableError("ucx configuration (TLS=^tcp): " + UcsText(status));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  status = ucp_init(&params, config, &impl->context);
  ucp_config_release(config);
  if (status != UCS_OK) return UnavailableError("ucp_init: " + UcsText(status));
  auto fail = [&](Status s) {
    if (impl->worker != nullptr) ucp_worker_destroy(impl->worker);
    ucp_cleanup(impl->context);
    return s;
  };
  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the worker thread touches it
  status = ucp_worker_create(impl->context, &worker_params, &impl->worker);
  if (status != UCS_OK) {
    impl->worker = nullptr;
    return fail(UnavailableError("ucp_worker_create: " + UcsText(status)));
  }
  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  status = ucp_worker_get_address(impl->worker, &address, &address_length);
  if (status != UCS_OK) return fail(UnavailableError("ucp_worker_get_address: " + UcsText(status)));
  impl->own_address.assign(reinterpret_cast<const char*>(address), address_length);
  ucp_worker_release_address(impl->worker, address);
  if (impl->own_address.size() > kMaxWorkerAddressBytes) {
    return fail(UnavailableError("ucx worker address of " +
                                 std::to_string(impl->own_address.size()) + " bytes"));
  }
  int worker_fd = -1;
  status = ucp_worker_get_efd(impl->worker, &worker_fd);
  if (status != UCS_OK) return fail(UnavailableError("ucp_worker_get_efd: " + UcsText(status)));
  impl->wake = Fd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  impl->epoll = Fd(epoll_create1(EPOLL_CLOEXEC));
  if (!impl->wake.valid() || !impl->epoll.valid()) return fail(ErrnoToStatus(errno, "ucx epoll"));
  for (int fd : {worker_fd, impl->wake.get()}) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = fd;
    if (epoll_ctl(impl->epoll.get(), EPOLL_CTL_ADD, fd, &event) != 0) {
      return fail(ErrnoToStatus(errno, "ucx epoll_ctl"));
    }
  }
  const std::pair<unsigned, ucp_am_recv_callback_t> handlers[] = {{kAmAttach, &Impl::OnAttach},
                                                                  {kAmReply, &Impl::OnReply},
                                                                  {kAmRevoke, &Impl::OnRevoke},
                                                                  {kAmAck, &Impl::OnAck},
                                                                  {kAmDetach, &Impl::OnDetach}};
  for (const auto& [id, cb] : handlers) {
    Status set = impl->SetHandler(id, cb);
    if (!set.ok()) return fail(set);
  }

  std::string info = PrintToString([&](FILE* f) { ucp_context_print_info(impl->context, f); });
  std::string resources;
  bool rdma = false;
  for (const std::string& resource : TokensAfter(info, "resource", true)) {
    resources += (resources.empty() ? "" : " ") + resource;
    std::string_view tl(resource);
    // InfiniBand/RoCE transports: rc_verbs, rc_mlx5, dc_mlx5, ud_verbs, ud_mlx5.
    if (tl.starts_with("rc_") || tl.starts_with("dc_") || tl.starts_with("ud_")) rdma = true;
  }
  auto worker = std::shared_ptr<UcxWorker>(new UcxWorker(std::move(impl)));
  worker->address_ = worker->impl_->own_address;
  worker->resources_ = resources;
  worker->rdma_ = rdma;
  Impl* raw = worker->impl_.get();
  raw->thread = std::thread([raw] { raw->Loop(); });
  Log().info("ucx worker of engine {} up: transports [{}], rdma lane {}", engine_id, resources,
             rdma ? "yes" : "no");
  return worker;
}

UcxWorker::~UcxWorker() {
  Stop();
  if (impl_->context != nullptr) ucp_cleanup(impl_->context);
}

void UcxWorker::Stop() {
  {
    MutexLock lock(impl_->mu);
    if (impl_->stopped) return;
    impl_->stopped = true;
  }
  impl_->stopping.store(true);
  uint64_t one = 1;
  if (write(impl_->wake.get(), &one, sizeof(one)) < 0) {
    // The thread also wakes by its sleep timeout.
  }
  if (impl_->thread.joinable()) impl_->thread.join();
}

Result<std::string> UcxWorker::Export(SegmentId id, uint8_t* base, uint64_t size) {
  Impl* impl = impl_.get();
  return impl->RunSync<std::string>([=]() -> Result<std::string> {
    if (impl->exports.count(id) != 0) {
      return AlreadyExistsError("segment " + std::to_string(id) + " is already exported by ucx");
    }
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    params.address = base;
    params.length = size;
    ucp_mem_h memh = nullptr;
    ucs_status_t status = ucp_mem_map(impl->context, &params, &memh);
    if (status != UCS_OK) return UnavailableError("ucp_mem_map: " + UcsText(status));
    void* packed = nullptr;
    size_t packed_size = 0;
    status = ucp_rkey_pack(impl->context, memh, &packed, &packed_size);
    if (status != UCS_OK || packed_size == 0 || packed_size > kMaxRkeyBytes) {
      if (status == UCS_OK) ucp_rkey_buffer_release(packed);
      ucp_mem_unmap(impl->context, memh);
      return UnavailableError("ucp_rkey_pack: " + UcsText(status) + " (" +
                              std::to_string(packed_size) + " bytes)");
    }
    std::string rkey(static_cast<const char*>(packed), packed_size);
    ucp_rkey_buffer_release(packed);
    impl->exports[id].memh = memh;
    return rkey;
  });
}

void UcxWorker::Unexport(SegmentId id, std::chrono::milliseconds wait) {
  Impl* impl = impl_.get();
  auto revocation = std::make_shared<Revocation>();
  auto memh = impl->RunSync<ucp_mem_h>([=]() -> Result<ucp_mem_h> {
    auto it = impl->exports.find(id);
    if (it == impl->exports.end()) return static_cast<ucp_mem_h>(nullptr);
    for (auto& [token, peer] : it->second.attached) {
      if (peer->ep == nullptr && !impl->Connect(peer.get()).ok()) continue;
      uint64_t revoke_id = impl->next_revoke++;
      if (!impl->SendAm(peer->ep, kAmRevoke, Impl::Bytes(RevokeMsg{token, revoke_id}),
                        std::string(), true)) {
        continue;
      }
      impl->revocations[revoke_id] = {revocation, token};
      MutexLock lock(revocation->mu);
      ++revocation->remaining;
    }
    ucp_mem_h unmapping = it->second.memh;
    impl->exports.erase(it);
    return unmapping;
  });
  if (!memh.ok() || *memh == nullptr) return;
  {
    MutexLock lock(revocation->mu);
    const auto deadline = std::chrono::steady_clock::now() + wait;
    while (revocation->remaining != 0 && revocation->cv.WaitUntil(lock, deadline)) {
    }
    if (revocation->remaining != 0) {
      Log().warn("ucx: {} peer(s) did not confirm within {} ms that they stopped using segment {}",
                 revocation->remaining, wait.count(), id);
    }
  }
  auto unmapped = impl->RunSync<bool>([=]() -> Result<bool> {
    for (auto it = impl->revocations.begin(); it != impl->revocations.end();) {
      it = it->second.first == revocation ? impl->revocations.erase(it) : std::next(it);
    }
    ucp_mem_unmap(impl->context, *memh);
    return true;
  });
  (void)unmapped;  // stopped meanwhile: the teardown freed everything
}

Result<ucp_mem_h> UcxWorker::MapLocal(uint64_t begin, uint64_t length) {
  Impl* impl = impl_.get();
  return impl->RunSync<ucp_mem_h>([=]() -> Result<ucp_mem_h> {
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    params.address = reinterpret_cast<void*>(begin);
    params.length = length;
    ucp_mem_h memh = nullptr;
    ucs_status_t status = ucp_mem_map(impl->context, &params, &memh);
    if (status != UCS_OK) return UnavailableError("ucp_mem_map: " + UcsText(status));
    impl->local_memhs.push_back(memh);
    return memh;
  });
}

Result<uint64_t> UcxWorker::Attach(const UcxBlob& blob, PeerName owner, Deadline deadline) {
  Impl* impl = impl_.get();
  auto attached = std::make_shared<std::promise<Status>>();
  auto reply = attached->get_future();
  LARDER_ASSIGN_OR_RETURN(uint64_t token, impl->RunSync<uint64_t>([&]() -> Result<uint64_t> {
    auto key = std::make_unique<Key>();
    do {
      key->token = impl->random();
    } while (key->token == 0 || impl->keys.count(key->token) != 0);
    key->peer = impl->PeerFor(blob.worker_address);
    key->owner = owner;
    key->packed_rkey = Padded(blob.rkey);
    key->segment_id = blob.segment_id;
    key->base = blob.remote_base;
    key->size = blob.size;
    key->attach_done = attached;
    Key* raw = key.get();
    raw->peer->keys.insert(raw);
    impl->keys[raw->token] = std::move(key);
    Status s = impl->EnsureAttached(raw);
    if (!s.ok()) {
      raw->attach_done.reset();
      raw->detached = true;
      raw->state = KeyState::kRevoked;  // nothing to detach from
      impl->MaybeRelease(raw);
      return s.WithContext("attaching segment '" + owner.segment + "' of " + owner.ToString());
    }
    return raw->token;
  }));
  if (reply.wait_until(deadline) != std::future_status::ready) {
    Detach(token);
    return UnavailableError("no ucx attach reply from " + owner.ToString() + " for segment '" +
                            owner.segment + "' in time");
  }
  Status status = reply.get();
  if (!status.ok()) {
    Detach(token);
    return status;
  }
  return token;
}

void UcxWorker::Detach(uint64_t token) {
  Impl* impl = impl_.get();
  impl->Post([impl, token] {
    auto it = impl->keys.find(token);
    if (it == impl->keys.end()) return;
    Key* key = it->second.get();
    key->detached = true;
    impl->FailWaiting(key, UnavailableError("segment '" + key->owner.segment + "' was closed"));
    impl->MaybeRelease(key);
  });
}

void UcxWorker::Submit(uint64_t token, std::span<const LocalSlice> slices, SliceCallback* done) {
  Impl* impl = impl_.get();
  std::vector<LocalSlice> copy(slices.begin(), slices.end());
  bool posted = impl->Post([impl, token, copy = std::move(copy), done] {
    auto it = impl->keys.find(token);
    for (const LocalSlice& local : copy) {
      if (it == impl->keys.end()) {
        done->OnSliceDone(local.slice, UnavailableError("ucx segment was closed"));
        continue;
      }
      auto* op = new Op;
      op->completed = &impl->completed;
      op->slice = local.slice;
      op->done = done;
      op->key = it->second.get();
      op->memh = local.memh;
      ++op->key->ops;
      impl->Admit(op);
    }
  });
  if (!posted) {
    for (const LocalSlice& local : slices) {
      done->OnSliceDone(local.slice, CancelledError("the ucx transport stopped"));
    }
  }
}

}  // namespace larder::transfer::ucx
