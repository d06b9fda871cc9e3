// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// DiskStore's writes: batches placed in the open region and new ones, made durable before they are
// indexed; region reclaim on the watermarks, and second chances for records read since written.
#include <unistd.h>

#include <numeric>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <thread>
#include <unordered_map>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/env.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "common/net.h"
#include "disk/disk_io.h"
#include "disk/disk_store_impl.h"
#include "disk/record_format.h"

namespace larder::disk {

void DiskStore::Impl::Reclaim(uint64_t wanted_regions) {
  for (;;) {
    std::vector<std::string> keys;
    uint64_t seq = 0;
    {
      MutexLock lock(mu);
      const double used = static_cast<double>((regions.size() + wanted_regions) * region_size);
      if (used <= options.high_watermark * static_cast<double>(capacity) || regions.empty()) {
        return;
      }
      // Down to the low watermark, oldest first: one region a pass.
      seq = regions.begin()->first;
      for (auto it = index.begin(); it != index.end();) {
        if (it->second.region == seq) {
          keys.push_back(it->first);
          live_bytes -= it->second.size;
          it = index.erase(it);
        } else {
          ++it;
        }
      }
      counters.evicted_records += keys.size();
      ++counters.evicted_regions;
    }
    if (options.on_evict && !keys.empty()) options.on_evict(keys);
    {
      MutexLock lock(mu);
      while (regions.begin()->second.pins > 0) unpinned.Wait(lock);
      regions.erase(regions.begin());
    }
    unlink(PathOf(RegionName(seq)).c_str());
    Log().debug("disk tier: reclaimed region {} ({} record(s))", seq, keys.size());
    // Continue until under the low watermark.
    MutexLock lock(mu);
    const double used = static_cast<double>((regions.size() + wanted_regions) * region_size);
    if (used <= options.low_watermark * static_cast<double>(capacity)) return;
  }
}

bool DiskStore::Impl::Reinsert(uint64_t wanted_regions) {
  // The regions that Reclaim(wanted_regions) would take, down to the low watermark, and one more:
  // rescued a region early, the rewrites find room without reclaiming the region they come from.
  const auto limit =
      static_cast<uint64_t>(options.low_watermark * static_cast<double>(capacity)) / region_size;
  bool wrote = false;
  for (;;) {
    uint64_t seq = 0;
    std::vector<std::string> keys;
    std::vector<uint64_t> sizes;
    {
      MutexLock lock(mu);
      if (static_cast<double>((regions.size() + wanted_regions + 1) * region_size) <=
          options.high_watermark * static_cast<double>(capacity)) {
        return wrote;  // no reclaim coming
      }
      const uint64_t victims =
          regions.size() + wanted_regions + 1 - std::min(limit, regions.size());
      auto victim = std::find_if(regions.begin(), regions.end(),
                                 [](const auto& region) { return !region.second.rescued; });
      // Only the regions reclaim would take, and never the one being written.
      if (victim == regions.end() ||
          static_cast<uint64_t>(std::distance(regions.begin(), victim)) >= victims ||
          std::next(victim) == regions.end()) {
        return wrote;
      }
      victim->second.rescued = true;
      seq = victim->first;
      for (const auto& [key, entry] : index) {
        if (entry.region == seq && entry.uses > 0) {
          keys.push_back(key);
          sizes.push_back(entry.size);
        }
      }
    }
    if (keys.empty()) continue;
    std::vector<AlignedBuffer> buffers;
    std::vector<DiskRead> reads;
    buffers.reserve(keys.size());
    reads.reserve(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      buffers.emplace_back(AlignUp(sizes[i]));
      reads.push_back(DiskRead{keys[i], buffers.back().data(), buffers.back().size()});
    }
    std::vector<size_t> which(keys.size());
    std::iota(which.begin(), which.end(), 0);
    std::vector<Result<uint64_t>> read(keys.size(), Result<uint64_t>(uint64_t{0}));
    ReadRound(reads, which, &read, /*use=*/false);
    std::vector<DiskWrite> writes;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (read[i].ok()) writes.push_back(DiskWrite{keys[i], buffers[i].data(), *read[i]});
    }
    size_t written = 0;
    for (const Status& status : WriteRecords(writes, false, seq)) written += status.ok();
    wrote = true;
    MutexLock lock(mu);
    counters.reinserted += written;
    Log().debug("disk tier: region {}: {} record(s) read since written go to the head", seq,
                written);
  }
}

std::vector<Status> DiskStore::Impl::WriteRecords(std::span<const DiskWrite> items, bool tombstone,
                                                  uint64_t rewrite_region) {
  std::vector<Status> results(items.size());
  std::vector<size_t> todo;  // the items that need writing
  {
    MutexLock lock(mu);
    std::unordered_map<std::string_view, size_t> first;
    for (size_t i = 0; i < items.size(); ++i) {
      const DiskWrite& item = items[i];
      if (item.key.empty() || item.key.size() > kMaxKeyBytes) {
        results[i] = InvalidArgumentError("disk tier: a key of " + std::to_string(item.key.size()) +
                                          " bytes (1 to " + std::to_string(kMaxKeyBytes) + ")");
        continue;
      }
      if (LoneRecordBytes(item.key.size(), item.size) > region_size) {
        results[i] =
            InvalidArgumentError("disk tier: value of key '" + std::string(item.key) + "' has " +
                                 std::to_string(item.size) + " bytes, more than a region (" +
                                 FormatByteSize(region_size) + ") holds");
        continue;
      }
      auto it = index.find(std::string(item.key));
      if (rewrite_region != 0) {
        if (it == index.end() || it->second.size != item.size ||
            it->second.region != rewrite_region) {
          continue;  // changed or gone since it was read
        }
      } else if (tombstone ? it == index.end()
                           : (it != index.end() && it->second.size == item.size)) {
        continue;  // already held (or already gone): nothing to write
      }
      if (!first.emplace(item.key, i).second) continue;  // a repeat in this batch
      todo.push_back(i);
    }
  }
  auto value_bytes = [&](size_t i) { return tombstone ? 0 : AlignUp(items[i].size); };
  // One batch: a summary and the values of its records, written as one.
  struct Batch {
    int64_t region_ix = -1;  // -1: the open region; k: the round's k-th new one
    uint64_t region = 0;
    uint64_t start = 0;
    uint64_t summary = 0;  // record headers and keys
    uint64_t values = 0;
    std::vector<size_t> members;  // items
    std::vector<uint64_t> generations;
    uint64_t Padded() const { return AlignUp(sizeof(BatchHeader) + summary); }
    uint64_t End() const { return start + Padded() + values; }
  };
  size_t next = 0;
  while (next < todo.size()) {
    // One round: records up to kRoundBytes of bounce memory, in batches in the open region and
    // then in new ones.
    uint64_t open_region = 0;
    uint64_t open_end = 0;
    auto open = [&] {
      MutexLock lock(mu);
      open_region = regions.empty() ? 0 : regions.rbegin()->first;
      open_end = regions.empty() ? 0 : regions.rbegin()->second.end;
    };
    open();
    std::vector<Batch> batches;
    size_t count = 0;
    uint64_t need_regions = 0;
    auto plan = [&] {
      batches.clear();
      count = 0;
      need_regions = 0;
      uint64_t round_bytes = 0;
      for (size_t k = next; k < todo.size(); ++k) {
        const size_t i = todo[k];
        const uint64_t summary = SummaryBytes(items[i].key.size());
        const uint64_t value = value_bytes(i);
        if (count > 0 && round_bytes + summary + value > kRoundBytes) break;
        Batch* batch = batches.empty() ? nullptr : &batches.back();
        if (batch == nullptr || batch->start +
                                        AlignUp(sizeof(BatchHeader) + batch->summary + summary) +
                                        batch->values + value >
                                    region_size) {
          Batch fresh;
          fresh.region_ix = batch != nullptr ? batch->region_ix : -1;
          fresh.start = batch != nullptr ? batch->End() : open_end;
          if ((batch == nullptr && open_region == 0) ||
              fresh.start + LoneRecordBytes(items[i].key.size(), items[i].size) > region_size) {
            fresh.region_ix = static_cast<int64_t>(need_regions++);
            fresh.start = 0;
          }
          batches.push_back(std::move(fresh));
          batch = &batches.back();
        }
        batch->summary += summary;
        batch->values += value;
        batch->members.push_back(i);
        round_bytes += summary + value;
        ++count;
      }
    };
    plan();
    // Second chances for the records of the regions reclaim is about to take (not for the
    // rewrites themselves); they move the log's head, so the round is planned again.
    if (need_regions > 0 && !tombstone && rewrite_region == 0 && Reinsert(need_regions)) {
      open();
      plan();
    }
    if (need_regions > 0) {
      Reclaim(need_regions);
      MutexLock lock(mu);
      if (open_region != 0 && !regions.contains(open_region)) {
        open_region = 0;  // reclaimed itself, on a disk of few regions
        lock.Unlock();
        plan();
        Reclaim(need_regions);
      }
    }
    std::vector<uint64_t> fresh;
    Status no_room;
    for (uint64_t r = 0; r < need_regions; ++r) {
      {
        MutexLock lock(mu);
        if (static_cast<double>((regions.size() + 1) * region_size) >
            static_cast<double>(capacity)) {
          no_room = ResourceExhaustedError("disk tier: " + options.path + " holds no more (" +
                                           FormatByteSize(capacity) + " capacity)");
          break;
        }
      }
      auto seq = NewRegion();
      if (!seq.ok()) {
        no_room = seq.status();
        break;
      }
      fresh.push_back(*seq);
    }
    // Place the batches; those of regions that could not be made fail with no_room.
    std::vector<int> fds;
    {
      MutexLock lock(mu);
      std::vector<Batch> placed;
      for (Batch& batch : batches) {
        if (batch.region_ix >= static_cast<int64_t>(fresh.size())) {
          for (size_t i : batch.members) {
            results[i] = no_room.ok() ? ResourceExhaustedError("disk tier: no region") : no_room;
            ++counters.write_failures;
          }
          continue;
        }
        batch.region = batch.region_ix < 0 ? open_region : fresh[batch.region_ix];
        Region& region = regions.at(batch.region);
        for (size_t k = 0; k < batch.members.size(); ++k) {
          batch.generations.push_back(next_generation++);
        }
        region.end = batch.End();
        ++region.pins;
        fds.push_back(region.fd.get());
        placed.push_back(std::move(batch));
      }
      batches = std::move(placed);
    }
    next += count;
    // Build the batches and write them.
    std::vector<AlignedBuffer> buffers;
    std::vector<IoOp> ops;
    std::vector<std::vector<uint64_t>> hashes(batches.size());
    for (size_t b = 0; b < batches.size(); ++b) {
      const Batch& batch = batches[b];
      AlignedBuffer buffer(batch.Padded() + batch.values);
      std::byte* out = buffer.data();
      std::memset(out, 0, batch.Padded());
      BatchHeader header{};
      header.magic = kMagic;
      header.format = kFormat;
      header.count = static_cast<uint32_t>(batch.members.size());
      header.summary_bytes = sizeof(BatchHeader) + batch.summary;
      header.values_bytes = batch.values;
      uint64_t at = sizeof(BatchHeader);
      uint64_t value_at = batch.Padded();
      for (size_t k = 0; k < batch.members.size(); ++k) {
        const DiskWrite& item = items[batch.members[k]];
        const uint64_t value_len = tombstone ? 0 : item.size;
        RecordHeader record{};
        record.key_len = static_cast<uint32_t>(item.key.size());
        record.flags = tombstone ? kTombstone : 0;
        record.value_len = value_len;
        record.generation = batch.generations[k];
        record.value_hash = XXH3_64bits(item.data, value_len);
        hashes[b].push_back(record.value_hash);
        std::memcpy(out + at, &record, sizeof(record));
        std::memcpy(out + at + sizeof(record), item.key.data(), item.key.size());
        at += SummaryBytes(item.key.size());
        if (value_len > 0) {
          std::memcpy(out + value_at, item.data, value_len);
          std::memset(out + value_at + value_len, 0, AlignUp(value_len) - value_len);
          value_at += AlignUp(value_len);
        }
      }
      std::memcpy(out, &header, sizeof(header));
      header.summary_hash = SummaryHash(out, header.summary_bytes);
      std::memcpy(out, &header, sizeof(header));
      ops.push_back(IoOp{fds[b], true, out, buffer.size(), batch.start});
      buffers.push_back(std::move(buffer));
    }
    if (options.test_io_delay.count() > 0) std::this_thread::sleep_for(options.test_io_delay);
    if (options.write_budget > 0) {  // paced: each round starts when the budget has room for it
      uint64_t bytes = 0;
      for (const IoOp& op : ops) bytes += op.length;
      const auto now = std::chrono::steady_clock::now();
      if (budget_next > now) std::this_thread::sleep_until(budget_next);
      budget_next =
          std::max(budget_next, now) +
          std::chrono::nanoseconds(static_cast<int64_t>(static_cast<double>(bytes) * 1e9 /
                                                        static_cast<double>(options.write_budget)));
    }
    io->Run(ops);
    // Durable before any key enters the index.
    std::map<int, Status> synced;
    for (int fd : fds) synced.emplace(fd, Status::Ok());
    for (auto& [fd, status] : synced) {
      if (fdatasync(fd) != 0) status = ErrnoToStatus(errno, "fdatasync");
      if (!direct) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    }
    MutexLock lock(mu);
    for (size_t b = 0; b < batches.size(); ++b) {
      const Batch& batch = batches[b];
      Status status = synced[fds[b]];
      if (status.ok() && ops[b].result != static_cast<int64_t>(ops[b].length)) {
        status = ops[b].result < 0 ? ErrnoToStatus(static_cast<int>(-ops[b].result), "disk write")
                                   : DataLossError("disk tier: a short write");
      }
      uint64_t value_at = batch.start + batch.Padded();
      for (size_t k = 0; k < batch.members.size(); ++k) {
        const size_t i = batch.members[k];
        const DiskWrite& item = items[i];
        if (!status.ok()) {
          results[i] = status.WithContext("writing key '" + std::string(item.key) + "'");
          ++counters.write_failures;
        } else if (tombstone) {
          Drop(std::string(item.key));
        } else {
          Entry entry{batch.region, value_at, item.size, batch.generations[k], hashes[b][k]};
          bool place = true;
          if (rewrite_region != 0) {  // a second chance, counted against its reads
            auto it = index.find(std::string(item.key));
            // Gone meanwhile (reclaimed, its holder told; or removed): the copy stays unused.
            place = it != index.end() && it->second.region == rewrite_region;
            if (place && it->second.uses > 0) entry.uses = it->second.uses - 1;
          }
          if (place) {
            Place(std::string(item.key), entry);
          } else {
            results[i] = NotFoundError("key '" + std::string(item.key) + "' left the disk");
          }
          ++counters.writes;
          counters.write_bytes += item.size;
        }
        value_at += value_bytes(i);
      }
      --regions.at(batch.region).pins;
    }
    unpinned.SignalAll();
  }
  // Repeats in the batch answer as their first did.
  {
    std::unordered_map<std::string_view, size_t> first;
    for (size_t i = 0; i < items.size(); ++i) {
      auto [it, inserted] = first.emplace(items[i].key, i);
      if (!inserted) results[i] = results[it->second];
    }
  }
  return results;
}

}  // namespace larder::disk
