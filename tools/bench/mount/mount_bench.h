// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// `larder-bench mount`: what mounting a large segment costs its owner, and what opening it costs a
// same-host peer. For each segment size, with an embedded master, an owner process mounts a
// segment of that size and puts one 4 KiB and one 4 MiB object into it; a fresh reader process
// (contributing no segment) then opens the owner's segment over shm and gets each object once.
// Reported: the owner's StoreClient::Create time, the reader's open and first-get times, and both
// processes' memory from /proc/<pid>/status, as medians over --repeat runs with fresh processes.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace larder::bench {

struct MountBenchOptions {
  // Segment sizes, one row each.
  std::vector<uint64_t> sizes = {1ull << 30, 64ull << 30, 1ull << 40};
  // Page size of the owner's segment: "off", "2m", "1g" or "auto". With 2m or 1g, each row
  // reserves the hugetlb pages it needs (root) and gives them back afterwards; rows that cannot
  // fit on this machine are skipped with the reason.
  std::string huge_pages = "off";
  // Runs per size, each with fresh owner and reader processes; rows report medians.
  int repeat = 3;
  // One JSON object per row instead of a table.
  bool json = false;
};

// Runs the rows and prints them to `out`. Returns the exit code: 0 when every row was measured or
// skipped with a reason, 1 when one failed.
int RunMountBench(const MountBenchOptions& options, std::ostream& out);

}  // namespace larder::bench
