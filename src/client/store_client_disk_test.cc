// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The disk tier end to end (docs/disk-tier.md): a real larder-master (gRPC, in this process), a
// store client that holds a disk directory, and readers without one. Objects past the memory pool
// are demoted before eviction and read back from disk through the usual get paths; the holder's
// restart and the master's keep the copies; removals and overwrites never let a disk copy stand
// in for the current object.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/child_process.h"
#include "larder/store_client.h"
#include "master/master_server.h"
#include "master/metrics_text.h"
#include "testing/binaries.h"
#include "testing/values.h"
#include "testing/wait.h"

namespace larder {
namespace {

using std::chrono::milliseconds;

constexpr uint64_t kSegment = 16ull << 20;
constexpr uint64_t kValue = 256ull << 10;
// Four times what the pool holds.
constexpr int kObjects = 4 * static_cast<int>(kSegment / kValue);

std::string Key(int i) { return "object-" + std::to_string(i); }

std::vector<std::byte> Value(const std::string& key, uint64_t size = kValue) {
  std::vector<std::byte> value(size);
  test::FillValue(key, value);
  return value;
}

class DiskTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/larder-disk-tier-XXXXXX";
    ASSERT_NE(mkdtemp(name), nullptr);
    dir_ = name;
    StartMaster(0);
  }

  void TearDown() override {
    clients_.clear();
    master_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  void StartMaster(uint16_t port, master::MasterOptions options = {}) {
    master::MasterServerOptions server;
    server.listen_host = "127.0.0.1";
    server.port = port;
    server.http_port = -1;
    server.master = std::move(options);
    auto started = master::MasterServer::Start(server);
    ASSERT_TRUE(started.ok()) << started.status();
    master_ = std::move(*started);
  }

  StoreClient* Client(const std::string& disk_path = "", uint64_t segment = kSegment) {
    StoreClientOptions options;
    options.master_address = master_->address();
    options.global_segment_size = segment;
    options.disk_path = disk_path;
    options.disk_capacity = "256M";
    auto client = StoreClient::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return nullptr;
    clients_.push_back(std::move(*client));
    return clients_.back().get();
  }

  master::DiskTier& tier() { return master_->state().disk(); }

  // Waits until the master has asked no demotion that is not answered yet.
  bool DemotionsSettle() {
    return test::WaitUntil(
        [&] {
          const auto& c = tier().counters();
          return c.demotions_queued.load() ==
                 c.demoted.load() + c.demote_failed.load() + c.demote_timed_out.load();
        },
        milliseconds(30000));
  }

  // Puts kObjects values in rounds of an eighth of the pool, letting demotions catch up between
  // rounds (a writer faster than the disk loses the objects eviction reaches first, as without a
  // disk; the bench measures that).
  void PutAll(StoreClient* client) {
    const int round = static_cast<int>(kSegment / kValue / 8);
    for (int first = 0; first < kObjects; first += round) {
      std::vector<std::string> keys;
      std::vector<std::vector<std::byte>> values;
      for (int i = first; i < first + round; ++i) {
        keys.push_back(Key(i));
        values.push_back(Value(keys.back()));
      }
      std::vector<std::span<const std::byte>> spans(values.begin(), values.end());
      const uint64_t queued = tier().counters().demotions_queued.load();
      for (const Status& status : client->BatchPut(keys, spans)) ASSERT_TRUE(status.ok()) << status;
      // Past the demote watermark (85 %), the master queues the oldest objects' demotions within a
      // sweep (100 ms) or the holder's next poll.
      if (first + round > static_cast<int>(kSegment / kValue) * 85 / 100) {
        test::WaitUntil([&] { return tier().counters().demotions_queued.load() > queued; },
                        milliseconds(2000));
      }
      ASSERT_TRUE(DemotionsSettle());
    }
  }

  // The keys whose only copy is on disk now.
  std::vector<std::string> DiskOnlyKeys() {
    std::vector<std::string> keys;
    for (int i = 0; i < kObjects; ++i) {
      if (tier().Has(Key(i)) && !master_->state().HasObject(Key(i))) keys.push_back(Key(i));
    }
    return keys;
  }

  // Reads every object through `client`: returns how many came back, and fails on any wrong byte.
  int ReadAll(StoreClient* client) {
    int readable = 0;
    for (int i = 0; i < kObjects; ++i) {
      auto got = client->Get(Key(i));
      if (!got.ok()) {
        EXPECT_EQ(got.status().code(), StatusCode::kNotFound) << Key(i) << ": " << got.status();
        continue;
      }
      EXPECT_EQ(got->size(), kValue) << Key(i);
      EXPECT_TRUE(test::VerifyValue(Key(i), std::as_bytes(std::span(*got)))) << Key(i);
      ++readable;
    }
    return readable;
  }

  std::string dir_;
  std::unique_ptr<master::MasterServer> master_;
  std::vector<std::unique_ptr<StoreClient>> clients_;
};

// Objects past the pool go to disk before their memory is evicted, and every one of them reads
// back intact from a client without a disk, through the single, batch and zero-copy gets.
TEST_F(DiskTierTest, DemotesBeforeEvictionAndReadsBackFromDisk) {
  StoreClient* holder = Client(dir_ + "/disk");
  ASSERT_NE(holder, nullptr);
  ASSERT_TRUE(test::WaitUntil([&] { return tier().active(); }, milliseconds(10000)));
  PutAll(holder);
  const auto& c = tier().counters();
  EXPECT_GT(c.demoted.load(), 0u);
  EXPECT_GT(c.evicted_with_copy.load(), 0u);
  EXPECT_GT(tier().copies(), 0u);
  // What an operator sees in /metrics.
  const std::string metrics = master::RenderMetrics(master_->state());
  const std::string demoted = "larder_disk_demotions_total{outcome=\"demoted\"} ";
  const size_t at = metrics.find(demoted);
  ASSERT_NE(at, std::string::npos);
  EXPECT_GT(std::stoull(metrics.substr(at + demoted.size())), 0u);
  EXPECT_NE(metrics.find("larder_disk_holder_online{disk=\""), std::string::npos);

  StoreClient* reader = Client("", 8ull << 20);
  ASSERT_NE(reader, nullptr);
  const int readable = ReadAll(reader);
  // Memory alone holds a quarter of them.
  // Each round waited for its demotions: nearly every object has a copy (memory holds a quarter).
  EXPECT_GE(readable, kObjects * 9 / 10) << "of " << kObjects;
  std::cout << "readable " << readable << " of " << kObjects << "\n";
  EXPECT_GT(c.disk_hits.load(), 0u);
  EXPECT_GT(c.promotions_queued.load(), 0u);

  // Batch and zero-copy reads of objects that are only on disk by now.
  std::vector<std::string> on_disk = DiskOnlyKeys();
  if (on_disk.size() > 4) on_disk.resize(4);
  for (auto& got : reader->BatchGet(on_disk)) {
    if (got.ok()) EXPECT_EQ(got->size(), kValue);
  }
  std::vector<std::byte> buffer(kValue);
  ASSERT_TRUE(reader->RegisterBuffer(buffer.data(), buffer.size()).ok());
  for (const std::string& key : on_disk) {
    auto n = reader->GetInto(key, buffer.data(), buffer.size());
    if (!n.ok()) {
      EXPECT_EQ(n.status().code(), StatusCode::kNotFound) << n.status();
      continue;
    }
    EXPECT_EQ(*n, kValue);
    EXPECT_TRUE(test::VerifyValue(key, buffer));
  }
}

// A second process on the directory is refused with a clear error; the first keeps serving.
TEST_F(DiskTierTest, SecondHolderOfADirectoryIsRefused) {
  StoreClient* holder = Client(dir_ + "/disk");
  ASSERT_NE(holder, nullptr);
  StoreClientOptions options;
  options.master_address = master_->address();
  options.global_segment_size = kSegment;
  options.disk_path = dir_ + "/disk";
  auto second = StoreClient::Create(options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition) << second.status();
  EXPECT_NE(second.status().message().find("held by another process"), std::string::npos)
      << second.status();
  ASSERT_TRUE(holder->Put("k", Value("k")).ok());
  EXPECT_TRUE(holder->Get("k").ok());
}

// Removal and overwrite: the disk copy goes with the object, and a new object of the key is never
// answered with the old copy's bytes.
TEST_F(DiskTierTest, RemovalAndOverwriteDropTheDiskCopy) {
  StoreClient* holder = Client(dir_ + "/disk");
  ASSERT_NE(holder, nullptr);
  ASSERT_TRUE(test::WaitUntil([&] { return tier().active(); }, milliseconds(10000)));
  PutAll(holder);
  const std::vector<std::string> disk_only = DiskOnlyKeys();
  ASSERT_GE(disk_only.size(), 2u);
  // Removing a key held only on disk succeeds, and it is gone for every reader.
  ASSERT_TRUE(holder->Remove(disk_only[0]).ok());
  EXPECT_FALSE(tier().Has(disk_only[0]));
  EXPECT_EQ(holder->Get(disk_only[0]).status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(*holder->Exist(disk_only[0]));
  EXPECT_EQ(holder->Remove(disk_only[0]).code(), StatusCode::kNotFound);
  // A new object of a key whose old one is on disk: reads see the new bytes, and the old copy
  // is dropped.
  const std::string& key = disk_only[1];
  auto fresh = Value(key + "-v2", 5000);
  ASSERT_TRUE(holder->Put(key, fresh).ok());
  EXPECT_FALSE(tier().Has(key));
  auto got = holder->Get(key);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), fresh.size());
  EXPECT_EQ(std::memcmp(got->data(), fresh.data(), fresh.size()), 0);
}

// A holder that stops: readers of its copies get NotFound (never wrong bytes, never a hang past
// their timeout); restarted on its directory, it announces its copies and they read back intact.
TEST_F(DiskTierTest, RestartedHolderServesItsCopiesAgain) {
  StoreClient* holder = Client(dir_ + "/disk");
  ASSERT_NE(holder, nullptr);
  ASSERT_TRUE(test::WaitUntil([&] { return tier().active(); }, milliseconds(10000)));
  PutAll(holder);
  const uint64_t copies = tier().copies();
  ASSERT_GT(copies, 0u);
  StoreClient* reader = Client("", 8ull << 20);
  ASSERT_NE(reader, nullptr);
  const std::vector<std::string> disk_only_keys = DiskOnlyKeys();
  ASSERT_FALSE(disk_only_keys.empty());
  const std::string disk_only = disk_only_keys.front();

  clients_.erase(clients_.begin());  // the holder leaves (its memory objects with it)
  EXPECT_EQ(reader->Get(disk_only).status().code(), StatusCode::kNotFound);

  StoreClient* restarted = Client(dir_ + "/disk");
  ASSERT_NE(restarted, nullptr);
  ASSERT_TRUE(test::WaitUntil([&] { return tier().counters().announced.load() >= copies; },
                              milliseconds(20000)));
  EXPECT_EQ(tier().copies(), copies);
  int readable = 0;
  for (int i = 0; i < kObjects; ++i) {
    if (!tier().Has(Key(i))) continue;
    auto got = reader->Get(Key(i));
    ASSERT_TRUE(got.ok()) << Key(i) << ": " << got.status();
    EXPECT_TRUE(test::VerifyValue(Key(i), std::as_bytes(std::span(*got)))) << Key(i);
    ++readable;
  }
  EXPECT_EQ(static_cast<uint64_t>(readable), copies);
}

// A master restarted in place learns the disk copies from the holder's announcement, as it learns
// memory objects from the catalogs: every object readable before reads back after.
TEST_F(DiskTierTest, MasterRestartKeepsTheDiskCopies) {
  StoreClient* holder = Client(dir_ + "/disk");
  ASSERT_NE(holder, nullptr);
  ASSERT_TRUE(test::WaitUntil([&] { return tier().active(); }, milliseconds(10000)));
  PutAll(holder);
  const std::vector<std::string> disk_only = DiskOnlyKeys();
  ASSERT_FALSE(disk_only.empty());
  const uint16_t port = master_->port();
  master_->Shutdown();
  master_.reset();
  StartMaster(port);
  ASSERT_NE(master_, nullptr);
  ASSERT_TRUE(
      test::WaitUntil([&] { return tier().copies() >= disk_only.size(); }, milliseconds(30000)))
      << tier().copies() << " of " << disk_only.size();
  for (const std::string& key : disk_only) {
    Result<std::string> got = UnavailableError("not read yet");
    test::WaitUntil(
        [&] {
          got = holder->Get(key);
          return got.status().code() != StatusCode::kUnavailable;
        },
        milliseconds(30000));
    ASSERT_TRUE(got.ok()) << key << ": " << got.status();
    EXPECT_TRUE(test::VerifyValue(key, std::as_bytes(std::span(*got)))) << key;
  }
}

// A put with write-through is on disk once it has ended, whatever the master's demotion
// watermark (here 1: no demotion at all); a put without it is not.
TEST_F(DiskTierTest, AWriteThroughPutIsOnDiskWhateverTheWatermark) {
  master_.reset();
  master::MasterOptions options;
  options.disk.demote_watermark = 1.0;
  StartMaster(0, options);
  ASSERT_NE(master_, nullptr);
  StoreClient* holder = Client(dir_ + "/disk");
  ASSERT_NE(holder, nullptr);
  ASSERT_TRUE(test::WaitUntil([&] { return tier().active(); }, milliseconds(10000)));
  PutConfig through;
  through.disk_write_through = true;
  ASSERT_TRUE(holder->Put("through", Value("through"), through).ok());
  ASSERT_TRUE(holder->Put("behind", Value("behind")).ok());
  ASSERT_TRUE(test::WaitUntil([&] { return tier().Has("through"); }, milliseconds(10000)));
  EXPECT_FALSE(tier().Has("behind"));
  EXPECT_EQ(tier().counters().demotions_queued.load(), 1u);
  EXPECT_TRUE(
      test::WaitUntil([&] { return tier().counters().demoted.load() == 1; }, milliseconds(10000)));
}

// A holder process (larder-client with --disk-path) killed with SIGKILL while demotions are in
// flight, under a writer that keeps putting: restarted on its directory, it announces what its
// disk kept, and every copy the master then knows reads back intact; no get anywhere returns a
// wrong byte.
TEST_F(DiskTierTest, AHolderKilledUnderLoadServesEverySurvivingRecordAfterItsRestart) {
  const std::string disk = dir_ + "/disk";
  int spawned = 0;
  auto spawn_holder = [&] {
    const std::string socket =
        "@larder-disk-test-" + std::to_string(getpid()) + "-" + std::to_string(spawned++);
    return ChildProcess::Spawn(
        {test::Bin("larder-client"), "--master", master_->address(), "--segment-size", "16M",
         "--socket", socket, "--disk-path", disk, "--disk-capacity", "256M", "--parent-watch"},
        {}, std::chrono::seconds(60));
  };
  auto holder = spawn_holder();
  ASSERT_TRUE(holder.ok()) << holder.status();
  ASSERT_TRUE(test::WaitUntil([&] { return tier().active(); }, milliseconds(10000)));

  StoreClient* writer = Client();
  ASSERT_NE(writer, nullptr);
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<int> put;  // keys put (a put may fail while the holder's segment goes)
  std::thread load([&] {
    for (int i = 0; !stop.load(); ++i) {
      if (writer->Put(Key(i), Value(Key(i))).ok()) {
        std::lock_guard<std::mutex> lock(mu);
        put.push_back(i);
      }
    }
  });
  const auto& c = tier().counters();
  // In the middle of a burst: copies recorded, and demotions asked for and not answered yet.
  const bool in_flight = test::WaitUntil(
      [&] {
        return c.demoted.load() > 256 && c.demotions_queued.load() > c.demoted.load() +
                                                                         c.demote_failed.load() +
                                                                         c.demote_timed_out.load();
      },
      milliseconds(60000));
  holder->Kill(SIGKILL);
  holder->Stop(std::chrono::seconds(10));  // reaped: its directory's lock is free, as after a crash
  stop = true;
  load.join();
  ASSERT_TRUE(in_flight) << "no demotion burst to kill the holder in";
  const uint64_t before = tier().copies();
  ASSERT_GT(before, 0u);
  const uint64_t reported = c.demoted.load() + c.announced.load();

  auto restarted = spawn_holder();
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  // It announces what its disk kept: copies the master knew, and the demotions the kill cut off
  // after their records were durable (taken as the reports they are).
  ASSERT_TRUE(test::WaitUntil(
      [&] {
        auto holders = tier().Holders();
        return holders.size() == 1 && holders[0].online &&
               c.demoted.load() + c.announced.load() > reported;
      },
      milliseconds(30000)));
  StoreClient* reader = Client("", 8ull << 20);
  ASSERT_NE(reader, nullptr);
  int served = 0, wrong = 0, copies = 0;
  for (int i : put) {
    const bool on_disk = tier().Has(Key(i));
    auto got = reader->Get(Key(i));
    if (!got.ok()) {
      EXPECT_FALSE(on_disk) << Key(i) << ": its disk copy did not read back: " << got.status();
      EXPECT_EQ(got.status().code(), StatusCode::kNotFound) << Key(i) << ": " << got.status();
      continue;
    }
    copies += on_disk;
    ++served;
    if (got->size() != kValue || !test::VerifyValue(Key(i), std::as_bytes(std::span(*got)))) {
      ++wrong;
    }
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(copies, 0);
  std::cout << put.size() << " put, " << before << " copies before the kill, " << copies
            << " read back from disk after the restart, " << served << " served in all\n";
}

// A slow disk (every I/O batch 2 s late, longer than the client TTL of 1.5 s) delays demotions,
// never a client's heartbeats: no client expires while the holder works through its writes.
TEST_F(DiskTierTest, ASlowDiskExpiresNoClient) {
  master_.reset();
  master::MasterOptions options;
  options.client_ttl = milliseconds(1500);
  StartMaster(0, options);
  ASSERT_NE(master_, nullptr);
  ASSERT_EQ(setenv("LARDER_DISK_TEST_IO_DELAY", "2s", 1), 0);
  StoreClient* holder = Client(dir_ + "/disk");
  unsetenv("LARDER_DISK_TEST_IO_DELAY");
  ASSERT_NE(holder, nullptr);
  ASSERT_TRUE(test::WaitUntil([&] { return tier().active(); }, milliseconds(10000)));
  for (int i = 0; i < kObjects / 2; ++i) {
    ASSERT_TRUE(holder->Put(Key(i), Value(Key(i))).ok());
  }
  // Two write batches at least: over 4 s of a disk slower than the TTL.
  ASSERT_TRUE(
      test::WaitUntil([&] { return tier().counters().demoted.load() > 8; }, milliseconds(60000)));
  EXPECT_EQ(master_->state().Stats().client_expiries, 0u);
  EXPECT_TRUE(holder->Get(Key(kObjects / 2 - 1)).ok());
}

}  // namespace
}  // namespace larder
