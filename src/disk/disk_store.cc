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
#include <numeric>
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

constexpr uint32_t kMagic = 0x3252444c;  // "LDR2"
constexpr uint16_t kFormat = 2;
constexpr uint16_t kTombstone = 1;
constexpr uint32_t kMaxKeyBytes = 64 * 1024;
// The reads a record's count keeps (two bits of frequency): a record read that often since written
// survives that many reclaims of its region without another read.
constexpr uint8_t kMaxUses = 3;
// The bounce memory one batch round may take: larger batches go in rounds.
constexpr uint64_t kRoundBytes = 64ull << 20;

// A batch's summary starts with this, and then has one RecordHeader and its key per record.
struct BatchHeader {
  uint32_t magic;
  uint16_t format;
  uint16_t reserved16;
  uint32_t count;  // records
  uint32_t reserved32;
  uint64_t summary_bytes;  // this header, the record headers and keys, before padding
  uint64_t values_bytes;   // the values after the padded summary, each padded
  uint64_t summary_hash;   // XXH3 of the summary, this field zero
  uint8_t zero[24];
};
static_assert(sizeof(BatchHeader) == 64);

struct RecordHeader {
  uint32_t key_len;
  uint16_t flags;
  uint16_t reserved;
  uint64_t value_len;
  uint64_t generation;
  uint64_t value_hash;
};
static_assert(sizeof(RecordHeader) == 32);

// What a record adds to its batch's summary.
uint64_t SummaryBytes(uint64_t key_len) { return sizeof(RecordHeader) + key_len; }
// The space a batch of one record takes: the most any record may need.
uint64_t LoneRecordBytes(uint64_t key_len, uint64_t value_len) {
  return AlignUp(sizeof(BatchHeader) + SummaryBytes(key_len)) + AlignUp(value_len);
}

uint64_t SummaryHash(const std::byte* summary, uint64_t bytes) {
  BatchHeader header;
  std::memcpy(&header, summary, sizeof(header));
  header.summary_hash = 0;
  return XXH3_64bits_withSeed(summary + sizeof(header), bytes - sizeof(header),
                              XXH3_64bits(&header, sizeof(header)));
}

struct ParsedRecord {
  std::string key;
  RecordHeader header;
  uint64_t value_offset;  // from the batch's start
};

// The records of the batch summary at `summary` (`bytes` read), when it is whole and consistent:
// its hash, every length, and values that fit in `room` bytes from the batch's start. nullopt
// otherwise; a summary longer than `bytes` sets *need to its padded length (read that much).
std::optional<std::vector<ParsedRecord>> ParseSummary(const std::byte* summary, uint64_t bytes,
                                                      uint64_t room, uint64_t* need) {
  BatchHeader header;
  if (bytes < sizeof(header)) return std::nullopt;
  std::memcpy(&header, summary, sizeof(header));
  if (header.magic != kMagic || header.format != kFormat || header.count == 0 ||
      header.summary_bytes < sizeof(header) + header.count * SummaryBytes(1) ||
      header.summary_bytes > room || header.values_bytes > room ||
      AlignUp(header.summary_bytes) + header.values_bytes > room) {
    return std::nullopt;
  }
  if (header.summary_bytes > bytes) {
    *need = AlignUp(header.summary_bytes);
    return std::nullopt;
  }
  if (SummaryHash(summary, header.summary_bytes) != header.summary_hash) return std::nullopt;
  std::vector<ParsedRecord> records;
  records.reserve(header.count);
  uint64_t at = sizeof(header);
  uint64_t value_at = AlignUp(header.summary_bytes);
  for (uint32_t i = 0; i < header.count; ++i) {
    ParsedRecord record;
    if (at + sizeof(RecordHeader) > header.summary_bytes) return std::nullopt;
    std::memcpy(&record.header, summary + at, sizeof(RecordHeader));
    at += sizeof(RecordHeader);
    const RecordHeader& r = record.header;
    if (r.key_len == 0 || r.key_len > kMaxKeyBytes || at + r.key_len > header.summary_bytes ||
        (r.flags & ~kTombstone) != 0 || ((r.flags & kTombstone) && r.value_len != 0) ||
        r.value_len > room) {
      return std::nullopt;
    }
    record.key.assign(reinterpret_cast<const char*>(summary + at), r.key_len);
    at += r.key_len;
    record.value_offset = value_at;
    value_at += AlignUp(r.value_len);
    records.push_back(std::move(record));
  }
  if (at != header.summary_bytes ||
      value_at != AlignUp(header.summary_bytes) + header.values_bytes) {
    return std::nullopt;
  }
  return records;
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
  if (std::string budget = GetEnv("LARDER_DISK_WRITE_BUDGET"); !budget.empty()) {
    auto bytes = ParseByteSize(budget);
    if (!bytes.ok()) {
      return InvalidArgumentError("LARDER_DISK_WRITE_BUDGET='" + budget +
                                  "': bytes per second, e.g. 200M (0: no limit)");
    }
    options.write_budget = *bytes;
  }
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
