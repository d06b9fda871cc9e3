// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Test helpers for the device transport: an engine whose only route is the device transport over
// an emulated backend that the test holds (to read its counters and bind threads to devices),
// and one-request transfers. Test-only.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "larder/transfer_engine.h"
#include "transfer/device/device_transport.h"
#include "transfer/device/emulated_device.h"
#include "transfer/engine_internal.h"

namespace larder::testutil {

// The emulator keeps the current device per thread and a fresh thread has none, so tests run
// their device-free parts (or parts bound to another device) on fresh threads.
template <typename Fn>
auto OnNewThread(Fn fn) {
  using R = decltype(fn());
  std::optional<R> result;
  std::thread t([&] { result.emplace(fn()); });
  t.join();
  return std::move(*result);
}

struct DeviceEngine {
  std::shared_ptr<transfer::EmulatedDevice> backend;
  std::unique_ptr<TransferEngine> engine;
};

// An engine of protocol "device" over `backend`; null (with a test failure) when it cannot start.
inline std::unique_ptr<TransferEngine> MakeEngineOver(
    std::shared_ptr<transfer::DeviceBackend> backend) {
  std::vector<std::unique_ptr<transfer::Transport>> transports;
  transports.push_back(transfer::CreateDeviceTransport(std::move(backend)));
  TransferEngineOptions options;
  options.protocol = "device";
  auto engine = transfer::CreateEngineWithTransports(options, std::move(transports));
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(engine).value() : nullptr;
}

// An engine of protocol "device" over a fresh emulated backend with `device_options`.
inline DeviceEngine MakeDeviceEngine(transfer::EmulatedDeviceOptions device_options = {}) {
  DeviceEngine d;
  d.backend = std::make_shared<transfer::EmulatedDevice>(std::move(device_options));
  d.engine = MakeEngineOver(d.backend);
  return d;
}

// 8 MiB of device memory of `d`'s backend, registered with its engine as two registrations
// (2 MiB, then 6 MiB), so that a copy crossing 2 MiB must be split on the local side; the current
// device must be set. Null (with a test failure) when it cannot be had.
inline uint8_t* SplitRegisteredDeviceMemory(DeviceEngine& d) {
  constexpr uint64_t kMiB = 1 << 20;
  auto raw = d.backend->Allocate(8 * kMiB);
  EXPECT_TRUE(raw.ok()) << raw.status();
  if (!raw.ok()) return nullptr;
  auto* local = static_cast<uint8_t*>(*raw);
  EXPECT_TRUE(d.engine->RegisterLocalMemory(local, 2 * kMiB).ok());
  EXPECT_TRUE(d.engine->RegisterLocalMemory(local + 2 * kMiB, 6 * kMiB).ok());
  return local;
}

// Moves one request synchronously; its status (InternalError when OK but short).
inline Status TransferOne(TransferEngine& engine, TransferOp op, void* local, SegmentHandle segment,
                          uint64_t offset, uint64_t length, RouteKind* route = nullptr) {
  TransferRequest r{op, local, segment, offset, length};
  LARDER_ASSIGN_OR_RETURN(auto results, engine.TransferSync({&r, 1}, std::chrono::seconds(10)));
  if (route) *route = results[0].route;
  if (results[0].status.ok() && results[0].bytes != length) return InternalError("short transfer");
  return results[0].status;
}

}  // namespace larder::testutil
