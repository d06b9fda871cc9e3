// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// DiskStore: one process's disk tier on one directory (the directory's *holder*).
//
// The directory holds an exclusive lock (LOCK, held with flock for the life of the store, so a
// second process on the same directory is refused), an identity (IDENTITY: a random id, the format
// version and the region size, written once and kept across restarts, so that a restarted holder
// owns its records again), and region files (region-<n>.dat), each preallocated to the region size
// and filled append-only with batches of records, one batch per write round and region:
//
//   [summary: batch header 64 B | per record: header 32 B + key | zeros to 4 KiB]
//   [value | zeros to 4 KiB] [value | zeros to 4 KiB] ...
//
// The batch header holds a magic, the format version, the record count, the summary's and the
// values' lengths and an XXH3 hash of the summary; a record's header holds its key's and value's
// lengths, its generation and an XXH3 hash of its value. Keys cost their summary bytes, not a
// block of their own, so a 64 KiB value takes 64 KiB and a share of one block. A batch counts only
// while its summary's hash and every length hold, and a value only while its hash does (checked
// against the index at every read): a torn, truncated or bit-flipped record is a miss, and is
// dropped from the index when read, never returned as bytes. Writes go out in batches
// (io_uring with O_DIRECT where the file system and the kernel allow it, pread/pwrite otherwise,
// detected at Open and logged), and a batch is durable (fdatasync) before any of its keys enters
// the index. Open rebuilds the index by scanning the regions in order; a removal is a tombstone
// record, so a removed key does not come back after a restart.
//
// Space: the regions together stay within the capacity. When a write would take them past the high
// watermark, the oldest regions are reclaimed until they are under the low one: their keys leave
// the index, `on_evict` is told (the holder tells the master) before any byte goes, reads still
// using the region finish, and then its file is deleted. Eviction is by region, first in first out,
// with second chances (CLOCK on a log, with a two-bit count of reads): a record read since it was
// written is written again at the head before reclaim reaches its region, its count one less, and
// only records whose count is down to zero are dropped. On the production trace that keeps hits
// above exact LRU of the same bytes, for about one rewrite per five demotions; reinsertion on
// every hit (a copy per read) kept fewer.
//
// Thread safety: every method may be called from any thread. Disk I/O runs on the calling thread:
// callers keep it off threads that serve heartbeats, leases or RPCs.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "larder/status.h"

namespace larder::disk {

enum class DirectIo { kAuto, kOn, kOff };

struct DiskOptions {
  std::string path;  // the directory; created when missing
  // The most bytes the region files may take. 0: capacity_percent of the file system's size.
  uint64_t capacity_bytes = 0;
  double capacity_percent = 50;
  // A new directory's region size (an existing one keeps its own). 0: a 128th of the capacity,
  // from 1 MiB to 64 MiB.
  uint64_t region_size = 0;
  // Fractions of the capacity. Reclaim goes by whole regions, so the low one is a region or so
  // below the high one: the log then keeps within about 1% of its capacity.
  double high_watermark = 0.995;
  double low_watermark = 0.99;
  unsigned queue_depth = 32;
  // Bytes per second the tier may write (demotions and second chances), so that it keeps to a
  // share of the device and of its endurance; writes past it wait. 0: no limit.
  uint64_t write_budget = 0;
  DirectIo direct_io = DirectIo::kAuto;  // kAuto: O_DIRECT where the file system takes it
  bool io_uring = true;                  // false: pread/pwrite
  // Tests only: every batch of reads or writes waits this long first, as on a slow disk
  // (LARDER_DISK_TEST_IO_DELAY, e.g. "300ms").
  std::chrono::milliseconds test_io_delay{0};
  // Told the keys of a region about to be reclaimed, before its bytes go (from the thread that
  // writes). Empty: nobody needs telling.
  std::function<void(std::span<const std::string> keys)> on_evict;
};

// Reads DiskOptions from LARDER_DISK_* settings over `base` (LARDER_DISK_PATH,
// LARDER_DISK_CAPACITY: a size or a percentage of the file system, LARDER_DISK_REGION_SIZE,
// LARDER_DISK_QUEUE_DEPTH, LARDER_DISK_HIGH_WATERMARK, LARDER_DISK_LOW_WATERMARK,
// LARDER_DISK_WRITE_BUDGET: bytes per second, e.g. 200M,
// LARDER_DISK_DIRECT_IO: auto|on|off, LARDER_DISK_IO_URING: 0|1).
Result<DiskOptions> DiskOptionsFromEnv(DiskOptions base = {});

// A size ("1G") or a percentage of the file system ("40%") into options->capacity_*.
Status ParseDiskCapacity(std::string_view text, DiskOptions* options);

struct DiskWrite {
  std::string_view key;
  const void* data = nullptr;
  uint64_t size = 0;
};

struct DiskRead {
  std::string_view key;
  void* dst = nullptr;
  uint64_t capacity = 0;
};

struct DiskRecord {
  std::string key;
  uint64_t size = 0;
  uint64_t generation = 0;
};

struct DiskStats {
  std::string identity;
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;  // region files (allocated)
  uint64_t live_bytes = 0;  // values of records in the index
  uint64_t records = 0;
  uint64_t regions = 0;
  bool direct_io = false;
  bool io_uring = false;
  uint64_t writes = 0;  // records written
  uint64_t write_bytes = 0;
  uint64_t reads = 0;  // records read and verified
  uint64_t read_bytes = 0;
  uint64_t misses = 0;             // reads of keys not held
  uint64_t checksum_failures = 0;  // records dropped because a hash or a length failed
  uint64_t evicted_records = 0;    // by region reclaim
  uint64_t evicted_regions = 0;
  uint64_t reinserted = 0;      // records read since written, written again ahead of reclaim
  uint64_t write_failures = 0;  // disk full, I/O errors
};

class DiskStore {
 public:
  // Takes the directory (refused when another process holds it), reads or creates its identity,
  // probes O_DIRECT and io_uring, and rebuilds the index from the regions.
  static Result<std::unique_ptr<DiskStore>> Open(DiskOptions options);
  ~DiskStore();

  // The directory's identity: the same after a restart of the holder.
  const std::string& identity() const;

  // Writes each value as a record; one status per item, OK once the record is durable and in the
  // index. A key already held with the same size is OK at once (writes are idempotent). A value
  // larger than a region is InvalidArgument; no room on the file system is ResourceExhausted.
  std::vector<Status> Write(std::span<const DiskWrite> items);

  // Reads each key's value into its buffer; the value's size per item, NotFound for a key not held
  // (or whose record failed its checks, which is then dropped), InvalidArgument for a buffer
  // smaller than the value.
  std::vector<Result<uint64_t>> Read(std::span<const DiskRead> items);

  // The value's size of `key`, NotFound when not held.
  Result<uint64_t> SizeOf(std::string_view key) const;
  // The record of `key` (its size and generation), NotFound when not held.
  Result<DiskRecord> Find(std::string_view key) const;

  // Removes keys (durably: a tombstone record). Keys not held are ignored.
  Status Remove(std::span<const std::string> keys);

  // Every record held: what a holder announces after a restart.
  std::vector<DiskRecord> List() const;

  DiskStats Stats() const;

 private:
  struct Impl;
  explicit DiskStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace larder::disk
