// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// DiskStore: the directory (its lock, identity and I/O mode), the index rebuilt from the regions'
// summaries, new regions, and the calls that need no I/O.
#include "disk/disk_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/env.h"
#include "common/limits.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "common/net.h"
#include "disk/disk_io.h"
#include "disk/disk_store_impl.h"
#include "disk/record_format.h"

namespace larder::disk {

std::string RegionName(uint64_t seq) {
  char name[40];
  std::snprintf(name, sizeof(name), "region-%010llu.dat", static_cast<unsigned long long>(seq));
  return name;
}

namespace {

Status SyncDirectory(const std::string& path) {
  Fd dir(open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return ErrnoToStatus(errno, "open " + path);
  if (fsync(dir.get()) != 0) return ErrnoToStatus(errno, "fsync " + path);
  return Status::Ok();
}

Status MakeDirectories(const std::string& path) {
  std::error_code error;
  std::filesystem::create_directories(path, error);
  if (error) return ErrnoToStatus(error.value(), "create " + path);
  return Status::Ok();
}

// 32 hex digits from the kernel's random source.
std::string RandomId() {
  uint8_t bytes[16];
  RandomBytes(bytes, sizeof(bytes));
  char text[33];
  for (size_t i = 0; i < sizeof(bytes); ++i) std::snprintf(text + 2 * i, 3, "%02x", bytes[i]);
  return text;
}

}  // namespace

Status DiskStore::Impl::TakeLock() {
  const std::string path = PathOf("LOCK");
  lock = Fd(open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!lock.valid()) return ErrnoToStatus(errno, "open " + path);
  if (flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char pid[32] = {};
    if (pread(lock.get(), pid, sizeof(pid) - 1, 0) < 0) pid[0] = '\0';
    if (err == EWOULDBLOCK) {
      std::string holder(pid);
      while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
      return FailedPreconditionError("disk directory " + options.path +
                                     " is held by another process" +
                                     (holder.empty() ? std::string() : " (pid " + holder + ")") +
                                     ": each process needs a directory of its own");
    }
    return ErrnoToStatus(err, "flock " + path);
  }
  const std::string pid = std::to_string(getpid()) + "\n";
  if (ftruncate(lock.get(), 0) != 0 || pwrite(lock.get(), pid.data(), pid.size(), 0) < 0) {
    Log().debug("disk tier: cannot write the pid into {}", path);
  }
  return Status::Ok();
}

Status DiskStore::Impl::LoadIdentity() {
  const std::string path = PathOf("IDENTITY");
  std::ifstream in(path);
  if (in) {
    std::string magic, id_word, size_word;
    unsigned format = 0;
    uint64_t size = 0;
    in >> magic >> format >> id_word >> identity >> size_word >> size;
    if (magic != "larder-disk" || id_word != "id" || size_word != "region_size" ||
        identity.size() != 32 || size == 0 || size > kMaxDiskRegionBytes || size % kBlock != 0) {
      return DataLossError("disk directory " + options.path +
                           ": IDENTITY is not a Larder disk identity; move the directory aside");
    }
    if (format != kFormat) {
      return FailedPreconditionError("disk directory " + options.path + " has format " +
                                     std::to_string(format) + "; this build reads format " +
                                     std::to_string(kFormat));
    }
    region_size = size;
    return Status::Ok();
  }
  identity = RandomId();
  region_size = options.region_size;
  const std::string text = "larder-disk " + std::to_string(kFormat) + "\nid " + identity +
                           "\nregion_size " + std::to_string(region_size) + "\n";
  const std::string tmp = path + ".tmp";
  {
    Fd out(open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!out.valid()) return ErrnoToStatus(errno, "open " + tmp);
    if (write(out.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) ||
        fsync(out.get()) != 0) {
      return ErrnoToStatus(errno, "write " + tmp);
    }
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) return ErrnoToStatus(errno, "rename " + tmp);
  return SyncDirectory(options.path);
}

Status DiskStore::Impl::ProbeDirectIo() {
  direct = false;
  if (options.direct_io == DirectIo::kOff) return Status::Ok();
  const std::string path = PathOf("probe.tmp");
  Fd fd(open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644));
  int err = fd.valid() ? 0 : errno;
  if (fd.valid()) {
    AlignedBuffer block(kBlock);
    std::memset(block.data(), 0, kBlock);
    if (pwrite(fd.get(), block.data(), kBlock, 0) != static_cast<ssize_t>(kBlock) ||
        pread(fd.get(), block.data(), kBlock, 0) != static_cast<ssize_t>(kBlock)) {
      err = errno != 0 ? errno : EIO;
    }
  }
  unlink(path.c_str());
  if (err == 0) {
    direct = true;
    return Status::Ok();
  }
  if (options.direct_io == DirectIo::kOn) {
    return ErrnoToStatus(err, "O_DIRECT on " + options.path + " (LARDER_DISK_DIRECT_IO=on)");
  }
  Log().warn("disk tier: {} refuses O_DIRECT ({}); using buffered I/O", options.path,
             std::strerror(err));
  return Status::Ok();
}

void DiskStore::Impl::Place(const std::string& key, const Entry& entry) {
  auto [it, inserted] = index.try_emplace(key, entry);
  if (!inserted) {
    live_bytes -= it->second.size;
    it->second = entry;
  }
  live_bytes += entry.size;
}

void DiskStore::Impl::Drop(const std::string& key) {
  auto it = index.find(key);
  if (it == index.end()) return;
  live_bytes -= it->second.size;
  index.erase(it);
}

Status DiskStore::Impl::ScanRegion(uint64_t seq, Region* region) {
  struct stat st {};
  if (fstat(region->fd.get(), &st) != 0) return ErrnoToStatus(errno, "fstat region");
  const auto file_size = std::min<uint64_t>(static_cast<uint64_t>(st.st_size), region_size);
  AlignedBuffer head(kBlock);
  uint64_t offset = 0;
  // Batch by batch, up to the first that is not whole: what a crash left half written.
  while (offset + kBlock <= file_size) {
    IoOp op{region->fd.get(), false, head.data(), kBlock, offset};
    io->Run(std::span(&op, 1));
    if (op.result != static_cast<int64_t>(kBlock)) break;
    uint64_t need = 0;
    const uint64_t room = file_size - offset;
    auto records = ParseSummary(head.data(), kBlock, room, &need);
    if (!records && need > 0) {  // a summary of more than a block: read it whole
      AlignedBuffer whole(need);
      IoOp rest{region->fd.get(), false, whole.data(), need, offset};
      io->Run(std::span(&rest, 1));
      if (rest.result != static_cast<int64_t>(need)) break;
      records = ParseSummary(whole.data(), need, room, &need);
    }
    if (!records) break;
    BatchHeader batch;
    std::memcpy(&batch, head.data(), sizeof(batch));
    for (ParsedRecord& record : *records) {
      const RecordHeader& r = record.header;
      auto it = index.find(record.key);
      if (r.flags & kTombstone) {
        if (it != index.end() && it->second.generation < r.generation) Drop(record.key);
      } else if (it == index.end() || it->second.generation < r.generation) {
        Place(record.key,
              Entry{seq, offset + record.value_offset, r.value_len, r.generation, r.value_hash});
      }
      next_generation = std::max(next_generation, r.generation + 1);
    }
    offset += AlignUp(batch.summary_bytes) + batch.values_bytes;
  }
  region->end = offset;
  return Status::Ok();
}

Status DiskStore::Impl::Scan() {
  std::vector<uint64_t> seqs;
  DIR* dir = opendir(options.path.c_str());
  if (dir == nullptr) return ErrnoToStatus(errno, "opendir " + options.path);
  while (dirent* entry = readdir(dir)) {
    unsigned long long seq = 0;
    char tail[8] = {};
    if (std::sscanf(entry->d_name, "region-%10llu.%4s", &seq, tail) == 2 &&
        std::strcmp(tail, "dat") == 0 && RegionName(seq) == entry->d_name) {
      seqs.push_back(seq);
    }
  }
  closedir(dir);
  std::sort(seqs.begin(), seqs.end());
  MutexLock lock(mu);
  for (uint64_t seq : seqs) {
    const std::string path = PathOf(RegionName(seq));
    Region region;
    region.seq = seq;
    region.fd = Fd(open(path.c_str(), OpenFlags()));
    if (!region.fd.valid()) return ErrnoToStatus(errno, "open " + path);
    LARDER_RETURN_IF_ERROR(ScanRegion(seq, &region));
    regions.emplace(seq, std::move(region));
    next_seq = seq + 1;
  }
  if (!seqs.empty()) {
    Log().info("disk tier: {} holds {} record(s) in {} region(s) ({} of values)", options.path,
               index.size(), regions.size(), FormatReadableBytes(static_cast<double>(live_bytes)));
  }
  return Status::Ok();
}

Result<uint64_t> DiskStore::Impl::NewRegion() {
  uint64_t seq;
  {
    MutexLock lock(mu);
    seq = next_seq++;
  }
  const std::string path = PathOf(RegionName(seq));
  Region region;
  region.seq = seq;
  region.fd = Fd(open(path.c_str(), OpenFlags() | O_CREAT | O_EXCL, 0644));
  if (!region.fd.valid()) return ErrnoToStatus(errno, "create " + path);
  int err = posix_fallocate(region.fd.get(), 0, static_cast<off_t>(region_size));
  if (err == EOPNOTSUPP || err == EINVAL) {
    err = ftruncate(region.fd.get(), static_cast<off_t>(region_size)) == 0 ? 0 : errno;
  }
  if (err != 0) {
    unlink(path.c_str());
    if (err == ENOSPC || err == EDQUOT) {
      return ResourceExhaustedError("disk " + options.path + " is full: no room for a region of " +
                                    FormatByteSize(region_size));
    }
    return ErrnoToStatus(err, "allocate " + path);
  }
  if (Status synced = SyncDirectory(options.path); !synced.ok()) {
    unlink(path.c_str());
    return synced;
  }
  MutexLock lock(mu);
  regions.emplace(seq, std::move(region));
  return seq;
}

DiskStore::DiskStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DiskStore::~DiskStore() = default;

Result<std::unique_ptr<DiskStore>> DiskStore::Open(DiskOptions options) {
  if (options.path.empty()) return InvalidArgumentError("disk tier: no directory given");
  if (options.region_size != 0 &&
      (options.region_size < 1ull << 20 || options.region_size > kMaxDiskRegionBytes ||
       options.region_size % kBlock != 0)) {
    return InvalidArgumentError("disk tier: the region size must be 1 MiB to 1 GiB, in 4 KiB");
  }
  if (!(options.low_watermark > 0) || options.low_watermark > options.high_watermark ||
      options.high_watermark > 1) {
    return InvalidArgumentError("disk tier: watermarks must satisfy 0 < low <= high <= 1");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  const std::string& path = impl->options.path;
  LARDER_RETURN_IF_ERROR(MakeDirectories(path));
  LARDER_RETURN_IF_ERROR(impl->TakeLock());
  struct statvfs fs {};
  if (statvfs(path.c_str(), &fs) != 0) return ErrnoToStatus(errno, "statvfs " + path);
  const auto fs_bytes = static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize;
  impl->capacity = impl->options.capacity_bytes > 0
                       ? impl->options.capacity_bytes
                       : static_cast<uint64_t>(static_cast<double>(fs_bytes) *
                                               impl->options.capacity_percent / 100);
  if (impl->options.region_size == 0) {
    // Automatic: a 128th of the capacity, from 1 MiB to 64 MiB, so that reclaiming one region
    // moves usage by little however small the disk.
    impl->options.region_size =
        std::clamp<uint64_t>(impl->capacity / 128 & ~((1ull << 20) - 1), 1ull << 20, 64ull << 20);
  }
  LARDER_RETURN_IF_ERROR(impl->LoadIdentity());
  LARDER_RETURN_IF_ERROR(impl->ProbeDirectIo());
  impl->io = DiskIo::Create(impl->options.queue_depth, impl->options.io_uring);
  if (impl->capacity < 2 * impl->region_size) {
    return InvalidArgumentError("disk tier: a capacity of " + FormatByteSize(impl->capacity) +
                                " holds fewer than two regions of " +
                                FormatByteSize(impl->region_size));
  }
  LARDER_RETURN_IF_ERROR(impl->Scan());
  Log().info("disk tier: {} (id {}), capacity {}, regions of {}, {} I/O, {}", path, impl->identity,
             FormatByteSize(impl->capacity), FormatByteSize(impl->region_size),
             impl->direct ? "direct" : "buffered", impl->io->uring() ? "io_uring" : "pread/pwrite");
  return std::unique_ptr<DiskStore>(new DiskStore(std::move(impl)));
}

const std::string& DiskStore::identity() const { return impl_->identity; }

std::vector<Status> DiskStore::Write(std::span<const DiskWrite> items) {
  MutexLock lock(impl_->write_mu);
  return impl_->WriteRecords(items, false);
}

Result<uint64_t> DiskStore::SizeOf(std::string_view key) const {
  MutexLock lock(impl_->mu);
  auto it = impl_->index.find(std::string(key));
  if (it == impl_->index.end())
    return NotFoundError("key '" + std::string(key) + "' is not on disk");
  return it->second.size;
}

Result<DiskRecord> DiskStore::Find(std::string_view key) const {
  MutexLock lock(impl_->mu);
  auto it = impl_->index.find(std::string(key));
  if (it == impl_->index.end())
    return NotFoundError("key '" + std::string(key) + "' is not on disk");
  return DiskRecord{it->first, it->second.size, it->second.generation};
}

Status DiskStore::Remove(std::span<const std::string> keys) {
  std::vector<DiskWrite> items;
  items.reserve(keys.size());
  for (const std::string& key : keys) items.push_back(DiskWrite{key, nullptr, 0});
  MutexLock lock(impl_->write_mu);
  for (const Status& status : impl_->WriteRecords(items, true)) LARDER_RETURN_IF_ERROR(status);
  return Status::Ok();
}

std::vector<DiskRecord> DiskStore::List() const {
  MutexLock lock(impl_->mu);
  std::vector<DiskRecord> records;
  records.reserve(impl_->index.size());
  for (const auto& [key, entry] : impl_->index) {
    records.push_back(DiskRecord{key, entry.size, entry.generation});
  }
  return records;
}

DiskStats DiskStore::Stats() const {
  MutexLock lock(impl_->mu);
  DiskStats stats = impl_->counters;
  stats.identity = impl_->identity;
  stats.capacity_bytes = impl_->capacity;
  stats.used_bytes = impl_->regions.size() * impl_->region_size;
  stats.live_bytes = impl_->live_bytes;
  stats.records = impl_->index.size();
  stats.regions = impl_->regions.size();
  stats.direct_io = impl_->direct;
  stats.io_uring = impl_->io->uring();
  return stats;
}

}  // namespace larder::disk
