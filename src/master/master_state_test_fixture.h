// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The fixture of the MasterState tests: a MasterState on a fake clock, and one-key helpers.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <string_view>

#include "master/master_state.h"

namespace larder::master {

class MasterStateTest : public ::testing::Test {
 protected:
  MasterStateTest() : MasterStateTest([](MasterOptions&) {}) {}
  explicit MasterStateTest(const std::function<void(MasterOptions&)>& tweak)
      : state_(MakeOptions(tweak)) {}

  MasterOptions MakeOptions(const std::function<void(MasterOptions&)>& tweak) {
    MasterOptions options;
    options.clock = [this] { return now_; };
    options.lease_ttl = std::chrono::milliseconds(1000);
    options.client_ttl = std::chrono::milliseconds(5000);
    options.put_timeout = std::chrono::milliseconds(3000);
    options.max_key_size = 64;
    options.shards = 8;
    tweak(options);
    return options;
  }

  void Advance(std::chrono::milliseconds d) { now_ += d; }

  PoolSegmentId Mount(const std::string& client, const std::string& name, uint64_t size,
                      uint64_t base = 0x100000, const std::string& host = "host-a") {
    SegmentMount mount{name, base, size, {}};
    auto results = state_.MountSegments(client, host, std::span(&mount, 1));
    EXPECT_TRUE(results[0].ok()) << results[0].status();
    return results[0].ok() ? *results[0] : 0;
  }

  PutStartOutcome PutStart(const std::string& client, const std::string& key, uint64_t size,
                           PutOptions options = {}) {
    PutStartItem item{key, size};
    auto results = state_.BatchPutStart(client, std::span(&item, 1), options);
    EXPECT_TRUE(results.ok()) << results.status();
    if (!results.ok()) {
      PutStartOutcome failed;
      failed.status = results.status();
      return failed;
    }
    return (*results)[0];
  }

  Status One(const Result<std::vector<Status>>& results) {
    if (!results.ok()) return results.status();
    return results->at(0);
  }
  Status PutEnd(const std::string& client, std::string_view key) {
    return One(state_.BatchPutEnd(client, std::span(&key, 1)));
  }
  Status Put(const std::string& client, const std::string& key, uint64_t size,
             PutOptions options = {}) {
    PutStartOutcome start = PutStart(client, key, size, options);
    if (!start.status.ok() || start.already_exists) return start.status;
    return PutEnd(client, key);
  }
  // Puts pages k<first> .. k<last - 1> of 4 KiB as client "a"; the first failure, if any.
  Status PutPages(int first, int last) {
    for (int i = first; i < last; ++i) {
      Status status = Put("a", "k" + std::to_string(i), 4096);
      if (!status.ok()) return status.WithContext("k" + std::to_string(i));
    }
    return Status::Ok();
  }
  // A get of one key, and its lease id (0: none).
  GetOutcome Get(const std::string& client, std::string_view key, uint64_t* lease_id = nullptr,
                 GetMode mode = GetMode::kLease) {
    auto batch = state_.BatchGetReplicas(client, std::span(&key, 1), mode);
    if (lease_id != nullptr) *lease_id = batch.ok() ? batch->lease_id : 0;
    if (!batch.ok()) {
      GetOutcome failed;
      failed.status = batch.status();
      return failed;
    }
    return batch->items[0];
  }
  uint64_t Lease(const std::string& client, std::string_view key) {
    uint64_t lease_id = 0;
    GetOutcome got = Get(client, key, &lease_id);
    EXPECT_TRUE(got.status.ok()) << got.status;
    EXPECT_NE(lease_id, 0u);
    return lease_id;
  }
  Status Release(const std::string& client, uint64_t lease_id) {
    return One(state_.ReleaseLeases(client, std::span(&lease_id, 1)));
  }
  Status Exist(const std::string& client, std::string_view key) {
    return One(state_.BatchExist(client, std::span(&key, 1)));
  }
  Status Remove(const std::string& client, std::string_view key, bool force = false) {
    return One(state_.BatchRemove(client, std::span(&key, 1), force));
  }
  // One sweep, with the clients "a" and "b" alive.
  void Sweep() {
    state_.Heartbeat("a");
    state_.Heartbeat("b");
    state_.RunMaintenance();
  }
  uint64_t SoftPinned() { return state_.Stats().soft_pinned_objects; }
  uint64_t OffsetOf(std::string_view key) {
    GetOutcome got = Get("a", key, nullptr, GetMode::kPeek);
    EXPECT_TRUE(got.status.ok()) << got.status;
    return got.replicas.empty() ? UINT64_MAX : got.replicas[0].offset;
  }

  Clock::time_point now_ = Clock::time_point(std::chrono::hours(1));
  MasterState state_;
};

// A pool that evicts exactly what a put needs (no slack).
class ExactEvictionTest : public MasterStateTest {
 protected:
  ExactEvictionTest()
      : MasterStateTest([](MasterOptions& options) { options.eviction_slack = 0; }) {}
};

}  // namespace larder::master
