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
#include "transfer/ucx/ucx_worker_impl.h"

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

thread_local UcxWorker::Impl* UcxWorker::Impl::current = nullptr;

// ---- The worker thread ----

bool UcxWorker::Impl::Post(std::function<void()> task) {
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

bool UcxWorker::Impl::RunTasks() {
  std::deque<std::function<void()>> batch;
  {
    MutexLock lock(mu);
    batch.swap(tasks);
  }
  for (auto& task : batch) task();
  return !batch.empty();
}

void UcxWorker::Impl::Loop() {
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

void UcxWorker::Impl::Sleep() {
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

void UcxWorker::Impl::Teardown() {
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

// ---- Public calls ----

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
