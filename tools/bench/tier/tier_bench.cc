// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "bench/tier/tier_bench.h"

#include <fcntl.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string_view>
#include <system_error>

#include "common/env.h"
#include "common/net.h"
#include "disk/disk_io.h"
#include "disk/disk_store.h"
#include "testing/values.h"

namespace larder::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using disk::AlignedBuffer;
using disk::AlignUp;
using disk::kBlock;

// Room left on the file system beyond the store's regions and the raw file.
constexpr uint64_t kSpareBytes = 64ull << 20;

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double Gbps(uint64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

std::string FsType(const std::string& path) {
  struct statfs st {};
  if (statfs(path.c_str(), &st) != 0) return "unknown";
  const auto magic = static_cast<uint32_t>(st.f_type);
  switch (magic) {
    case 0xEF53:
      return "ext4";  // ext2, ext3 and ext4 share the magic
    case 0x58465342:
      return "xfs";
    case 0x01021994:
      return "tmpfs";
    case 0x9123683E:
      return "btrfs";
    case 0x794C7630:
      return "overlayfs";
    case 0xF2F52010:
      return "f2fs";
    case 0x2FC12FC1:
      return "zfs";
    case 0x6969:
      return "nfs";
    case 0x65735546:
      return "fuse";
    case 0x858458F6:
      return "ramfs";
    default:
      return FormatHex(magic);
  }
}

Result<uint64_t> FreeBytes(const std::string& path) {
  struct statvfs st {};
  if (statvfs(path.c_str(), &st) != 0) return ErrnoToStatus(errno, "statvfs " + path);
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

// Drops `path`'s pages from the page cache (a no-op for pages O_DIRECT never cached).
void DropCache(const std::string& path) {
  Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return;
  fdatasync(fd.get());
  posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
}

void DropDirectoryCache(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.is_regular_file(ec)) DropCache(entry.path().string());
  }
}

// Removes a path and all below it when it goes out of scope.
struct RemoveOnExit {
  std::string path;
  ~RemoveOnExit() {
    std::error_code ec;
    if (!path.empty()) fs::remove_all(path, ec);
  }
};

// The layout of one value size's run: the store's regions and the raw file.
struct Plan {
  uint64_t value_size = 0;
  uint64_t values = 0;
  uint64_t slot = 0;  // value_size rounded up to 4 KiB: a raw op, a read buffer
  uint64_t region_size = 0;
  uint64_t regions = 0;  // region files the values take
  uint64_t capacity = 0;
  uint64_t disk_bytes = 0;  // regions, the raw file and spare room
};

Plan MakePlan(const TierBenchOptions& o, uint64_t value_size) {
  Plan p;
  p.value_size = value_size;
  p.values = o.bytes / value_size;
  p.slot = AlignUp(value_size);
  // A record is a 4 KiB head (64 B header and a short key) and the value rounded up to 4 KiB.
  const uint64_t record = kBlock + p.slot;
  const disk::DiskOptions defaults;
  // Regions of the largest automatic size (a large disk's), or one record when that is larger.
  p.region_size = std::max<uint64_t>(64ull << 20, record);
  const uint64_t per_region = p.region_size / record;
  p.regions = (p.values + per_region - 1) / per_region;
  // Every region under the high watermark, one to spare: nothing is reclaimed while writing.
  const double wanted =
      std::ceil(static_cast<double>((p.regions + 1) * p.region_size) / defaults.high_watermark);
  p.capacity = std::max(2 * p.region_size, AlignUp(static_cast<uint64_t>(wanted)));
  p.disk_bytes = p.regions * p.region_size + p.values * p.slot + kSpareBytes;
  return p;
}

Status CheckFreeSpace(const std::string& dir, const Plan& p) {
  LARDER_ASSIGN_OR_RETURN(uint64_t free_bytes, FreeBytes(dir));
  if (free_bytes >= p.disk_bytes) return Status::Ok();
  return ResourceExhaustedError(
      "not enough free space in " + dir + " for values of " + FormatByteSize(p.value_size) +
      ": the store's " + std::to_string(p.regions) + " region(s) of " +
      FormatReadableBytes(static_cast<double>(p.region_size)) + ", the raw file of " +
      FormatReadableBytes(static_cast<double>(p.values * p.slot)) + " and " +
      FormatReadableBytes(static_cast<double>(kSpareBytes)) + " to spare need " +
      FormatReadableBytes(static_cast<double>(p.disk_bytes)) + ", " +
      FormatReadableBytes(static_cast<double>(free_bytes)) +
      " is free; lower --bytes or choose another --disk-path");
}

// Values [start, start + n): one Write or Read call, one DiskIo::Run.
struct Batch {
  uint64_t start = 0;
  uint64_t n = 0;
};

std::vector<Batch> Batches(uint64_t values, uint64_t batch) {
  std::vector<Batch> batches;
  for (uint64_t start = 0; start < values; start += batch) {
    batches.push_back(Batch{start, std::min(batch, values - start)});
  }
  return batches;
}

// One pass of DiskStore::Read over every key; counts the values that are not intact into
// `*wrong`. Returns the seconds spent in Read.
double StoreReadPass(disk::DiskStore& store, const std::vector<std::string>& keys, const Plan& p,
                     const std::vector<Batch>& batches, std::vector<AlignedBuffer>& buffers,
                     uint64_t* wrong) {
  double seconds = 0;
  std::vector<disk::DiskRead> items;
  for (const Batch& b : batches) {
    items.clear();
    for (uint64_t j = 0; j < b.n; ++j) {
      // A read that writes nothing must not pass for the previous pass's value.
      std::memset(buffers[j].data(), 0, std::min<uint64_t>(p.slot, 64));
      items.push_back(disk::DiskRead{keys[b.start + j], buffers[j].data(), p.slot});
    }
    const auto start = Clock::now();
    auto results = store.Read(items);
    seconds += Seconds(start);
    for (uint64_t j = 0; j < b.n; ++j) {
      const bool ok = results[j].ok() && *results[j] == p.value_size &&
                      test::VerifyValue(keys[b.start + j], std::span<const std::byte>(
                                                               buffers[j].data(), p.value_size));
      if (!ok) ++*wrong;
    }
  }
  return seconds;
}

// One pass of DiskIo reads over the raw file, one op per value. Returns the seconds spent in Run.
Result<double> RawReadPass(disk::DiskIo& io, int fd, const Plan& p,
                           const std::vector<Batch>& batches, std::vector<AlignedBuffer>& buffers) {
  double seconds = 0;
  std::vector<disk::IoOp> ops;
  for (const Batch& b : batches) {
    ops.clear();
    for (uint64_t j = 0; j < b.n; ++j) {
      ops.push_back(disk::IoOp{fd, false, buffers[j].data(), p.slot, (b.start + j) * p.slot});
    }
    const auto start = Clock::now();
    io.Run(ops);
    seconds += Seconds(start);
    for (const disk::IoOp& op : ops) {
      if (op.result != static_cast<int64_t>(p.slot)) {
        return op.result < 0 ? ErrnoToStatus(static_cast<int>(-op.result), "raw read")
                             : DataLossError("raw read: " + std::to_string(op.result) + " of " +
                                             std::to_string(p.slot) + " bytes");
      }
    }
  }
  return seconds;
}

Result<TierBenchRow> RunSize(const TierBenchOptions& o, const std::string& dir, const Plan& p) {
  LARDER_RETURN_IF_ERROR(CheckFreeSpace(dir, p));
  TierBenchRow row;
  row.value_size = p.value_size;
  row.values = p.values;
  const uint64_t value_bytes = p.values * p.value_size;

  const std::string store_dir = dir + "/store-" + std::to_string(p.value_size);
  const std::string raw_path = dir + "/raw-" + std::to_string(p.value_size) + ".dat";
  RemoveOnExit remove_store{store_dir};
  RemoveOnExit remove_raw{raw_path};

  disk::DiskOptions options;
  options.path = store_dir;
  options.capacity_bytes = p.capacity;
  options.region_size = p.region_size;
  options.queue_depth = o.queue_depth;
  LARDER_ASSIGN_OR_RETURN(std::unique_ptr<disk::DiskStore> store, disk::DiskStore::Open(options));

  std::vector<std::string> keys;
  keys.reserve(p.values);
  for (uint64_t i = 0; i < p.values; ++i) {
    keys.push_back("tier/" + std::to_string(p.value_size) + "/" + std::to_string(i));
  }
  const std::vector<Batch> batches = Batches(p.values, o.batch);
  std::vector<AlignedBuffer> buffers;
  for (uint64_t j = 0; j < std::min(o.batch, p.values); ++j) {
    buffers.emplace_back(p.slot);
    std::memset(buffers.back().data(), 0, p.slot);
  }

  // Demote: the store's writes.
  double write_seconds = 0;
  std::vector<disk::DiskWrite> writes;
  for (const Batch& b : batches) {
    writes.clear();
    for (uint64_t j = 0; j < b.n; ++j) {
      test::FillValue(keys[b.start + j], std::span(buffers[j].data(), p.value_size));
      writes.push_back(disk::DiskWrite{keys[b.start + j], buffers[j].data(), p.value_size});
    }
    const auto start = Clock::now();
    std::vector<Status> statuses = store->Write(writes);
    write_seconds += Seconds(start);
    for (uint64_t j = 0; j < b.n; ++j) {
      if (!statuses[j].ok()) return statuses[j].WithContext("tier bench: demote");
    }
  }
  row.write_gbps = Gbps(value_bytes, write_seconds);
  disk::DiskStats stats = store->Stats();
  if (stats.evicted_records > 0 || stats.records != p.values) {
    return InternalError("tier bench: the store holds " + std::to_string(stats.records) + " of " +
                         std::to_string(p.values) + " values (" +
                         std::to_string(stats.evicted_records) +
                         " evicted): its capacity did not fit --bytes");
  }
  row.direct_io = stats.direct_io;
  row.io_uring = stats.io_uring;
  row.regions = stats.regions;

  // Raw: the same bytes in one plain file, O_DIRECT when the store has it.
  Fd raw(open(raw_path.c_str(),
              O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | (row.direct_io ? O_DIRECT : 0), 0644));
  if (!raw.valid()) return ErrnoToStatus(errno, "open " + raw_path);
  const uint64_t raw_bytes = p.values * p.slot;
  if (int err = posix_fallocate(raw.get(), 0, static_cast<off_t>(raw_bytes));
      err != 0 && err != EOPNOTSUPP && err != EINVAL) {
    return ErrnoToStatus(err, "allocate " + raw_path);
  }
  std::unique_ptr<disk::DiskIo> io = disk::DiskIo::Create(o.queue_depth, /*use_uring=*/true);
  row.raw_io_uring = io->uring();
  double raw_write_seconds = 0;
  std::vector<disk::IoOp> ops;
  for (const Batch& b : batches) {
    ops.clear();
    for (uint64_t j = 0; j < b.n; ++j) {
      ops.push_back(disk::IoOp{raw.get(), true, buffers[j].data(), p.slot, (b.start + j) * p.slot});
    }
    const auto start = Clock::now();
    io->Run(ops);
    // Durable per batch, as the store's writes are.
    const bool synced = fdatasync(raw.get()) == 0;
    raw_write_seconds += Seconds(start);
    if (!synced) return ErrnoToStatus(errno, "fdatasync " + raw_path);
    for (const disk::IoOp& op : ops) {
      if (op.result < 0) return ErrnoToStatus(static_cast<int>(-op.result), "raw write");
      if (op.result != static_cast<int64_t>(p.slot)) return DataLossError("raw write: short");
    }
  }
  row.raw_write_gbps = Gbps(value_bytes, raw_write_seconds);

  // Reads: the store's and the raw passes take turns going first.
  for (uint64_t rep = 0; rep < o.repeat; ++rep) {
    for (int turn = 0; turn < 2; ++turn) {
      const bool store_turn = (turn == 0) == (rep % 2 == 0);
      if (store_turn) {
        DropDirectoryCache(store_dir);
        const double seconds = StoreReadPass(*store, keys, p, batches, buffers, &row.wrong_values);
        row.read_gbps_runs.push_back(Gbps(value_bytes, seconds));
      } else {
        DropCache(raw_path);
        LARDER_ASSIGN_OR_RETURN(double seconds, RawReadPass(*io, raw.get(), p, batches, buffers));
        row.raw_read_gbps_runs.push_back(Gbps(value_bytes, seconds));
      }
    }
  }
  row.read_gbps = Median(row.read_gbps_runs);
  row.raw_read_gbps = Median(row.raw_read_gbps_runs);
  row.read_vs_raw = row.raw_read_gbps > 0 ? row.read_gbps / row.raw_read_gbps : 0;
  return row;
}

}  // namespace

uint64_t TierBenchResult::wrong_values() const {
  uint64_t wrong = 0;
  for (const TierBenchRow& row : rows) wrong += row.wrong_values;
  return wrong;
}

std::string TierBenchResult::ToJson() const {
  nlohmann::json rows_json = nlohmann::json::array();
  for (const TierBenchRow& r : rows) {
    rows_json.push_back({{"value_size", r.value_size},
                         {"values", r.values},
                         {"write_gbps", r.write_gbps},
                         {"raw_write_gbps", r.raw_write_gbps},
                         {"read_gbps", r.read_gbps},
                         {"raw_read_gbps", r.raw_read_gbps},
                         {"read_vs_raw", r.read_vs_raw},
                         {"read_gbps_runs", r.read_gbps_runs},
                         {"raw_read_gbps_runs", r.raw_read_gbps_runs},
                         {"wrong_values", r.wrong_values},
                         {"regions", r.regions},
                         {"direct_io", r.direct_io},
                         {"io_uring", r.io_uring},
                         {"raw_io_uring", r.raw_io_uring}});
  }
  nlohmann::json j = {{"disk_path", disk_path},
                      {"fs_type", fs_type},
                      {"bytes", bytes},
                      {"batch", batch},
                      {"queue_depth", queue_depth},
                      {"repeat", repeat},
                      {"wrong_values", wrong_values()},
                      {"rows", rows_json}};
  return j.dump();
}

Result<TierBenchResult> RunTierBench(const TierBenchOptions& o) {
  if (o.disk_path.empty()) return InvalidArgumentError("--disk-path is required");
  std::error_code ec;
  if (!fs::is_directory(o.disk_path, ec)) {
    return InvalidArgumentError("--disk-path " + o.disk_path + " is not a directory");
  }
  if (o.value_sizes.empty()) return InvalidArgumentError("--value-sizes lists no size");
  if (o.batch == 0 || o.queue_depth == 0 || o.repeat == 0) {
    return InvalidArgumentError("--batch, --queue-depth and --repeat must be > 0");
  }
  std::vector<Plan> plans;
  for (uint64_t size : o.value_sizes) {
    if (size == 0) return InvalidArgumentError("--value-sizes: a value size must be > 0");
    if (o.bytes < size) {
      return InvalidArgumentError("--bytes " + FormatByteSize(o.bytes) + " holds no value of " +
                                  FormatByteSize(size));
    }
    plans.push_back(MakePlan(o, size));
  }
  // Fail before anything is written when the largest size cannot fit.
  LARDER_RETURN_IF_ERROR(CheckFreeSpace(
      o.disk_path, *std::max_element(plans.begin(), plans.end(), [](const Plan& a, const Plan& b) {
        return a.disk_bytes < b.disk_bytes;
      })));

  TierBenchResult result;
  result.disk_path = o.disk_path;
  result.fs_type = FsType(o.disk_path);
  result.bytes = o.bytes;
  result.batch = o.batch;
  result.queue_depth = o.queue_depth;
  result.repeat = o.repeat;

  std::string dir = o.disk_path + "/larder-tier-bench-XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) return ErrnoToStatus(errno, "mkdtemp " + dir);
  RemoveOnExit remove_dir{dir};
  for (const Plan& plan : plans) {
    LARDER_ASSIGN_OR_RETURN(TierBenchRow row, RunSize(o, dir, plan));
    result.rows.push_back(std::move(row));
  }
  return result;
}

}  // namespace larder::bench
