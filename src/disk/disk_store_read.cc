// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// DiskStore's reads: rounds of values read straight into the callers' buffers (or bounced when
// they are not block-aligned), each checked against the index's hash as its read ends.
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <thread>
#include <unordered_map>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/logging.h"
#include "common/mutex.h"
#include "common/net.h"
#include "disk/disk_io.h"
#include "disk/disk_store_impl.h"
#include "disk/record_format.h"

namespace larder::disk {

void DiskStore::Impl::ReadRound(std::span<const DiskRead> items, std::span<const size_t> which,
                                std::vector<Result<uint64_t>>* results, bool use) {
  struct Job {
    size_t item;
    Entry entry;
    int fd;
    AlignedBuffer bounce;  // empty: the value is read straight into the caller's buffer
  };
  std::vector<Job> jobs;
  {
    MutexLock lock(mu);
    for (size_t i : which) {
      const DiskRead& item = items[i];
      auto it = index.find(std::string(item.key));
      if (it == index.end()) {
        (*results)[i] = NotFoundError("key '" + std::string(item.key) + "' is not on disk");
        ++counters.misses;
        continue;
      }
      const Entry& entry = it->second;
      if (entry.size > item.capacity) {
        (*results)[i] = InvalidArgumentError(
            "value of key '" + std::string(item.key) + "' has " + std::to_string(entry.size) +
            " bytes; the buffer holds " + std::to_string(item.capacity));
        continue;
      }
      if (entry.size == 0) {  // nothing to read
        (*results)[i] = uint64_t{0};
        ++counters.reads;
        it->second.uses = std::min<uint8_t>(it->second.uses + 1, kMaxUses);
        continue;
      }
      Region& region = regions.at(entry.region);
      ++region.pins;
      jobs.push_back(Job{i, entry, region.fd.get(), {}});
    }
  }
  std::vector<IoOp> ops;
  ops.reserve(jobs.size());
  for (Job& job : jobs) {
    const uint64_t value = AlignUp(job.entry.size);
    void* dst = items[job.item].dst;
    const bool straight =
        reinterpret_cast<uintptr_t>(dst) % kBlock == 0 && items[job.item].capacity >= value;
    if (!straight) job.bounce = AlignedBuffer(value);
    ops.push_back(IoOp{job.fd, false, straight ? dst : job.bounce.data(), value, job.entry.offset});
  }
  std::vector<std::pair<std::string, uint64_t>> bad;  // key, generation
  // Each value is checked (its length and hash, against the index) as soon as its read ends,
  // while the others' are still in flight.
  auto check = [&](size_t j) {
    Job& job = jobs[j];
    const DiskRead& item = items[job.item];
    const IoOp& op = ops[j];
    const auto* bytes = static_cast<const std::byte*>(op.buffer);
    if (op.result != static_cast<int64_t>(op.length) ||
        XXH3_64bits(bytes, job.entry.size) != job.entry.value_hash) {
      (*results)[job.item] = NotFoundError("key '" + std::string(item.key) +
                                           "': its disk record failed its checks and was dropped");
      bad.emplace_back(std::string(item.key), job.entry.generation);
      return;
    }
    if (job.bounce.data() != nullptr) std::memcpy(item.dst, job.bounce.data(), job.entry.size);
    (*results)[job.item] = job.entry.size;
  };
  if (options.test_io_delay.count() > 0) std::this_thread::sleep_for(options.test_io_delay);
  io->Run(ops, [&](size_t op) { check(op); });
  MutexLock lock(mu);
  for (const Job& job : jobs) --regions.at(job.entry.region).pins;
  for (const auto& [key, generation] : bad) {
    Log().warn("disk tier: the record of key '{}' failed its checks; dropped", key);
    auto it = index.find(key);
    if (it != index.end() && it->second.generation == generation) Drop(key);
    ++counters.checksum_failures;
  }
  for (const Job& job : jobs) {
    const auto& result = (*results)[job.item];
    if (result.ok() && use) {
      ++counters.reads;
      counters.read_bytes += *result;
      auto it = index.find(std::string(items[job.item].key));
      if (it != index.end() && it->second.generation == job.entry.generation) {
        it->second.uses = std::min<uint8_t>(it->second.uses + 1, kMaxUses);
      }
    }
  }
  unpinned.SignalAll();
}

std::vector<Result<uint64_t>> DiskStore::Read(std::span<const DiskRead> items) {
  std::vector<Result<uint64_t>> results(items.size(), Result<uint64_t>(uint64_t{0}));
  // Rounds of at most kRoundBytes of bounce memory (values read into buffers that are not
  // block-aligned), so that it stays bounded; values read straight into the callers' buffers take
  // none, and a batch of them is one round with every read in flight together.
  std::vector<size_t> which;
  uint64_t bytes = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const bool straight =
        reinterpret_cast<uintptr_t>(items[i].dst) % kBlock == 0 && items[i].capacity % kBlock == 0;
    const uint64_t size =
        straight ? 0 : AlignUp(std::min<uint64_t>(items[i].capacity, impl_->region_size));
    if (!which.empty() && bytes + size > kRoundBytes) {
      impl_->ReadRound(items, which, &results);
      which.clear();
      bytes = 0;
    }
    which.push_back(i);
    bytes += size;
  }
  if (!which.empty()) impl_->ReadRound(items, which, &results);
  return results;
}

}  // namespace larder::disk
