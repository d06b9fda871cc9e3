// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "disk/disk_store.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "disk/disk_io.h"
#include "testing/values.h"

namespace larder::disk {
namespace {

namespace fs = std::filesystem;

class DiskStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/larder-disk-XXXXXX";
    ASSERT_NE(mkdtemp(name), nullptr);
    dir_ = name;
  }
  void TearDown() override { fs::remove_all(dir_); }

  DiskOptions Options() const {
    DiskOptions options;
    options.path = dir_ + "/tier";
    options.capacity_bytes = 64ull << 20;
    options.region_size = 4ull << 20;
    return options;
  }

  static std::vector<std::byte> Value(const std::string& key, size_t size) {
    std::vector<std::byte> value(size);
    test::FillValue(key, value);
    return value;
  }

  static std::vector<Status> Put(DiskStore& store, const std::vector<std::string>& keys,
                                 const std::vector<std::vector<std::byte>>& values) {
    std::vector<DiskWrite> items;
    for (size_t i = 0; i < keys.size(); ++i) {
      items.push_back(DiskWrite{keys[i], values[i].data(), values[i].size()});
    }
    return store.Write(items);
  }

  // Reads `key` into a fresh buffer (4 KiB aligned when `aligned`) and checks its bytes.
  static Result<uint64_t> ReadChecked(DiskStore& store, const std::string& key, size_t capacity,
                                      bool aligned = true) {
    AlignedBuffer buffer(capacity + kBlock);
    std::byte* dst = buffer.data() + (aligned ? 0 : 8);
    DiskRead read{key, dst, capacity};
    auto result = std::move(store.Read(std::span(&read, 1))[0]);
    if (result.ok()) {
      EXPECT_TRUE(test::VerifyValue(key, std::span(dst, *result))) << key;
    }
    return result;
  }

  std::string RegionFile(uint64_t seq = 1) const {
    char name[40];
    std::snprintf(name, sizeof(name), "/region-%010llu.dat", static_cast<unsigned long long>(seq));
    return dir_ + "/tier" + name;
  }

  std::string dir_;
};

TEST_F(DiskStoreTest, ValuesComeBackWhateverTheBuffersAlignment) {
  auto store = DiskStore::Open(Options());
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<std::string> keys;
  std::vector<std::vector<std::byte>> values;
  for (size_t size : {0ul, 1ul, 100ul, 4096ul, 4097ul, 65536ul, 1000000ul}) {
    keys.push_back("key-" + std::to_string(size));
    values.push_back(Value(keys.back(), size));
  }
  for (const Status& status : Put(**store, keys, values)) ASSERT_TRUE(status.ok()) << status;
  for (size_t i = 0; i < keys.size(); ++i) {
    for (bool aligned : {true, false}) {
      auto read = ReadChecked(**store, keys[i], values[i].size() + 5000, aligned);
      ASSERT_TRUE(read.ok()) << read.status();
      EXPECT_EQ(*read, values[i].size());
    }
    EXPECT_EQ(*(*store)->SizeOf(keys[i]), values[i].size());
  }
  DiskStats stats = (*store)->Stats();
  EXPECT_EQ(stats.records, keys.size());
  EXPECT_EQ(stats.writes, keys.size());
  EXPECT_EQ(stats.reads, 2 * keys.size());
}

TEST_F(DiskStoreTest, ReadsSayWhatIsMissingOrTooSmall) {
  auto store = DiskStore::Open(Options());
  ASSERT_TRUE(store.ok()) << store.status();
  auto value = Value("k", 10000);
  ASSERT_TRUE(Put(**store, {"k"}, {value})[0].ok());
  EXPECT_EQ(ReadChecked(**store, "absent", 4096).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(ReadChecked(**store, "k", 9999).status().code(), StatusCode::kInvalidArgument);
  auto big = Value("big", 5ull << 20);  // larger than a 4 MiB region
  EXPECT_EQ(Put(**store, {"big"}, {big})[0].code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->Stats().misses, 1u);
}

TEST_F(DiskStoreTest, WritesAreIdempotentPerKey) {
  auto store = DiskStore::Open(Options());
  ASSERT_TRUE(store.ok()) << store.status();
  auto value = Value("k", 50000);
  // Twice in one batch, then again in another: one record.
  for (const Status& status : Put(**store, {"k", "k"}, {value, value})) EXPECT_TRUE(status.ok());
  EXPECT_TRUE(Put(**store, {"k"}, {value})[0].ok());
  EXPECT_EQ((*store)->Stats().writes, 1u);
  EXPECT_EQ((*store)->Stats().records, 1u);
  ASSERT_TRUE(ReadChecked(**store, "k", 50000).ok());
}

TEST_F(DiskStoreTest, ASecondProcessOnTheDirectoryIsRefused) {
  auto store = DiskStore::Open(Options());
  ASSERT_TRUE(store.ok()) << store.status();
  // flock locks belong to the open file, so a second open in this process is refused as another
  // process's would be.
  auto second = DiskStore::Open(Options());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(
      second.status().message().find("held by another process (pid " + std::to_string(getpid())),
      std::string::npos)
      << second.status();
  // Another process, too.
  pid_t child = fork();
  if (child == 0) {
    auto other = DiskStore::Open(Options());
    _exit(!other.ok() && other.status().code() == StatusCode::kFailedPrecondition ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  store->reset();
  EXPECT_TRUE(DiskStore::Open(Options()).ok());  // released with its holder
}

TEST_F(DiskStoreTest, ARestartedHolderOwnsItsRecordsAgain) {
  std::string identity;
  std::vector<std::string> keys;
  std::vector<std::vector<std::byte>> values;
  for (int i = 0; i < 40; ++i) {
    keys.push_back("page-" + std::to_string(i));
    values.push_back(Value(keys.back(), 300000 + i));  // across several regions
  }
  {
    auto store = DiskStore::Open(Options());
    ASSERT_TRUE(store.ok()) << store.status();
    identity = (*store)->identity();
    for (const Status& status : Put(**store, keys, values)) ASSERT_TRUE(status.ok());
    ASSERT_TRUE((*store)->Remove(std::vector<std::string>{"page-3"}).ok());
  }
  auto store = DiskStore::Open(Options());
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->identity(), identity);
  EXPECT_EQ((*store)->List().size(), keys.size() - 1);
  for (size_t i = 0; i < keys.size(); ++i) {
    auto read = ReadChecked(**store, keys[i], values[i].size());
    if (keys[i] == "page-3") {
      EXPECT_EQ(read.status().code(), StatusCode::kNotFound);  // the tombstone held
    } else {
      ASSERT_TRUE(read.ok()) << keys[i] << ": " << read.status();
    }
  }
  // New records continue after the old ones, with later generations.
  uint64_t oldest = 0;
  for (const DiskRecord& record : (*store)->List()) oldest = std::max(oldest, record.generation);
  auto value = Value("after", 1000);
  ASSERT_TRUE(Put(**store, {"after"}, {value})[0].ok());
  for (const DiskRecord& record : (*store)->List()) {
    if (record.key == "after") EXPECT_GT(record.generation, oldest);
  }
}

TEST_F(DiskStoreTest, AFlippedBitIsAMissNeverBytes) {
  auto a = Value("a", 8192);
  auto b = Value("b", 8192);
  {
    auto store = DiskStore::Open(Options());
    ASSERT_TRUE(store.ok()) << store.status();
    for (const Status& status : Put(**store, {"a", "b"}, {a, b})) ASSERT_TRUE(status.ok());
  }
  // One batch: its summary at 0 (one block), a's value at 4096. Flip one bit of a's value.
  {
    std::fstream file(RegionFile(), std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(4096 + 100);
    char byte = 0;
    file.read(&byte, 1);
    byte ^= 0x10;
    file.seekp(4096 + 100);
    file.write(&byte, 1);
  }
  auto store = DiskStore::Open(Options());
  ASSERT_TRUE(store.ok()) << store.status();
  auto read = ReadChecked(**store, "a", 8192);
  EXPECT_EQ(read.status().code(), StatusCode::kNotFound) << read.status();
  EXPECT_EQ((*store)->Stats().checksum_failures, 1u);
  EXPECT_EQ((*store)->SizeOf("a").status().code(), StatusCode::kNotFound);  // dropped
  EXPECT_TRUE(ReadChecked(**store, "b", 8192).ok());
}

TEST_F(DiskStoreTest, ATornBatchEndsTheRegionsScan) {
  auto a = Value("a", 8192);
  auto b = Value("b", 8192);
  auto c = Value("c", 8192);
  {
    auto store = DiskStore::Open(Options());
    ASSERT_TRUE(store.ok()) << store.status();
    // Three batches of one record: a summary block and two value blocks each.
    ASSERT_TRUE(Put(**store, {"a"}, {a})[0].ok());
    ASSERT_TRUE(Put(**store, {"b"}, {b})[0].ok());
    ASSERT_TRUE(Put(**store, {"c"}, {c})[0].ok());
  }
  // b's batch summary (at 3 blocks) is half written: a crash in the middle of a write.
  {
    std::fstream file(RegionFile(), std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(3 * 4096 + 20);
    const char zeros[40] = {};
    file.write(zeros, sizeof(zeros));
  }
  auto store = DiskStore::Open(Options());
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE(ReadChecked(**store, "a", 8192).ok());
  EXPECT_EQ(ReadChecked(**store, "b", 8192).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(ReadChecked(**store, "c", 8192).status().code(), StatusCode::kNotFound);
  // The region goes on from the torn record: new writes read back.
  auto d = Value("d", 8192);
  ASSERT_TRUE(Put(**store, {"d"}, {d})[0].ok());
  EXPECT_TRUE(ReadChecked(**store, "d", 8192).ok());
}

TEST_F(DiskStoreTest, KeysShareTheirBatchsSummaryAndComeBackAfterARestart) {
  // 63 values of 64 KiB and their summary fill one 4 MiB region: a key costs its summary bytes,
  // not a block of its own.
  std::vector<std::string> keys;
  std::vector<std::vector<std::byte>> values;
  for (int i = 0; i < 63; ++i) {
    keys.push_back("page/" + std::string(100, 'x') + std::to_string(i));  // a long summary
    values.push_back(Value(keys.back(), 64 << 10));
  }
  {
    auto store = DiskStore::Open(Options());
    ASSERT_TRUE(store.ok()) << store.status();
    for (const Status& status : Put(**store, keys, values)) ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ((*store)->Stats().regions, 1u);
    EXPECT_EQ((*store)->Stats().live_bytes, 63u << 16);
  }
  // The summary (63 keys of over 100 bytes) is longer than a block: the scan reads it whole.
  auto store = DiskStore::Open(Options());
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->Stats().records, keys.size());
  for (const std::string& key : keys) EXPECT_TRUE(ReadChecked(**store, key, 64 << 10).ok()) << key;
}

TEST_F(DiskStoreTest, OldRegionsGoFirstAndTheirKeysAreToldBeforeTheyGo) {
  DiskOptions options = Options();
  options.capacity_bytes = 16ull << 20;  // four regions of 4 MiB
  std::vector<std::string> told;
  DiskStore* self = nullptr;
  options.on_evict = [&](std::span<const std::string> keys) {
    for (const std::string& key : keys) {
      // Told before the bytes go: the key has left the index already.
      EXPECT_EQ(self->SizeOf(key).status().code(), StatusCode::kNotFound);
      told.push_back(key);
    }
  };
  auto store = DiskStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  self = store->get();
  std::vector<std::string> keys;
  for (int i = 0; i < 64; ++i) {
    keys.push_back("k" + std::to_string(i));
    auto value = Value(keys.back(), 500000);
    ASSERT_TRUE(Put(**store, {keys.back()}, {value})[0].ok()) << i;
    EXPECT_LE((*store)->Stats().used_bytes, options.capacity_bytes);
  }
  DiskStats stats = (*store)->Stats();
  EXPECT_GT(stats.evicted_regions, 0u);
  EXPECT_EQ(stats.evicted_records, told.size());
  EXPECT_EQ(stats.records + told.size(), keys.size());
  // The oldest went, the newest stayed.
  EXPECT_EQ(told.front(), "k0");
  EXPECT_TRUE(ReadChecked(**store, "k63", 500000).ok());
  for (const std::string& key : told) {
    EXPECT_EQ(ReadChecked(**store, key, 500000).status().code(), StatusCode::kNotFound);
  }
  EXPECT_EQ(fs::exists(RegionFile(1)), false);
}

TEST_F(DiskStoreTest, ARecordReadSinceWrittenGetsASecondChanceAtReclaim) {
  DiskOptions options = Options();
  options.capacity_bytes = 16ull << 20;  // four regions of 4 MiB
  std::vector<std::string> told;
  options.on_evict = [&](std::span<const std::string> keys) {
    told.insert(told.end(), keys.begin(), keys.end());
  };
  auto store = DiskStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  // "used" and "unused" share the first region; only "used" is read.
  auto used = Value("used", 500000);
  auto unused = Value("unused", 500000);
  ASSERT_TRUE(Put(**store, {"used"}, {used})[0].ok());
  ASSERT_TRUE(Put(**store, {"unused"}, {unused})[0].ok());
  ASSERT_TRUE(ReadChecked(**store, "used", 500000).ok());
  auto written_past = [&](const std::string& key) {
    return std::find(told.begin(), told.end(), key) != told.end();
  };
  // Write until the first region has gone: "unused" with it, "used" written again at the head.
  for (int i = 0; !written_past("unused"); ++i) {
    ASSERT_LT(i, 64) << "the first region was never reclaimed";
    std::string key = "k" + std::to_string(i);
    ASSERT_TRUE(Put(**store, {key}, {Value(key, 500000)})[0].ok());
  }
  EXPECT_FALSE(written_past("used"));
  EXPECT_TRUE(ReadChecked(**store, "used", 500000).ok());
  EXPECT_GE((*store)->Stats().reinserted, 1u);
  // Its second chance was spent on the rewrite: unread since, it goes with its region next time.
  for (int i = 100; !written_past("used"); ++i) {
    ASSERT_LT(i, 164) << "a record read once survived two reclaims of its region";
    std::string key = "k" + std::to_string(i);
    ASSERT_TRUE(Put(**store, {key}, {Value(key, 500000)})[0].ok());
  }
  EXPECT_EQ(ReadChecked(**store, "used", 500000).status().code(), StatusCode::kNotFound);
}

// A write budget paces the writes: three rounds of 1 MiB at 4 MiB/s take at least half a second
// (the first goes at once, the next two wait for the budget). A limit, so a lower bound only.
TEST_F(DiskStoreTest, AWriteBudgetPacesTheWrites) {
  DiskOptions options = Options();
  options.write_budget = 4ull << 20;
  auto store = DiskStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  const auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) {
    const std::string key = "paced-" + std::to_string(i);
    ASSERT_TRUE(Put(**store, {key}, {Value(key, (1 << 20) - 8192)})[0].ok());
  }
  EXPECT_GE(std::chrono::steady_clock::now() - started, std::chrono::milliseconds(490));
  for (int i = 0; i < 3; ++i) {
    const std::string key = "paced-" + std::to_string(i);
    EXPECT_TRUE(ReadChecked(**store, key, 1 << 20).ok()) << key;
  }
}

TEST_F(DiskStoreTest, BufferedIoAndPlainSyscallsServeAsWell) {
  DiskOptions options = Options();
  options.direct_io = DirectIo::kOff;
  options.io_uring = false;
  auto store = DiskStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_FALSE((*store)->Stats().direct_io);
  EXPECT_FALSE((*store)->Stats().io_uring);
  auto value = Value("k", 123456);
  ASSERT_TRUE(Put(**store, {"k"}, {value})[0].ok());
  EXPECT_TRUE(ReadChecked(**store, "k", 123456, false).ok());
}

TEST_F(DiskStoreTest, ADirectoryOnTmpfsWorks) {
  // tmpfs refuses O_DIRECT on older kernels: the store falls back to buffered I/O by itself.
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm on this machine";
  DiskOptions options = Options();
  options.path = "/dev/shm/larder-disk-test-" + std::to_string(getpid());
  {
    auto store = DiskStore::Open(options);
    ASSERT_TRUE(store.ok()) << store.status();
    auto value = Value("k", 70000);
    ASSERT_TRUE(Put(**store, {"k"}, {value})[0].ok());
    EXPECT_TRUE(ReadChecked(**store, "k", 70000).ok());
  }
  fs::remove_all(options.path);
}

TEST_F(DiskStoreTest, AFullDiskFailsTheWritesThatDoNotFitAndKeepsTheRest) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
  const std::string mount_point = dir_ + "/small";
  fs::create_directories(mount_point);
  if (mount("tmpfs", mount_point.c_str(), "tmpfs", 0, "size=10m") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  }
  {
    DiskOptions options = Options();
    options.path = mount_point + "/tier";
    options.capacity_bytes = 64ull << 20;  // more than the file system holds
    auto store = DiskStore::Open(options);
    ASSERT_TRUE(store.ok()) << store.status();
    size_t written = 0;
    Status failed;
    for (int i = 0; i < 40 && failed.ok(); ++i) {
      const std::string key = "k" + std::to_string(i);
      auto value = Value(key, 1000000);
      failed = Put(**store, {key}, {value})[0];
      if (failed.ok()) ++written;
    }
    EXPECT_EQ(failed.code(), StatusCode::kResourceExhausted) << failed;
    EXPECT_GT(written, 0u);
    for (size_t i = 0; i < written; ++i) {
      EXPECT_TRUE(ReadChecked(**store, "k" + std::to_string(i), 1000000).ok()) << i;
    }
  }
  umount2(mount_point.c_str(), MNT_DETACH);
}

// A holder killed at any moment of its writes: every write it was told was durable reads back
// after the restart, and no record anywhere reads back wrong. Five rounds on one directory.
TEST_F(DiskStoreTest, AHolderKilledMidWriteLosesNothingItWasToldWasDurable) {
  constexpr int kRounds = 5;
  constexpr int kBatches = 20;  // acknowledged per round before the kill
  constexpr int kPerBatch = 8;
  auto key_of = [](int round, int batch, int j) {
    return "r" + std::to_string(round) + "-b" + std::to_string(batch) + "-" + std::to_string(j);
  };
  auto size_of = [](int batch, int j) {
    return static_cast<size_t>(1 + (batch * 7919 + j * 104729) % 65536);
  };
  std::vector<std::string> acknowledged;
  for (int round = 0; round < kRounds; ++round) {
    int acks[2];
    ASSERT_EQ(pipe(acks), 0);
    pid_t child = fork();
    if (child == 0) {
      close(acks[0]);
      auto store = DiskStore::Open(Options());
      if (!store.ok()) _exit(2);
      for (int batch = 0;; ++batch) {
        std::vector<std::string> keys;
        std::vector<std::vector<std::byte>> values;
        for (int j = 0; j < kPerBatch; ++j) {
          keys.push_back(key_of(round, batch, j));
          values.push_back(Value(keys.back(), size_of(batch, j)));
        }
        for (const Status& status : Put(**store, keys, values)) {
          if (!status.ok()) _exit(3);
        }
        // Durable and in the index: say so.
        if (write(acks[1], &batch, sizeof(batch)) != sizeof(batch)) _exit(4);
      }
    }
    close(acks[1]);
    int batch = -1;
    while (batch + 1 < kBatches) {
      ASSERT_EQ(read(acks[0], &batch, sizeof(batch)), static_cast<ssize_t>(sizeof(batch)))
          << "the writer died in round " << round;
    }
    // The writer is inside its next batch now (or about to be): kill it there.
    kill(child, SIGKILL);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    close(acks[0]);
    for (int b = 0; b <= batch; ++b) {
      for (int j = 0; j < kPerBatch; ++j) acknowledged.push_back(key_of(round, b, j));
    }
    auto store = DiskStore::Open(Options());
    ASSERT_TRUE(store.ok()) << store.status();
    for (const std::string& key : acknowledged) {
      auto got = ReadChecked(**store, key, 65536);
      ASSERT_TRUE(got.ok()) << "round " << round << ", " << key << ": " << got.status();
    }
    for (const DiskRecord& record : (*store)->List()) {
      auto got = ReadChecked(**store, record.key, 65536);  // intact, or a miss
      if (!got.ok()) EXPECT_EQ(got.status().code(), StatusCode::kNotFound) << got.status();
    }
  }
}

TEST(DiskOptionsTest, SettingsComeFromTheEnvironment) {
  setenv("LARDER_DISK_PATH", "/var/cache/larder", 1);
  setenv("LARDER_DISK_CAPACITY", "40%", 1);
  setenv("LARDER_DISK_DIRECT_IO", "off", 1);
  setenv("LARDER_DISK_QUEUE_DEPTH", "8", 1);
  setenv("LARDER_DISK_WRITE_BUDGET", "200M", 1);
  auto options = DiskOptionsFromEnv();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->path, "/var/cache/larder");
  EXPECT_EQ(options->capacity_bytes, 0u);
  EXPECT_EQ(options->capacity_percent, 40);
  EXPECT_EQ(options->direct_io, DirectIo::kOff);
  EXPECT_EQ(options->queue_depth, 8u);
  EXPECT_EQ(options->write_budget, 200ull << 20);
  setenv("LARDER_DISK_WRITE_BUDGET", "fast", 1);
  EXPECT_EQ(DiskOptionsFromEnv().status().code(), StatusCode::kInvalidArgument);
  unsetenv("LARDER_DISK_WRITE_BUDGET");
  setenv("LARDER_DISK_CAPACITY", "200G", 1);
  EXPECT_EQ(DiskOptionsFromEnv()->capacity_bytes, 200ull << 30);
  for (const char* bad : {"150%", "lots", "0%"}) {
    setenv("LARDER_DISK_CAPACITY", bad, 1);
    EXPECT_EQ(DiskOptionsFromEnv().status().code(), StatusCode::kInvalidArgument) << bad;
  }
  unsetenv("LARDER_DISK_CAPACITY");
  setenv("LARDER_DISK_DIRECT_IO", "sometimes", 1);
  EXPECT_FALSE(DiskOptionsFromEnv().ok());
  for (const char* name : {"LARDER_DISK_PATH", "LARDER_DISK_DIRECT_IO", "LARDER_DISK_QUEUE_DEPTH",
                           "LARDER_DISK_WRITE_BUDGET"}) {
    unsetenv(name);
  }
}

}  // namespace
}  // namespace larder::disk
