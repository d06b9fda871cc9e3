// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The worker's state and its thread's work (UcxWorker::Impl). Everything but the task queue belongs
// to the worker thread: public calls reach it through Post and RunSync. By concern:
// ucx_worker.cc (the thread, its loop and shutdown, the public calls), ucx_worker_peers.cc
// (endpoints, the attach protocol over active messages, the remote keys it grants) and
// ucx_worker_slices.cc (admitting, issuing and finishing transfers, deadlines).
// Not part of the public API.
#pragma once

#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/net.h"
#include "transfer/ucx/ucx_worker.h"
#include "transfer/ucx/ucx_worker_internal.h"

namespace larder::transfer::ucx {

struct UcxWorker::Impl {
  using Peer = internal::Peer;
  using Key = internal::Key;
  using Op = internal::Op;
  using Exported = internal::Exported;
  using Revocation = internal::Revocation;

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

  bool Post(std::function<void()> task);

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

  bool RunTasks();

  // ---- The loop ----

  void Loop();

  void Sleep();

  // ---- Peers and endpoints ----

  std::shared_ptr<Peer> PeerFor(const std::string& worker_address);

  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);

  Status Connect(Peer* peer);

  // Force-closes the peer's endpoint: UCX ends its requests (their callbacks run) and nothing of
  // theirs touches local memory afterwards. Slices waiting for an attach reply fail with `why`.
  void CloseEndpoint(Peer* peer, Status why);

  void LogLanes(Peer* peer, const PeerName& owner);

  // ---- Active messages ----

  static void OnAmSent(void* request, ucs_status_t, void* user_data);

  bool SendAm(ucp_ep_h ep, unsigned id, std::string header, std::string data, bool reply);

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
                               size_t length, const ucp_am_recv_param_t* param);

  // Initiator side: the owner's answer to an attach.
  static ucs_status_t OnReply(void* arg, const void* header, size_t header_length, void*, size_t,
                              const ucp_am_recv_param_t*);

  // Initiator side: the owner unregistered a segment we attached to.
  static ucs_status_t OnRevoke(void* arg, const void* header, size_t header_length, void*, size_t,
                               const ucp_am_recv_param_t* param);

  // Owner side: an initiator stopped accessing a segment we revoked.
  static ucs_status_t OnAck(void* arg, const void* header, size_t header_length, void*, size_t,
                            const ucp_am_recv_param_t*);

  static ucs_status_t OnDetach(void* arg, const void* header, size_t header_length, void*, size_t,
                               const ucp_am_recv_param_t*);

  void Acknowledged(uint64_t revoke_id);

  Status SetHandler(unsigned id, ucp_am_recv_callback_t cb);

  // ---- Keys ----

  // Makes `key` usable on its peer's current endpoint: connects when there is none, and unpacks
  // the rkey and attaches again when the endpoint changed.
  Status EnsureAttached(Key* key);

  void SettleAttach(Key* key, const Status& status);

  void FailWaiting(Key* key, const Status& status);

  void Revoke(Key* key, Status why);

  // Once nothing of `key` is in flight: acks pending revocations; destroys a detached key.
  void MaybeRelease(Key* key);

  // ---- Slices ----

  static void OnRequestDone(void* request, ucs_status_t status, void* user_data);

  void Track(Op* op, ucs_status_ptr_t request);

  // Ends an op that is not issued, with `status`.
  void Complete(Op* op, Status status);

  void Admit(Op* op);

  bool IssueQueued();

  void Issue(Op* op);

  bool ProcessCompleted();

  void Finish(Op* op);

  void ExpireDeadlines();

  // Endpoints with a slice past its deadline: those whose slices have all ended stay as they are;
  // those past their grace are force-closed. True when some are still waiting.
  bool SettleClosing();

  // ---- Shutdown ----

  void Teardown();
};

}  // namespace larder::transfer::ucx
