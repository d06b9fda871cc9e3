// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Staging of device memory through pinned host memory, for the routes that move bytes with the
// CPU. The owner of a device segment that a peer reaches over tcp copies device -> host before it
// sends and host -> device after it receives; an engine whose own buffer is device memory does
// the same around any CPU route (tcp, shm, local, ucx). The device transport makes one per
// engine, over its backend and its initialized device, so every copy keeps that transport's
// rules: the native calls run bound to that device, and each copy is split at every granularity
// boundary of both sides.
//
// Buffers are chunk_bytes of pinned host memory (DeviceBackend::AllocateHost), allocated on
// first need and kept, in two bounded pools: one serves peers, one stages this engine's own
// requests. A server's buffer never waits on a peer, so with separate pools no two engines can
// hold each other's buffers in a cycle. A full pool is back-pressure, not an error: Acquire waits
// (until its deadline), AcquireAsync queues.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "common/mutex.h"
#include "common/net.h"
#include "transfer/device/device_backend.h"

namespace larder {
class ThreadPool;
}

namespace larder::transfer {

struct DeviceStagingOptions {
  // One buffer, and the most one staged slice moves: 1 MiB pipelines a request of a few MiB over
  // several connections and copy threads (measured: 256 KiB and 512 KiB cost more per byte,
  // 2 MiB pipelines less).
  uint64_t chunk_bytes = 1ULL << 20;
  size_t serve_buffers = 8;      // 8 MiB pinned for serving peers, at most
  size_t initiate_buffers = 16;  // 16 MiB pinned for this engine's own requests, at most
};

struct DeviceStagingStats {
  uint64_t pinned_buffers = 0;   // allocated (pinned host memory held: pinned_buffers x chunk)
  uint64_t buffers_in_use = 0;   // leased now; 0 when nothing is being staged
  uint64_t waits = 0;            // times a request found its pool empty and waited
  uint64_t bytes_to_host = 0;    // device -> pinned host
  uint64_t bytes_to_device = 0;  // pinned host -> device
  uint64_t copy_failures = 0;
};

class DeviceStaging {
 public:
  enum class Pool : uint8_t { kServe = 0, kInitiate = 1 };

  // `device` gives the device the transport initialized on (an error before its first native
  // call); `register_host` makes a new pinned buffer usable by copies where the backend does not
  // read unregistered host memory (the transport's registration coverage).
  DeviceStaging(std::shared_ptr<DeviceBackend> backend, std::function<Result<int>()> device,
                std::function<Status(void*, uint64_t)> register_host,
                DeviceStagingOptions options = {});
  // Frees the pooled buffers. REQUIRES: none is leased.
  ~DeviceStaging();
  DeviceStaging(const DeviceStaging&) = delete;
  DeviceStaging& operator=(const DeviceStaging&) = delete;

  uint64_t chunk_bytes() const { return options_.chunk_bytes; }
  // Whether [ptr, ptr + length) touches device memory of the backend.
  bool IsDeviceMemory(const void* ptr, uint64_t length) const {
    return backend_->IsDeviceMemory(ptr, length);
  }

  // A leased pinned buffer of chunk_bytes, back in its pool when destroyed.
  class Buffer {
   public:
    Buffer() = default;
    Buffer(Buffer&& other) noexcept { *this = std::move(other); }
    Buffer& operator=(Buffer&& other) noexcept;
    ~Buffer() { Reset(); }
    uint8_t* data() const { return data_; }
    explicit operator bool() const { return data_ != nullptr; }
    void Reset();

   private:
    friend class DeviceStaging;
    Buffer(DeviceStaging* owner, Pool pool, uint8_t* data)
        : owner_(owner), pool_(pool), data_(data) {}
    DeviceStaging* owner_ = nullptr;
    Pool pool_ = Pool::kServe;
    uint8_t* data_ = nullptr;
  };

  // A buffer of `pool`, waiting while the pool is exhausted: DeadlineExceeded once `deadline`
  // passes; the pinned allocation's error when a new buffer cannot be had.
  Result<Buffer> Acquire(Pool pool, Deadline deadline);
  // Runs `fn` with a buffer of `pool` (or the allocation's error): at once on this thread when
  // one is free, otherwise on `executor` once one is released. Never blocks.
  void AcquireAsync(Pool pool, ThreadPool* executor, std::function<void(Result<Buffer>)> fn);

  // Copies device -> pinned host (ToHost) and pinned host -> device (ToDevice), waiting for them.
  Status ToHost(uint8_t* host, const uint8_t* device, uint64_t length);
  Status ToDevice(uint8_t* device, const uint8_t* host, uint64_t length);

  DeviceStagingStats stats() const;

 private:
  struct Waiter {
    ThreadPool* executor;
    std::function<void(Result<Buffer>)> fn;
  };
  struct PoolState {
    size_t limit = 0;
    size_t allocated = 0;
    std::vector<uint8_t*> free;
    std::deque<Waiter> waiters;
  };

  // A free buffer of `pool`, a new one when under the limit, or null when exhausted.
  Result<uint8_t*> TakeLocked(PoolState& pool) LARDER_REQUIRES(mu_);
  void Release(Pool pool, uint8_t* data);
  Status Copy(uint8_t* dst, const uint8_t* src, uint64_t length);

  const std::shared_ptr<DeviceBackend> backend_;
  const std::function<Result<int>()> device_;
  const std::function<Status(void*, uint64_t)> register_host_;
  const DeviceStagingOptions options_;
  mutable Mutex mu_;
  CondVar released_;
  PoolState pools_[2] LARDER_GUARDED_BY(mu_);
  std::vector<uint8_t*> all_ LARDER_GUARDED_BY(mu_);
  std::atomic<uint64_t> in_use_{0};
  std::atomic<uint64_t> waits_{0};
  std::atomic<uint64_t> to_host_{0};
  std::atomic<uint64_t> to_device_{0};
  std::atomic<uint64_t> copy_failures_{0};
};

}  // namespace larder::transfer
