// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
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
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <unordered_map>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/env.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "common/net.h"
#include "disk/disk_io.h"

namespace larder::disk {

namespace {

constexpr uint32_t kMagic = 0x3152444c;  // "LDR1"
constexpr uint16_t kFormat = 1;
constexpr uint16_t kTombstone = 1;
constexpr uint32_t kMaxKeyBytes = 64 * 1024;
// The bounce memory one batch round may take: larger batches go in rounds.
constexpr uint64_t kRoundBytes = 64ull << 20;

struct Header {
  uint32_t magic;
  uint16_t format;
  uint16_t flags;
  uint32_t key_len;
  uint32_t reserved;
  uint64_t value_len;
  uint64_t generation;
  uint64_t value_hash;
  uint64_t header_hash;
  uint8_t zero[16];
};
static_assert(sizeof(Header) == 64);

uint64_t HeadBytes(uint64_t key_len) { return AlignUp(sizeof(Header) + key_len); }
uint64_t RecordBytes(uint64_t key_len, uint64_t value_len) {
  return HeadBytes(key_len) + AlignUp(value_len);
}

uint64_t HeaderHash(Header header, std::string_view key) {
  header.header_hash = 0;
  return XXH3_64bits_withSeed(key.data(), key.size(), XXH3_64bits(&header, sizeof(header)));
}

// Fills `head` (HeadBytes(key.size()) bytes) with a record's header and key, zero padded.
void FillHead(std::byte* head, std::string_view key, uint64_t value_len, uint64_t generation,
              uint64_t value_hash, uint16_t flags) {
  Header header{};
  header.magic = kMagic;
  header.format = kFormat;
  header.flags = flags;
  header.key_len = static_cast<uint32_t>(key.size());
  header.value_len = value_len;
  header.generation = generation;
  header.value_hash = value_hash;
  header.header_hash = HeaderHash(header, key);
  const uint64_t bytes = HeadBytes(key.size());
  std::memset(head, 0, bytes);
  std::memcpy(head, &header, sizeof(header));
  std::memcpy(head + sizeof(header), key.data(), key.size());
}

// The header at `head` when it is a whole, consistent record header (its key follows it in
// `head_bytes`); nullopt otherwise.
std::optional<Header> ParseHead(const std::byte* head, uint64_t head_bytes) {
  Header header;
  if (head_bytes < sizeof(header)) return std::nullopt;
  std::memcpy(&header, head, sizeof(header));
  if (header.magic != kMagic || header.format != kFormat || header.key_len == 0 ||
      header.key_len > kMaxKeyBytes || (header.flags & ~kTombstone) != 0) {
    return std::nullopt;
  }
  if (HeadBytes(header.key_len) > head_bytes) return header;  // the caller reads the rest first
  std::string_view key(reinterpret_cast<const char*>(head + sizeof(header)), header.key_len);
  if (HeaderHash(header, key) != header.header_hash) return std::nullopt;
  return header;
}

std::string RegionName(uint64_t seq) {
  char name[40];
  std::snprintf(name, sizeof(name), "region-%010llu.dat", static_cast<unsigned long long>(seq));
  return name;
}

Status SyncDirectory(const std::string& path) {
  Fd dir(open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return ErrnoToStatus(errno, "open " + path);
  if (fsync(dir.get()) != 0) return ErrnoToStatus(errno, "fsync " + path);
  return Status::Ok();
}

Status MakeDirectories(const std::string& path) {
  std::string at;
  std::stringstream parts(path);
  std::string part;
  if (!path.empty() && path[0] == '/') at = "/";
  while (std::getline(parts, part, '/')) {
    if (part.empty()) continue;
    at += part + "/";
    if (mkdir(at.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoToStatus(errno, "mkdir " + at);
    }
  }
  return Status::Ok();
}

std::string RandomId() {
  std::random_device random;
  char text[33];
  for (int i = 0; i < 4; ++i) {
    std::snprintf(text + 8 * i, 9, "%08x", static_cast<unsigned>(random()));
  }
  return text;
}

}  // namespace

Status ParseDiskCapacity(std::string_view text, DiskOptions* options) {
  if (!text.empty() && text.back() == '%') {
    std::string number(text.substr(0, text.size() - 1));
    char* end = nullptr;
    const double percent = std::strtod(number.c_str(), &end);
    if (number.empty() || end != number.c_str() + number.size() || !(percent > 0) ||
        percent > 100) {
      return InvalidArgumentError("disk capacity '" + std::string(text) +
                                  "': a percentage must be in (0, 100]");
    }
    options->capacity_bytes = 0;
    options->capacity_percent = percent;
    return Status::Ok();
  }
  auto bytes = ParseByteSize(text);
  if (!bytes.ok()) {
    return InvalidArgumentError("disk capacity '" + std::string(text) +
                                "': give a size (\"200G\") or a percentage of the file system "
                                "(\"40%\")");
  }
  options->capacity_bytes = *bytes;
  return Status::Ok();
}

Result<DiskOptions> DiskOptionsFromEnv(DiskOptions base) {
  DiskOptions options = std::move(base);
  if (std::string path = GetEnv("LARDER_DISK_PATH"); !path.empty()) options.path = path;
  if (std::string capacity = GetEnv("LARDER_DISK_CAPACITY"); !capacity.empty()) {
    LARDER_RETURN_IF_ERROR(ParseDiskCapacity(capacity, &options));
  }
  if (std::string size = GetEnv("LARDER_DISK_REGION_SIZE"); !size.empty()) {
    LARDER_ASSIGN_OR_RETURN(options.region_size, ParseByteSize(size));
  }
  auto fraction = [](const char* name, double* out) -> Status {
    std::string text = GetEnv(name);
    if (text.empty()) return Status::Ok();
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    if (end != text.c_str() + text.size() || !(value > 0) || value > 1) {
      return InvalidArgumentError(std::string(name) + "='" + text +
                                  "': a fraction of the capacity in (0, 1]");
    }
    *out = value;
    return Status::Ok();
  };
  LARDER_RETURN_IF_ERROR(fraction("LARDER_DISK_HIGH_WATERMARK", &options.high_watermark));
  LARDER_RETURN_IF_ERROR(fraction("LARDER_DISK_LOW_WATERMARK", &options.low_watermark));
  if (std::string depth = GetEnv("LARDER_DISK_QUEUE_DEPTH"); !depth.empty()) {
    char* end = nullptr;
    const unsigned long value = std::strtoul(depth.c_str(), &end, 10);
    if (end != depth.c_str() + depth.size() || value == 0 || value > 4096) {
      return InvalidArgumentError("LARDER_DISK_QUEUE_DEPTH='" + depth + "': 1 to 4096");
    }
    options.queue_depth = static_cast<unsigned>(value);
  }
  if (std::string direct = GetEnv("LARDER_DISK_DIRECT_IO"); !direct.empty()) {
    if (direct == "auto") {
      options.direct_io = DirectIo::kAuto;
    } else if (direct == "on" || direct == "1") {
      options.direct_io = DirectIo::kOn;
    } else if (direct == "off" || direct == "0") {
      options.direct_io = DirectIo::kOff;
    } else {
      return InvalidArgumentError("LARDER_DISK_DIRECT_IO='" + direct + "': auto, on or off");
    }
  }
  if (std::string uring = GetEnv("LARDER_DISK_IO_URING"); !uring.empty()) {
    if (uring != "0" && uring != "1") {
      return InvalidArgumentError("LARDER_DISK_IO_URING='" + uring + "': 0 or 1");
    }
    options.io_uring = uring == "1";
  }
  if (std::string delay = GetEnv("LARDER_DISK_TEST_IO_DELAY"); !delay.empty()) {
    LARDER_ASSIGN_OR_RETURN(options.test_io_delay, ParseDuration(delay));
  }
  return options;
}

struct Region {
  uint64_t seq = 0;
  Fd fd;
  uint64_t end = 0;   // the append offset
  uint64_t pins = 0;  // reads and writes using it
};

struct Entry {
  uint64_t region = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t generation = 0;
  uint32_t key_len = 0;
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
  // Writes records (tombstones when `tombstone`); statuses per item.
  std::vector<Status> WriteRecords(std::span<const DiskWrite> items, bool tombstone,
                                   bool refresh = false) LARDER_REQUIRES(write_mu);
  void ReadRound(std::span<const DiskRead> items, std::span<const size_t> which,
                 std::vector<Result<uint64_t>>* results);
};

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
        identity.size() != 32 || size == 0 || size % kBlock != 0) {
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
  const auto file_size = static_cast<uint64_t>(st.st_size);
  AlignedBuffer head(kBlock);
  uint64_t offset = 0;
  while (offset + kBlock <= file_size) {
    IoOp op{region->fd.get(), false, head.data(), kBlock, offset};
    io->Run(std::span(&op, 1));
    if (op.result != static_cast<int64_t>(kBlock)) break;
    auto header = ParseHead(head.data(), kBlock);
    if (!header) break;
    const uint64_t head_bytes = HeadBytes(header->key_len);
    const uint64_t record = head_bytes + AlignUp(header->value_len);
    if (header->value_len > region_size || offset + record > file_size) break;
    AlignedBuffer whole;
    const std::byte* at = head.data();
    if (head_bytes > kBlock) {  // a long key: read its whole head, and check it
      whole = AlignedBuffer(head_bytes);
      IoOp rest{region->fd.get(), false, whole.data(), head_bytes, offset};
      io->Run(std::span(&rest, 1));
      if (rest.result != static_cast<int64_t>(head_bytes)) break;
      header = ParseHead(whole.data(), head_bytes);
      if (!header) break;
      at = whole.data();
    }
    std::string key(reinterpret_cast<const char*>(at + sizeof(Header)), header->key_len);
    if (header->flags & kTombstone) {
      auto it = index.find(key);
      if (it != index.end() && it->second.generation < header->generation) Drop(key);
    } else {
      auto it = index.find(key);
      if (it == index.end() || it->second.generation < header->generation) {
        Place(key, Entry{seq, offset, header->value_len, header->generation, header->key_len});
      }
    }
    next_generation = std::max(next_generation, header->generation + 1);
    offset += record;
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

std::vector<Status> DiskStore::Impl::WriteRecords(std::span<const DiskWrite> items, bool tombstone,
                                                  bool refresh) {
  std::vector<Status> results(items.size());
  // Plan: which items need writing, and where.
  struct Planned {
    size_t item;
    uint64_t region;
    uint64_t offset;
    uint64_t bytes;
    uint64_t generation;
  };
  std::vector<size_t> todo;
  {
    MutexLock lock(mu);
    std::unordered_map<std::string_view, size_t> first;
    // A refresh rewrites the records of the older half of the regions, the next to be reclaimed.
    uint64_t older_than = 0;
    if (refresh && !regions.empty())
      older_than = std::next(regions.begin(), regions.size() / 2)->first;
    for (size_t i = 0; i < items.size(); ++i) {
      const DiskWrite& item = items[i];
      if (item.key.empty() || item.key.size() > kMaxKeyBytes) {
        results[i] = InvalidArgumentError("disk tier: a key of " + std::to_string(item.key.size()) +
                                          " bytes (1 to " + std::to_string(kMaxKeyBytes) + ")");
        continue;
      }
      if (RecordBytes(item.key.size(), item.size) > region_size) {
        results[i] =
            InvalidArgumentError("disk tier: value of key '" + std::string(item.key) + "' has " +
                                 std::to_string(item.size) + " bytes, more than a region (" +
                                 FormatByteSize(region_size) + ") holds");
        continue;
      }
      auto it = index.find(std::string(item.key));
      if (refresh) {
        if (it == index.end() || it->second.size != item.size || it->second.region >= older_than) {
          continue;  // not held as it is, or young enough
        }
      } else if (tombstone ? it == index.end()
                           : (it != index.end() && it->second.size == item.size)) {
        continue;  // already held (or already gone): nothing to write
      }
      if (!first.emplace(item.key, i).second) continue;  // a repeat in this batch
      todo.push_back(i);
    }
  }
  size_t next = 0;
  while (next < todo.size()) {
    // One round: records up to kRoundBytes of bounce memory, placed in the open region or new ones.
    std::vector<Planned> round;
    uint64_t round_bytes = 0;
    uint64_t open_region = 0;
    uint64_t open_end = 0;
    {
      MutexLock lock(mu);
      if (!regions.empty()) {
        open_region = regions.rbegin()->first;
        open_end = regions.rbegin()->second.end;
      }
    }
    // How many new regions the round needs, before any is created (reclaim runs first).
    size_t count = 0;
    uint64_t need_regions = 0;
    {
      uint64_t end = open_region == 0 ? region_size : open_end;
      for (size_t k = next; k < todo.size(); ++k) {
        const DiskWrite& item = items[todo[k]];
        const uint64_t bytes =
            tombstone ? HeadBytes(item.key.size()) : RecordBytes(item.key.size(), item.size);
        if (count > 0 && round_bytes + bytes > kRoundBytes) break;
        if (end + bytes > region_size) {
          ++need_regions;
          end = 0;
        }
        end += bytes;
        round_bytes += bytes;
        ++count;
      }
    }
    if (need_regions > 0) Reclaim(need_regions);
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
    // Place the round's records; those that do not fit fail with no_room.
    {
      MutexLock lock(mu);
      size_t next_fresh = 0;
      uint64_t region = open_region;
      for (size_t k = next; k < next + count; ++k) {
        const size_t i = todo[k];
        const DiskWrite& item = items[i];
        const uint64_t bytes =
            tombstone ? HeadBytes(item.key.size()) : RecordBytes(item.key.size(), item.size);
        auto at = regions.find(region);
        if (at == regions.end() || at->second.end + bytes > region_size) {
          if (next_fresh >= fresh.size()) {
            results[i] = no_room.ok() ? ResourceExhaustedError("disk tier: no region") : no_room;
            ++counters.write_failures;
            continue;
          }
          region = fresh[next_fresh++];
          at = regions.find(region);
        }
        round.push_back(Planned{i, region, at->second.end, bytes, next_generation++});
        at->second.end += bytes;
        ++at->second.pins;
      }
    }
    next += count;
    // Build the records and write them.
    std::vector<AlignedBuffer> buffers;
    std::vector<IoOp> ops;
    buffers.reserve(round.size());
    ops.reserve(round.size());
    std::vector<int> fds;
    {
      MutexLock lock(mu);
      for (const Planned& p : round) fds.push_back(regions.at(p.region).fd.get());
    }
    for (size_t j = 0; j < round.size(); ++j) {
      const Planned& p = round[j];
      const DiskWrite& item = items[p.item];
      AlignedBuffer buffer(p.bytes);
      const uint64_t head = HeadBytes(item.key.size());
      const uint64_t value_len = tombstone ? 0 : item.size;
      const uint64_t hash = XXH3_64bits(item.data, value_len);
      FillHead(buffer.data(), item.key, value_len, p.generation, hash, tombstone ? kTombstone : 0);
      if (value_len > 0) {
        std::memcpy(buffer.data() + head, item.data, value_len);
        std::memset(buffer.data() + head + value_len, 0, p.bytes - head - value_len);
      }
      ops.push_back(IoOp{fds[j], true, buffer.data(), p.bytes, p.offset});
      buffers.push_back(std::move(buffer));
    }
    if (options.test_io_delay.count() > 0) std::this_thread::sleep_for(options.test_io_delay);
    io->Run(ops);
    // Durable before any key enters the index.
    std::map<int, Status> synced;
    for (size_t j = 0; j < round.size(); ++j) synced.emplace(fds[j], Status::Ok());
    for (auto& [fd, status] : synced) {
      if (fdatasync(fd) != 0) status = ErrnoToStatus(errno, "fdatasync");
      if (!direct) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    }
    MutexLock lock(mu);
    for (size_t j = 0; j < round.size(); ++j) {
      const Planned& p = round[j];
      const DiskWrite& item = items[p.item];
      Status status = synced[fds[j]];
      if (status.ok() && ops[j].result != static_cast<int64_t>(p.bytes)) {
        status = ops[j].result < 0 ? ErrnoToStatus(static_cast<int>(-ops[j].result), "disk write")
                                   : DataLossError("disk tier: a short write");
      }
      if (!status.ok()) {
        results[p.item] = status.WithContext("writing key '" + std::string(item.key) + "'");
        ++counters.write_failures;
      } else if (tombstone) {
        Drop(std::string(item.key));
      } else {
        Place(std::string(item.key), Entry{p.region, p.offset, item.size, p.generation,
                                           static_cast<uint32_t>(item.key.size())});
        ++counters.writes;
        counters.write_bytes += item.size;
      }
      --regions.at(p.region).pins;
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

void DiskStore::Impl::ReadRound(std::span<const DiskRead> items, std::span<const size_t> which,
                                std::vector<Result<uint64_t>>* results) {
  struct Job {
    size_t item;
    Entry entry;
    int fd;
    AlignedBuffer head;
    AlignedBuffer bounce;  // empty: the value is read straight into the caller's buffer
    int64_t head_result = 0;
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
      Region& region = regions.at(entry.region);
      ++region.pins;
      jobs.push_back(Job{i, entry, region.fd.get(), {}, {}, 0});
    }
  }
  std::vector<IoOp> ops;
  ops.reserve(2 * jobs.size());
  std::vector<size_t> job_of;  // per op
  job_of.reserve(2 * jobs.size());
  std::vector<uint8_t> pending(jobs.size(), 0);  // per job: its ops not ended yet
  std::vector<size_t> value_op(jobs.size(), SIZE_MAX);
  for (size_t j = 0; j < jobs.size(); ++j) {
    Job& job = jobs[j];
    const uint64_t head = HeadBytes(job.entry.key_len);
    const uint64_t value = AlignUp(job.entry.size);
    void* dst = items[job.item].dst;
    const bool straight =
        reinterpret_cast<uintptr_t>(dst) % kBlock == 0 && items[job.item].capacity >= value;
    if (!straight && value > 0) job.bounce = AlignedBuffer(value);
    job.head = AlignedBuffer(head);
    ops.push_back(IoOp{job.fd, false, job.head.data(), head, job.entry.offset});
    job_of.push_back(j);
    ++pending[j];
    if (value > 0) {
      value_op[j] = ops.size();
      ops.push_back(
          IoOp{job.fd, false, straight ? dst : job.bounce.data(), value, job.entry.offset + head});
      job_of.push_back(j);
      ++pending[j];
    }
  }
  std::vector<std::pair<std::string, uint64_t>> bad;  // key, generation
  // Each record is checked as soon as its reads end, while the others' are still in flight.
  auto check = [&](size_t j) {
    Job& job = jobs[j];
    const DiskRead& item = items[job.item];
    const uint64_t head = HeadBytes(job.entry.key_len);
    bool ok = true;
    const std::byte* bytes = nullptr;
    if (value_op[j] != SIZE_MAX) {
      const IoOp& value = ops[value_op[j]];
      ok = value.result == static_cast<int64_t>(AlignUp(job.entry.size));
      bytes = static_cast<const std::byte*>(value.buffer);
    }
    ok = ok && job.head_result == static_cast<int64_t>(head);
    std::optional<Header> header;
    if (ok) header = ParseHead(job.head.data(), head);
    ok = ok && header && !(header->flags & kTombstone) && header->key_len == item.key.size() &&
         std::memcmp(job.head.data() + sizeof(Header), item.key.data(), item.key.size()) == 0 &&
         header->value_len == job.entry.size && header->generation == job.entry.generation &&
         XXH3_64bits(bytes, job.entry.size) == header->value_hash;
    if (!ok) {
      (*results)[job.item] = NotFoundError("key '" + std::string(item.key) +
                                           "': its disk record failed its checks and was dropped");
      bad.emplace_back(std::string(item.key), job.entry.generation);
      return;
    }
    if (job.bounce.data() != nullptr) std::memcpy(item.dst, job.bounce.data(), job.entry.size);
    (*results)[job.item] = job.entry.size;
  };
  if (options.test_io_delay.count() > 0) std::this_thread::sleep_for(options.test_io_delay);
  io->Run(ops, [&](size_t op) {
    const size_t j = job_of[op];
    if (op != value_op[j]) jobs[j].head_result = ops[op].result;
    if (--pending[j] == 0) check(j);
  });
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
    if (result.ok()) {
      ++counters.reads;
      counters.read_bytes += *result;
    }
  }
  unpinned.SignalAll();
}

DiskStore::DiskStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DiskStore::~DiskStore() = default;

Result<std::unique_ptr<DiskStore>> DiskStore::Open(DiskOptions options) {
  if (options.path.empty()) return InvalidArgumentError("disk tier: no directory given");
  if (options.region_size != 0 &&
      (options.region_size < 1ull << 20 || options.region_size % kBlock != 0)) {
    return InvalidArgumentError("disk tier: the region size must be at least 1 MiB, in 4 KiB");
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
    // Automatic: a 64th of the capacity, from 1 MiB to 64 MiB, so that reclaiming one region
    // moves usage by little however small the disk.
    impl->options.region_size =
        std::clamp<uint64_t>(impl->capacity / 64 & ~((1ull << 20) - 1), 1ull << 20, 64ull << 20);
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

std::vector<Status> DiskStore::Refresh(std::span<const DiskWrite> items) {
  MutexLock lock(impl_->write_mu);
  return impl_->WriteRecords(items, false, true);
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
