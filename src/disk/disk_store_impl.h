// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// DiskStore's state, shared by its files: the directory and its regions (disk_store.cc), writes,
// reclaim and second chances (disk_store_write.cc), reads (disk_store_read.cc).
#pragma once

#include <fcntl.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/net.h"
#include "disk/disk_io.h"
#include "disk/disk_store.h"

namespace larder::disk {

// The reads a record's count keeps (two bits of frequency): a record read that often since written
// survives that many reclaims of its region without another read.
inline constexpr uint8_t kMaxUses = 3;

// The bounce memory one batch round may take: larger batches go in rounds.
inline constexpr uint64_t kRoundBytes = 64ull << 20;

// region-<seq>.dat
std::string RegionName(uint64_t seq);

struct Region {
  uint64_t seq = 0;
  Fd fd;
  uint64_t end = 0;      // the append offset
  uint64_t pins = 0;     // reads and writes using it
  bool rescued = false;  // its records read since written went to the head (Reinsert)
};

struct Entry {
  uint64_t region = 0;
  uint64_t offset = 0;  // of the value
  uint64_t size = 0;
  uint64_t generation = 0;
  uint64_t value_hash = 0;
  // Reads since written, up to kMaxUses: while above 0, reclaim writes the record again, with one
  // less (Reinsert).
  uint8_t uses = 0;
};

struct DiskStore::Impl {
  DiskOptions options;
  std::string identity;
  Fd lock;
  uint64_t region_size = 0;
  uint64_t capacity = 0;
  bool direct = false;
  std::unique_ptr<DiskIo> io;

  // Writes, removals and reclaim, one at a time (reads run beside them).
  Mutex write_mu;

  mutable Mutex mu LARDER_ACQUIRED_AFTER(write_mu);
  CondVar unpinned;
  std::map<uint64_t, Region> regions LARDER_GUARDED_BY(mu);
  std::unordered_map<std::string, Entry> index LARDER_GUARDED_BY(mu);
  uint64_t next_seq LARDER_GUARDED_BY(mu) = 1;
  uint64_t next_generation LARDER_GUARDED_BY(mu) = 1;
  uint64_t live_bytes LARDER_GUARDED_BY(mu) = 0;
  // With a write budget: when the next write may start.
  std::chrono::steady_clock::time_point budget_next LARDER_GUARDED_BY(write_mu){};
  DiskStats counters LARDER_GUARDED_BY(mu);

  std::string PathOf(const std::string& name) const { return options.path + "/" + name; }

  int OpenFlags() const { return O_RDWR | O_CLOEXEC | (direct ? O_DIRECT : 0); }

  Status TakeLock();
  Status LoadIdentity();
  Status ProbeDirectIo();
  Status Scan();
  Status ScanRegion(uint64_t seq, Region* region) LARDER_REQUIRES(mu);
  void Place(const std::string& key, const Entry& entry) LARDER_REQUIRES(mu);
  void Drop(const std::string& key) LARDER_REQUIRES(mu);
  Result<uint64_t> NewRegion() LARDER_REQUIRES(write_mu);
  void Reclaim(uint64_t wanted_regions) LARDER_REQUIRES(write_mu);
  // Before Reclaim(wanted_regions) takes the oldest regions, writes their records read since
  // written again at the head, each with one read less. True when it wrote any.
  bool Reinsert(uint64_t wanted_regions) LARDER_REQUIRES(write_mu);
  // Writes records (tombstones when `tombstone`); statuses per item. With `rewrite_region`, writes
  // only the items still held, with their size, in that region (Reinsert's copies).
  std::vector<Status> WriteRecords(std::span<const DiskWrite> items, bool tombstone,
                                   uint64_t rewrite_region = 0) LARDER_REQUIRES(write_mu);
  // Reads a round of items; `use`: the reads count as uses of their records (not Reinsert's).
  void ReadRound(std::span<const DiskRead> items, std::span<const size_t> which,
                 std::vector<Result<uint64_t>>* results, bool use = true);
};

}  // namespace larder::disk
