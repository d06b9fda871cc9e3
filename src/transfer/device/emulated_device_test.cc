// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The emulator must be as strict as hardware: each rule it claims gets a test that breaks it.
#include "transfer/device/emulated_device.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

namespace larder::transfer {
namespace {

constexpr uint64_t kMiB = 1 << 20;

// Runs `fn` on a fresh thread (whose current device starts unset) and returns its result.
template <typename Fn>
auto OnNewThread(Fn fn) {
  decltype(fn()) result = InternalError("not run");
  std::thread t([&] { result = fn(); });
  t.join();
  return result;
}

class EmulatedDeviceTest : public ::testing::Test {
 protected:
  // Binds this thread to device 3 and initializes the library there.
  void InitOnDevice3() {
    ASSERT_TRUE(device_.SetCurrentDevice(3).ok());
    ASSERT_TRUE(device_.Init().ok());
  }
  EmulatedDevice device_;
};

TEST_F(EmulatedDeviceTest, NothingWorksBeforeInit) {
  ASSERT_TRUE(device_.SetCurrentDevice(0).ok());
  EXPECT_EQ(device_.Allocate(kMiB).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(device_.Register(0, 2 * kMiB).code(), StatusCode::kFailedPrecondition);
}

TEST_F(EmulatedDeviceTest, InitNeedsACurrentDeviceAndRunsOnce) {
  Status no_device = OnNewThread([&] { return device_.Init(); });
  EXPECT_EQ(no_device.code(), StatusCode::kFailedPrecondition) << no_device;
  InitOnDevice3();
  EXPECT_EQ(device_.init_device(), 3);
  EXPECT_EQ(device_.Init().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(device_.SetCurrentDevice(99).code(), StatusCode::kInvalidArgument);
}

TEST_F(EmulatedDeviceTest, CallsFromOtherDevicesOrUnboundThreadsFail) {
  InitOnDevice3();
  auto unbound = OnNewThread([&] { return device_.Allocate(kMiB).status(); });
  EXPECT_EQ(unbound.code(), StatusCode::kFailedPrecondition) << unbound;
  auto other = OnNewThread([&] {
    device_.SetCurrentDevice(1).IgnoreError();
    return device_.Register(0x200000, 2 * kMiB);
  });
  EXPECT_EQ(other.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(other.message().find("device 1"), std::string::npos) << other;
  auto bound = OnNewThread([&] {
    device_.SetCurrentDevice(3).IgnoreError();
    return device_.Allocate(kMiB).status();
  });
  EXPECT_TRUE(bound.ok()) << bound;
}

TEST_F(EmulatedDeviceTest, AllocationsAreAlignedAndFreed) {
  InitOnDevice3();
  auto p = device_.Allocate(3 * kMiB);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(reinterpret_cast<uint64_t>(*p) % (2 * kMiB), 0u);
  std::memset(*p, 1, 4 * kMiB);  // rounded up to the granularity: all of it is usable
  EXPECT_EQ(device_.live_allocations(), 1u);
  EXPECT_TRUE(device_.Free(*p).ok());
  EXPECT_EQ(device_.live_allocations(), 0u);
  EXPECT_EQ(device_.Free(*p).code(), StatusCode::kInvalidArgument);
}

TEST_F(EmulatedDeviceTest, RegistrationsMustBeAlignedAndDisjoint) {
  InitOnDevice3();
  EXPECT_EQ(device_.Register(0x100000, 2 * kMiB).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(device_.Register(0x200000, kMiB).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(device_.Register(0x200000, 4 * kMiB).ok());  // [0x200000, 0x600000)
  // The RFC's case: B's aligned range [0x400000, 0x800000) overlaps A's.
  EXPECT_EQ(device_.Register(0x400000, 4 * kMiB).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(device_.Register(0x000000, 4 * kMiB).code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(device_.Register(0x600000, 2 * kMiB).ok());  // adjacent is fine
  EXPECT_TRUE(device_.Deregister(0x200000).ok());
  EXPECT_EQ(device_.Deregister(0x200000).code(), StatusCode::kNotFound);
}

TEST_F(EmulatedDeviceTest, CopiesMustStayInsideOneRegistration) {
  InitOnDevice3();
  auto mem = device_.Allocate(8 * kMiB);
  ASSERT_TRUE(mem.ok());
  auto base = reinterpret_cast<uint64_t>(*mem);
  ASSERT_TRUE(device_.Register(base, 2 * kMiB).ok());
  ASSERT_TRUE(device_.Register(base + 2 * kMiB, 2 * kMiB).ok());
  std::vector<uint8_t> host(4 * kMiB, 7);
  auto* dev = static_cast<uint8_t*>(*mem);
  // Inside one registration: fine (host side needs none: the bypass is on by default).
  auto ok = device_.SubmitCopy(dev + 100, host.data(), kMiB);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(device_.QueryCopy(*ok).value());
  EXPECT_EQ(dev[100], 7);
  // Crossing from the first registration into the adjacent second one: rejected, as a native MR
  // copy would be.
  auto crossing = device_.SubmitCopy(dev + 2 * kMiB - 4096, host.data(), 8192);
  EXPECT_EQ(crossing.status().code(), StatusCode::kInvalidArgument) << crossing.status();
  // Unregistered device memory: rejected.
  auto unregistered = device_.SubmitCopy(host.data(), dev + 5 * kMiB, 4096);
  EXPECT_EQ(unregistered.status().code(), StatusCode::kInvalidArgument);
}

TEST(EmulatedDeviceStrictHostTest, HostMemoryNeedsRegistrationWithoutTheBypass) {
  EmulatedDevice device({.reads_unregistered_host_memory = false});
  ASSERT_TRUE(device.SetCurrentDevice(0).ok());
  ASSERT_TRUE(device.Init().ok());
  auto mem = device.Allocate(2 * kMiB);
  ASSERT_TRUE(mem.ok());
  ASSERT_TRUE(device.Register(reinterpret_cast<uint64_t>(*mem), 2 * kMiB).ok());
  std::vector<uint8_t> host(4096);
  auto copy = device.SubmitCopy(*mem, host.data(), host.size());
  EXPECT_EQ(copy.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(EmulatedDeviceTest, InjectedFaultsHitTheNthCallOnce) {
  InitOnDevice3();
  device_.FailRegistrationAt(2);
  EXPECT_TRUE(device_.Register(0x200000, 2 * kMiB).ok());
  EXPECT_EQ(device_.Register(0x400000, 2 * kMiB).code(), StatusCode::kUnavailable);
  EXPECT_TRUE(device_.Register(0x400000, 2 * kMiB).ok());  // a retry succeeds

  auto mem = device_.Allocate(2 * kMiB);
  ASSERT_TRUE(mem.ok());
  ASSERT_TRUE(device_.Register(reinterpret_cast<uint64_t>(*mem), 2 * kMiB).ok());
  std::vector<uint8_t> host(4096, 1);
  device_.FailCopyAt(1);
  auto failed = device_.SubmitCopy(*mem, host.data(), host.size());
  ASSERT_TRUE(failed.ok());
  EXPECT_EQ(device_.QueryCopy(*failed).status().code(), StatusCode::kUnavailable);
  auto next = device_.SubmitCopy(*mem, host.data(), host.size());
  ASSERT_TRUE(next.ok());
  EXPECT_TRUE(device_.QueryCopy(*next).value());
  EXPECT_EQ(device_.QueryCopy(*next).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace larder::transfer
