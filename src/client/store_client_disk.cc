// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
// StoreClientImpl: the disk holder (docs/disk-tier.md). A thread of its own polls the master for
// work and does it: demotions (objects of this host read through the engine, written to disk,
// reported once durable), promotions (disk copies put back into memory for a waiting reader), and
// drops (copies of removed or overwritten keys). Disk I/O never runs on the threads that call the
// master for leases and heartbeats.

#include <algorithm>
#include <future>
#include <memory>

#include "client/store_client_impl.h"
#include "common/logging.h"
#include "disk/disk_io.h"

namespace larder::client {

namespace {
// How long a poll waits at the master when there is no work (also how long Stop may take).
constexpr uint32_t kPollWaitMs = 250;
// Objects promoted together.
constexpr size_t kPromoteChunk = 64;
// Bytes of objects read for demotion together, and the bounds of that many objects.
constexpr uint64_t kDemoteBytes = 32ull << 20;
constexpr size_t kFirstDemoteChunk = 8;
constexpr size_t kMaxDemoteChunk = 1024;
// Copies per announcement message.
constexpr size_t kAnnounceChunk = 8192;
}  // namespace

Status StoreClientImpl::StartDiskHolder() {
  if (options_.disk_path.empty()) return Status::Ok();
  LARDER_ASSIGN_OR_RETURN(disk::DiskOptions disk_options, disk::DiskOptionsFromEnv());
  disk_options.path = options_.disk_path;  // the options' own settings win over the environment
  if (!options_.disk_capacity.empty()) {
    LARDER_RETURN_IF_ERROR(disk::ParseDiskCapacity(options_.disk_capacity, &disk_options));
  }
  // Told before a region's bytes go (on the holder's thread, inside a write): the master stops
  // serving those copies first.
  disk_options.on_evict = [this](std::span<const std::string> keys) {
    for (size_t first = 0; first < keys.size(); first += kMaxBatchKeys) {
      proto::DiskReportRequest request;
      const size_t end = std::min<size_t>(keys.size(), first + kMaxBatchKeys);
      request.mutable_evicted()->Assign(keys.begin() + first, keys.begin() + end);
      if (Status status = SendDiskReport(&request); !status.ok()) {
        Log().warn("disk tier: cannot tell the master of {} evicted copies: {}", end - first,
                   status.ToString());
      }
    }
  };
  LARDER_ASSIGN_OR_RETURN(disk_, disk::DiskStore::Open(std::move(disk_options)));
  // Registered before this client serves its caller: otherwise a put right away (write-through
  // included) would find no disk tier at the master. A master away now is polled again by the
  // loop.
  if (Status registered = PollDisk(0); !registered.ok()) {
    Log().warn("disk tier: cannot register the disk with the master yet: {}",
               registered.ToString());
  }
  disk_thread_ = std::thread([this] { DiskLoop(); });
  promote_thread_ = std::thread([this] { PromoteLoop(); });
  return Status::Ok();
}

void StoreClientImpl::StopDiskHolder() {
  disk_stopping_ = true;
  {
    MutexLock lock(promote_mu_);
    promote_wake_.SignalAll();
  }
  if (disk_thread_.joinable()) disk_thread_.join();
  if (promote_thread_.joinable()) promote_thread_.join();
}

void StoreClientImpl::PromoteLoop() {
  for (;;) {
    std::vector<std::string> keys;
    {
      MutexLock lock(promote_mu_);
      while (!disk_stopping_ && promote_queue_.empty()) promote_wake_.Wait(lock);
      if (disk_stopping_) return;
      keys.swap(promote_queue_);
    }
    Promote(keys);
  }
}

proto::DiskHolder StoreClientImpl::DiskHolderInfo() const {
  disk::DiskStats stats = disk_->Stats();
  proto::DiskHolder holder;
  holder.set_identity(stats.identity);
  holder.set_capacity_bytes(stats.capacity_bytes);
  holder.set_used_bytes(stats.used_bytes);
  holder.set_records(stats.records);
  return holder;
}

Status StoreClientImpl::SendDiskReport(proto::DiskReportRequest* request) {
  *request->mutable_holder() = DiskHolderInfo();
  proto::DiskReportReply reply;
  LARDER_RETURN_IF_ERROR(Rpc("DiskReport", &Stub::DiskReport, request, &reply));
  if (reply.refused_size() > 0) {
    std::vector<std::string> refused(reply.refused().begin(), reply.refused().end());
    Log().debug("disk tier: the master refused {} copies; dropping them", refused.size());
    LARDER_RETURN_IF_ERROR(disk_->Remove(refused));
  }
  return Status::Ok();
}

void StoreClientImpl::DiskLoop() {
  auto backoff = std::chrono::milliseconds(50);
  while (!disk_stopping_) {
    if (Status status = PollDisk(kPollWaitMs); !status.ok()) {
      if (disk_stopping_) break;
      Log().debug("disk tier: poll: {}", status.ToString());
      // The master is away (restarting, failing over): MasterClient::Call waited already; ask
      // again a little later, not in a tight loop.
      std::this_thread::sleep_for(backoff);
      backoff = std::min(2 * backoff, std::chrono::milliseconds(1000));
      continue;
    }
    backoff = std::chrono::milliseconds(50);
  }
}

Status StoreClientImpl::PollDisk(uint32_t wait_ms) {
  proto::DiskPollRequest request;
  proto::DiskPollReply reply;
  *request.mutable_holder() = DiskHolderInfo();
  request.set_wait_ms(wait_ms);
  LARDER_RETURN_IF_ERROR(Rpc("DiskPoll", &Stub::DiskPoll, &request, &reply));
  if (reply.announce()) {
    Announce();
    return Status::Ok();
  }
  if (reply.drop_size() > 0) {
    std::vector<std::string> drop(reply.drop().begin(), reply.drop().end());
    if (Status removed = disk_->Remove(drop); !removed.ok()) {
      Log().warn("disk tier: dropping {} copies: {}", drop.size(), removed.ToString());
    }
  }
  if (reply.promote_size() > 0) {
    // On a thread of their own: a reader waits for each, and demotions take longer.
    MutexLock lock(promote_mu_);
    promote_queue_.insert(promote_queue_.end(), reply.promote().begin(), reply.promote().end());
    promote_wake_.SignalAll();
  }
  if (reply.demote_size() > 0) {
    Demote(std::vector<std::string>(reply.demote().begin(), reply.demote().end()));
  }
  return Status::Ok();
}

void StoreClientImpl::Announce() {
  std::vector<disk::DiskRecord> records = disk_->List();
  size_t first = 0;
  do {
    proto::DiskReportRequest request;
    request.set_announce(true);
    const size_t end = std::min(records.size(), first + kAnnounceChunk);
    for (size_t i = first; i < end; ++i) {
      proto::DiskCopy* copy = request.add_stored();
      copy->set_key(records[i].key);
      copy->set_size(records[i].size);
      copy->set_generation(records[i].generation);
    }
    if (Status status = SendDiskReport(&request); !status.ok()) {
      Log().warn("disk tier: announcing {} copies: {}", end - first, status.ToString());
      return;  // the next poll asks again
    }
    first = end;
  } while (first < records.size());
  if (!records.empty()) Log().info("disk tier: announced {} copies", records.size());
}

void StoreClientImpl::Demote(const std::vector<std::string>& keys) {
  // Chunks of about kDemoteBytes (sized from the values seen so far), each read through the engine
  // while the one before is written to disk and reported on another thread.
  std::future<void> writing;
  size_t chunk = kFirstDemoteChunk;
  for (size_t first = 0; first < keys.size() && !disk_stopping_;) {
    const size_t n = std::min(chunk, keys.size() - first);
    auto batch = std::make_shared<DemoteBatch>();
    batch->keys.assign(keys.begin() + static_cast<std::ptrdiff_t>(first),
                       keys.begin() + static_cast<std::ptrdiff_t>(first + n));
    first += n;
    batch->values.resize(n);
    batch->sizes.resize(n);
    // Read the objects (their replicas are on this host: through the segments' mappings) under a
    // lease that does not make them recently used.
    batch->got = GetImpl(
        batch->keys,
        [&](size_t i, uint64_t size, std::vector<Fragment>* out) {
          batch->values[i] = disk::AlignedBuffer(size);
          batch->sizes[i] = size;
          if (size > 0) out->push_back(Fragment{batch->values[i].data(), 0, size});
          return Status::Ok();
        },
        CallScope{.master_keys = true, .quiet = true});
    uint64_t bytes = 0;
    for (uint64_t size : batch->sizes) bytes += size;
    const uint64_t mean = std::max<uint64_t>(bytes / n, 1);
    chunk = std::clamp<size_t>(kDemoteBytes / mean, 1, kMaxDemoteChunk);
    if (writing.valid()) writing.get();
    writing = std::async(std::launch::async, [this, batch] { StoreDemoted(*batch); });
  }
  if (writing.valid()) writing.get();
}

void StoreClientImpl::StoreDemoted(const DemoteBatch& batch) {
  std::vector<disk::DiskWrite> writes;
  std::vector<size_t> written;
  proto::DiskReportRequest report;
  for (size_t i = 0; i < batch.keys.size(); ++i) {
    if (batch.got[i].ok()) {
      writes.push_back(disk::DiskWrite{batch.keys[i], batch.values[i].data(), batch.sizes[i]});
      written.push_back(i);
    } else {
      report.add_failed(batch.keys[i]);  // gone meanwhile, or unreadable
    }
  }
  std::vector<Status> stored = disk_->Write(writes);
  for (size_t j = 0; j < written.size(); ++j) {
    const std::string& key = batch.keys[written[j]];
    auto record = stored[j].ok() ? disk_->Find(key) : Result<disk::DiskRecord>(stored[j]);
    if (!record.ok()) {
      Log().debug("disk tier: demoting '{}': {}", key, record.status().ToString());
      report.add_failed(key);
      continue;
    }
    proto::DiskCopy* copy = report.add_stored();
    copy->set_key(key);
    copy->set_size(record->size);
    copy->set_generation(record->generation);
  }
  if (Status status = SendDiskReport(&report); !status.ok()) {
    Log().warn("disk tier: reporting {} demotions: {}", batch.keys.size(), status.ToString());
  }
}

void StoreClientImpl::Promote(const std::vector<std::string>& keys) {
  for (size_t first = 0; first < keys.size() && !disk_stopping_; first += kPromoteChunk) {
    const size_t n = std::min(kPromoteChunk, keys.size() - first);
    std::span<const std::string> chunk(keys.data() + first, n);
    std::vector<disk::AlignedBuffer> buffers(n);
    std::vector<disk::DiskRead> reads(n);
    for (size_t i = 0; i < n; ++i) {
      auto size = disk_->SizeOf(chunk[i]);
      buffers[i] = disk::AlignedBuffer(size.ok() ? *size : 0);
      reads[i] = disk::DiskRead{chunk[i], buffers[i].data(), buffers[i].size()};
    }
    std::vector<Result<uint64_t>> read = disk_->Read(reads);
    proto::DiskReportRequest report;
    std::vector<std::string> put_keys;
    std::vector<BufferSlice> slices;
    for (size_t i = 0; i < n; ++i) {
      if (!read[i].ok()) {
        // Not on this disk (any more), or its record failed its checks: the copy is gone.
        report.add_evicted(chunk[i]);
        report.add_failed(chunk[i]);
        continue;
      }
      put_keys.push_back(chunk[i]);
      slices.push_back(BufferSlice{buffers[i].data(), *read[i]});
    }
    std::vector<std::span<const BufferSlice>> pieces;
    for (const BufferSlice& slice : slices) pieces.emplace_back(&slice, 1);
    PutConfig config;
    if (!segment_name_.empty()) config.preferred_segments = {segment_name_};
    std::vector<Status> put =
        PutImpl(put_keys, pieces, config, CallScope{.master_keys = true, .promotion = true});
    for (size_t j = 0; j < put_keys.size(); ++j) {
      if (!put[j].ok()) {
        Log().debug("disk tier: promoting '{}': {}", put_keys[j], put[j].ToString());
        report.add_failed(put_keys[j]);
      }
    }
    if (report.evicted_size() + report.failed_size() > 0) {
      if (Status status = SendDiskReport(&report); !status.ok()) {
        Log().warn("disk tier: reporting {} promotions: {}", n, status.ToString());
      }
    }
  }
}

}  // namespace larder::client
