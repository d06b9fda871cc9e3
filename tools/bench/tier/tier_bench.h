// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// `larder-bench tier`: the disk tier's holder library (disk::DiskStore) against the raw file
// system under it. In a fresh subdirectory of --disk-path, for each value size:
//   demote  DiskStore::Write of self-checking values (testing/values.h), --batch per call, until
//           --bytes are written: write_gbps.
//   read    every key back with DiskStore::Read, --batch per call, into 4 KiB-aligned buffers;
//           every value checked with VerifyValue: read_gbps, wrong_values.
//   raw     one plain file of the same values' bytes, written and then read back with DiskIo
//           (io_uring where the kernel allows it), one op per value (its size rounded up to
//           4 KiB), --batch ops per Run, the same queue depth, O_DIRECT when the store has it:
//           raw_write_gbps, raw_read_gbps.
// Only the Write, Read and Run calls are timed (and the raw writes' fdatasync, as the store syncs
// each batch): filling and verifying values is not. Before every read pass the files' pages are
// dropped from the page cache (posix_fadvise DONTNEED), and the store's and the raw read passes
// take turns going first; read figures are medians over --repeat passes of each. GB/s are 10^9
// bytes of values per second. The subdirectory is removed at the end.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "larder/status.h"

namespace larder::bench {

struct TierBenchOptions {
  std::string disk_path;  // an existing directory; the bench works in a fresh one inside it
  std::vector<uint64_t> value_sizes = {64ull << 10, 4ull << 20};
  uint64_t bytes = 1ull << 30;  // bytes of values written per value size
  uint64_t batch = 32;          // values per Write/Read call, ops per DiskIo::Run
  unsigned queue_depth = 32;    // the store's and the raw DiskIo's
  uint64_t repeat = 3;          // read passes of each kind per value size (medians)
};

struct TierBenchRow {
  uint64_t value_size = 0;
  uint64_t values = 0;  // --bytes / value_size
  double write_gbps = 0;
  double raw_write_gbps = 0;
  double read_gbps = 0;  // median over the passes
  double raw_read_gbps = 0;
  double read_vs_raw = 0;              // read_gbps / raw_read_gbps
  std::vector<double> read_gbps_runs;  // every pass, in order
  std::vector<double> raw_read_gbps_runs;
  uint64_t wrong_values = 0;  // over every read pass: missing, failed, wrong size or wrong bytes
  uint64_t regions = 0;       // region files the store used
  bool direct_io = false;     // the store's (DiskStats), and so the raw file's
  bool io_uring = false;      // the store's (DiskStats)
  bool raw_io_uring = false;  // the raw DiskIo's
};

struct TierBenchResult {
  std::string disk_path;
  std::string fs_type;  // of --disk-path (statfs): ext4, xfs, tmpfs, ..., or its magic in hex
  uint64_t bytes = 0;
  uint64_t batch = 0;
  unsigned queue_depth = 0;
  uint64_t repeat = 0;
  std::vector<TierBenchRow> rows;  // one per value size

  uint64_t wrong_values() const;
  std::string ToJson() const;
};

Result<TierBenchResult> RunTierBench(const TierBenchOptions& options);

}  // namespace larder::bench
