// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/device/device_staging.h"

#include "common/env.h"
#include "common/logging.h"
#include "common/thread_pool.h"
#include "transfer/device/device_scope.h"
#include "transfer/registration_coverage.h"

namespace larder::transfer {

DeviceStaging::Buffer& DeviceStaging::Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Reset();
    owner_ = other.owner_;
    pool_ = other.pool_;
    data_ = other.data_;
    other.owner_ = nullptr;
    other.data_ = nullptr;
  }
  return *this;
}

void DeviceStaging::Buffer::Reset() {
  if (data_ != nullptr) owner_->Release(pool_, data_);
  owner_ = nullptr;
  data_ = nullptr;
}

DeviceStaging::DeviceStaging(std::shared_ptr<DeviceBackend> backend,
                             std::function<Result<int>()> device,
                             std::function<Status(void*, uint64_t)> register_host,
                             DeviceStagingOptions options)
    : backend_(std::move(backend)),
      device_(std::move(device)),
      register_host_(std::move(register_host)),
      options_(options) {
  MutexLock lock(mu_);
  pools_[static_cast<int>(Pool::kServe)].limit = std::max<size_t>(1, options_.serve_buffers);
  pools_[static_cast<int>(Pool::kInitiate)].limit = std::max<size_t>(1, options_.initiate_buffers);
}

DeviceStaging::~DeviceStaging() {
  std::vector<uint8_t*> all;
  {
    MutexLock lock(mu_);
    all.swap(all_);
  }
  if (all.empty()) return;
  Result<int> device = device_();
  if (!device.ok()) return;
  DeviceScope scope(*backend_, *device);
  for (uint8_t* data : all) {
    if (Status freed = backend_->FreeHost(data); !freed.ok()) {
      Log().warn("pinned staging buffer at {} not freed: {}", static_cast<void*>(data),
                 freed.ToString());
    }
  }
}

Result<uint8_t*> DeviceStaging::TakeLocked(PoolState& pool) {
  if (!pool.free.empty()) {
    uint8_t* data = pool.free.back();
    pool.free.pop_back();
    return data;
  }
  if (pool.allocated >= pool.limit) return static_cast<uint8_t*>(nullptr);
  LARDER_ASSIGN_OR_RETURN(int device, device_());
  DeviceScope scope(*backend_, device);
  LARDER_RETURN_IF_ERROR(scope.status());
  LARDER_ASSIGN_OR_RETURN(void* data, backend_->AllocateHost(options_.chunk_bytes));
  if (Status registered = register_host_(data, options_.chunk_bytes); !registered.ok()) {
    backend_->FreeHost(data).IgnoreError();
    return registered.WithContext("registering a pinned staging buffer");
  }
  ++pool.allocated;
  all_.push_back(static_cast<uint8_t*>(data));
  return static_cast<uint8_t*>(data);
}

Result<DeviceStaging::Buffer> DeviceStaging::Acquire(Pool pool, Deadline deadline) {
  MutexLock lock(mu_);
  PoolState& state = pools_[static_cast<int>(pool)];
  bool waited = false;
  for (;;) {
    // Queued asynchronous waiters go first.
    if (state.waiters.empty()) {
      LARDER_ASSIGN_OR_RETURN(uint8_t * data, TakeLocked(state));
      if (data != nullptr) {
        in_use_.fetch_add(1, std::memory_order_relaxed);
        return Buffer(this, pool, data);
      }
    }
    if (!waited) {
      waited = true;
      waits_.fetch_add(1, std::memory_order_relaxed);
    }
    if (!released_.WaitUntil(lock, deadline)) {
      return DeadlineExceededError("no pinned staging buffer came free before the deadline (" +
                                   std::to_string(state.limit) + " of " +
                                   FormatByteSize(options_.chunk_bytes) + " in use)");
    }
  }
}

void DeviceStaging::AcquireAsync(Pool pool, ThreadPool* executor,
                                 std::function<void(Result<Buffer>)> fn) {
  Result<uint8_t*> taken = static_cast<uint8_t*>(nullptr);
  {
    MutexLock lock(mu_);
    PoolState& state = pools_[static_cast<int>(pool)];
    if (state.waiters.empty()) taken = TakeLocked(state);
    if (taken.ok() && *taken == nullptr) {
      waits_.fetch_add(1, std::memory_order_relaxed);
      state.waiters.push_back(Waiter{executor, std::move(fn)});
      return;
    }
    if (taken.ok()) in_use_.fetch_add(1, std::memory_order_relaxed);
  }
  if (!taken.ok()) return fn(taken.status());
  fn(Buffer(this, pool, *taken));
}

void DeviceStaging::Release(Pool pool, uint8_t* data) {
  Waiter next;
  {
    MutexLock lock(mu_);
    PoolState& state = pools_[static_cast<int>(pool)];
    if (state.waiters.empty()) {
      state.free.push_back(data);
      in_use_.fetch_sub(1, std::memory_order_relaxed);
      released_.SignalAll();
      return;
    }
    // Handed straight to the first queued waiter: still in use.
    next = std::move(state.waiters.front());
    state.waiters.pop_front();
  }
  auto run = [this, pool, data, fn = std::move(next.fn)]() mutable {
    fn(Buffer(this, pool, data));
  };
  if (next.executor != nullptr) {
    next.executor->Schedule(std::move(run));
  } else {
    run();
  }
}

Status DeviceStaging::Copy(uint8_t* dst, const uint8_t* src, uint64_t length) {
  LARDER_ASSIGN_OR_RETURN(int device, device_());
  DeviceScope scope(*backend_, device);
  LARDER_RETURN_IF_ERROR(scope.status());
  // Every piece is submitted before the first is waited for: the device queues them.
  std::vector<uint64_t> ids;
  Status failed;
  for (auto [offset, piece] :
       SplitAtBoundaries(reinterpret_cast<uint64_t>(src), reinterpret_cast<uint64_t>(dst), length,
                         backend_->registration_granularity())) {
    Result<uint64_t> id = backend_->SubmitCopy(dst + offset, src + offset, piece);
    if (!id.ok()) {
      failed = id.status();
      break;
    }
    ids.push_back(*id);
  }
  for (uint64_t id : ids) {
    Status waited = backend_->WaitCopy(id);
    if (failed.ok() && !waited.ok()) failed = waited;
  }
  if (!failed.ok()) copy_failures_.fetch_add(1, std::memory_order_relaxed);
  return failed;
}

Status DeviceStaging::ToHost(uint8_t* host, const uint8_t* device, uint64_t length) {
  LARDER_RETURN_IF_ERROR(Copy(host, device, length).WithContext("device -> host staging copy"));
  to_host_.fetch_add(length, std::memory_order_relaxed);
  return Status();
}

Status DeviceStaging::ToDevice(uint8_t* device, const uint8_t* host, uint64_t length) {
  LARDER_RETURN_IF_ERROR(Copy(device, host, length).WithContext("host -> device staging copy"));
  to_device_.fetch_add(length, std::memory_order_relaxed);
  return Status();
}

DeviceStagingStats DeviceStaging::stats() const {
  DeviceStagingStats out;
  {
    MutexLock lock(mu_);
    out.pinned_buffers = all_.size();
  }
  out.buffers_in_use = in_use_.load(std::memory_order_relaxed);
  out.waits = waits_.load(std::memory_order_relaxed);
  out.bytes_to_host = to_host_.load(std::memory_order_relaxed);
  out.bytes_to_device = to_device_.load(std::memory_order_relaxed);
  out.copy_failures = copy_failures_.load(std::memory_order_relaxed);
  return out;
}

}  // namespace larder::transfer
