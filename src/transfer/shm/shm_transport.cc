// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/shm/shm_transport.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <map>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "common/memory.h"
#include "common/mutex.h"
#include "transfer/copy_executor.h"
#include "transfer/shm/shm_handoff.h"
#include "transfer/transport_registry.h"

namespace larder::transfer {
namespace {

constexpr auto kOpenTimeout = std::chrono::seconds(5);
// Writes of at least this many bytes populate their range (MADV_POPULATE_WRITE) before copying:
// one call builds the page tables of the range, which is 2-3x faster than faulting page by page
// (measured on 4 MiB writes into a fresh mapping). Reads fault: read faults map pages around
// the one touched that the owner already has, and a populate would not be faster. Neither ever
// allocates beyond the copied range.
constexpr uint64_t kPopulateWriteBytes = 64 * 1024;

// What the transport's mappings hold, shared with the mappings so that they can outlive it.
struct MappingTotals {
  std::atomic<uint64_t> segments{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> dropped{0};
};

// A peer's memfd mapped into this process. Unmapped when the last user goes away.
struct Mapping {
  uint8_t* base = nullptr;
  uint64_t size = 0;
  uint64_t page_size = 4096;
  std::shared_ptr<MappingTotals> totals;
  ~Mapping() {
    if (base == nullptr) return;
    munmap(base, size);
    totals->segments.fetch_sub(1);
    totals->bytes.fetch_sub(size);
  }
};

// Faults in [begin, begin + length) of `mapping` for writing, in one call.
void PopulateForWrite(const Mapping& mapping, uint64_t begin, uint64_t length) {
  static std::atomic<bool> unsupported{false};
  if (length < kPopulateWriteBytes || unsupported.load(std::memory_order_relaxed)) return;
  const uint64_t page = mapping.page_size;
  uint64_t first = begin & ~(page - 1);
  uint64_t end = std::min(mapping.size, (begin + length + page - 1) & ~(page - 1));
#ifndef MADV_POPULATE_WRITE
  constexpr int MADV_POPULATE_WRITE = 23;
#endif
  if (madvise(mapping.base + first, end - first, MADV_POPULATE_WRITE) != 0 && errno == EINVAL) {
    unsupported.store(true, std::memory_order_relaxed);  // kernel older than 5.14: just fault
  }
}

class ShmSegment final : public RemoteSegment {
 public:
  ShmSegment(SegmentDescriptor descriptor, std::shared_ptr<Mapping> mapping)
      : RemoteSegment(std::move(descriptor)), mapping_(std::move(mapping)) {}

  // The mapping, or null once its owner exited.
  std::shared_ptr<Mapping> mapping() const {
    MutexLock lock(mu_);
    return mapping_;
  }
  void Close() override { Drop(); }
  // Lets the mapping go (unmapped once no copy uses it); later copies fail with Unavailable.
  void Drop() {
    MutexLock lock(mu_);
    mapping_.reset();
  }

 private:
  mutable Mutex mu_;
  std::shared_ptr<Mapping> mapping_ LARDER_GUARDED_BY(mu_);
};

class ShmTransport final : public Transport {
 public:
  ~ShmTransport() override { Stop(); }

  std::string_view name() const override { return "shm"; }
  TransportCaps caps() const override {
    return {.allocates_exportable_memory = true, .allocation_rank = 1};
  }

  Status Start(const EngineContext& context) override {
    context_ = context;
    socket_name_ = "larder-shm/" + context.engine_id;
    wake_ = Fd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!wake_.valid()) return ErrnoToStatus(errno, "eventfd");
    server_ = std::make_unique<ShmHandoffServer>(context, context.options->shm_allowed_uids);
    LARDER_RETURN_IF_ERROR(server_->Start(socket_name_));
    watcher_ = std::thread([this] { WatchOwners(); });
    return Status();
  }

  void Stop() override {
    if (server_) server_->Stop();
    if (watcher_.joinable()) {
      stopping_.store(true);
      Wake();
      watcher_.join();
    }
  }

  Result<std::shared_ptr<MemoryRegion>> Allocate(size_t size, HugePages huge_pages) override {
    return AllocateMemfd("larder-segment", size, huge_pages);
  }

  // The blob is the handoff socket's name; only memfds can be handed over.
  Result<std::string> Export(const SegmentDescriptor& descriptor, uint8_t* base) override {
    (void)base;
    return descriptor.memory_kind == MemoryKind::kMemfd ? socket_name_ : std::string();
  }

  void AddStats(EngineStats* stats) const override {
    stats->mapped_segments += totals_->segments.load();
    stats->mapped_bytes += totals_->bytes.load();
    stats->mappings_dropped += totals_->dropped.load();
  }

  bool CanReach(const SegmentDescriptor& d) const override {
    const std::string* socket = d.TransportBlob("shm");
    return d.host_id == context_.host_id && d.memory_kind == MemoryKind::kMemfd &&
           socket != nullptr && !socket->empty();
  }

  Result<std::shared_ptr<RemoteSegment>> Open(const SegmentDescriptor& descriptor) override;

  void Submit(RemoteSegment& segment, std::span<Slice* const> slices,
              SliceCallback* done) override {
    std::shared_ptr<Mapping> mapping = static_cast<ShmSegment&>(segment).mapping();
    if (!mapping) {
      Status gone = UnavailableError("segment '" + segment.descriptor().name + "' of engine " +
                                     segment.descriptor().engine_id +
                                     " is no longer mapped (its owner exited, or it was closed)");
      for (Slice* s : slices) done->OnSliceDone(s, gone);
      return;
    }
    ExecuteCopies(context_.copy_pool, context_.options->inline_copy_bytes, slices, done,
                  [mapping](Slice* s, uint64_t begin, uint64_t length) -> Status {
                    // The engine checked the range against the descriptor and the mapping is at
                    // least that large; this only guards against internal mistakes.
                    if (s->offset > mapping->size || s->length > mapping->size - s->offset) {
                      return OutOfRangeError("slice outside the mapped segment");
                    }
                    if (s->op == TransferOp::kWrite) {
                      PopulateForWrite(*mapping, s->offset + begin, length);
                    }
                    CopySliceRange(*s, mapping->base, begin, length);
                    return Status();
                  });
  }

 private:
  // An owner process whose segments we map, watched through a pidfd.
  struct Owner {
    Fd pidfd;
    pid_t pid = 0;
    std::vector<std::weak_ptr<ShmSegment>> segments;
  };

  void Wake() {
    uint64_t one = 1;
    if (write(wake_.get(), &one, sizeof(one)) < 0) {
      // The counter only saturates; the watcher wakes either way.
    }
  }

  // Remembers that `segment` maps memory of `engine_id`, served by process `pid`, so that the
  // mapping goes when that process does.
  void Watch(const std::string& engine_id, pid_t pid, const std::shared_ptr<ShmSegment>& segment);
  void WatchOwners();
  void OwnerExited(const std::string& engine_id);

  EngineContext context_;
  std::string socket_name_;
  std::unique_ptr<ShmHandoffServer> server_;
  std::shared_ptr<MappingTotals> totals_ = std::make_shared<MappingTotals>();
  Mutex mu_;
  std::map<std::string, std::weak_ptr<Mapping>> mappings_ LARDER_GUARDED_BY(mu_);
  std::map<std::string, Owner> owners_ LARDER_GUARDED_BY(mu_);  // by engine id
  Fd wake_;
  std::atomic<bool> stopping_{false};
  std::thread watcher_;
};

Result<std::shared_ptr<RemoteSegment>> ShmTransport::Open(const SegmentDescriptor& descriptor) {
  if (!CanReach(descriptor)) {
    return FailedPreconditionError("segment '" + descriptor.name + "' of engine " +
                                   descriptor.engine_id +
                                   " is not a shareable segment on this host");
  }
  std::string key = descriptor.engine_id + "/" + std::to_string(descriptor.segment_id) + "/" +
                    std::to_string(descriptor.epoch);
  {
    MutexLock lock(mu_);
    if (auto it = mappings_.find(key); it != mappings_.end()) {
      if (auto mapping = it->second.lock()) {
        auto segment = std::make_shared<ShmSegment>(descriptor, std::move(mapping));
        if (auto owner = owners_.find(descriptor.engine_id); owner != owners_.end()) {
          owner->second.segments.push_back(segment);
        }
        return std::shared_ptr<RemoteSegment>(std::move(segment));
      }
    }
  }
  // The handoff and the mapping are O(1) in the segment's size: nothing is populated here
  // unless shm_prefault asks for it, so opening a 1 TiB segment costs what a 1 GiB one does.
  uint64_t size = 0;
  pid_t owner_pid = 0;
  LARDER_ASSIGN_OR_RETURN(Fd fd, RequestSegmentFd(descriptor, context_, Clock::now() + kOpenTimeout,
                                                  &size, &owner_pid));
  struct stat st {};
  if (fstat(fd.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) < descriptor.size ||
      size < descriptor.size) {
    return DataLossError("memfd of segment '" + descriptor.name + "' from engine " +
                         descriptor.engine_id + " is smaller than its descriptor says");
  }
  int flags = MAP_SHARED | (context_.options->shm_prefault ? MAP_POPULATE : 0);
  void* base = mmap(nullptr, descriptor.size, PROT_READ | PROT_WRITE, flags, fd.get(), 0);
  if (base == MAP_FAILED) {
    return ErrnoToStatus(
        errno, "mmap segment '" + descriptor.name + "' of engine " + descriptor.engine_id);
  }
  auto mapping = std::make_shared<Mapping>();
  mapping->base = static_cast<uint8_t*>(base);
  mapping->size = descriptor.size;
  mapping->page_size = std::max<uint64_t>(descriptor.page_size, 4096);
  mapping->totals = totals_;
  totals_->segments.fetch_add(1);
  totals_->bytes.fetch_add(descriptor.size);
  auto segment = std::make_shared<ShmSegment>(descriptor, mapping);
  {
    MutexLock lock(mu_);
    mappings_[key] = mapping;
  }
  Watch(descriptor.engine_id, owner_pid, segment);
  return std::shared_ptr<RemoteSegment>(std::move(segment));
}

void ShmTransport::Watch(const std::string& engine_id, pid_t pid,
                         const std::shared_ptr<ShmSegment>& segment) {
  MutexLock lock(mu_);
  auto it = owners_.find(engine_id);
  if (it == owners_.end()) {
    if (pid <= 0) return;  // not visible in our pid namespace: the master's reports drop it
    Owner owner;
    owner.pid = pid;
    owner.pidfd = Fd(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
    if (!owner.pidfd.valid()) {
      // ESRCH: it exited between the handoff and now; the mapping is dropped at once below.
      if (errno != ESRCH) return;
    }
    it = owners_.emplace(engine_id, std::move(owner)).first;
  }
  std::erase_if(it->second.segments, [](const auto& weak) { return weak.expired(); });
  it->second.segments.push_back(segment);
  Wake();
}

void ShmTransport::WatchOwners() {
  std::vector<pollfd> fds;
  std::vector<std::string> ids;
  while (!stopping_.load()) {
    fds.assign(1, pollfd{wake_.get(), POLLIN, 0});
    ids.assign(1, "");
    std::vector<std::string> gone;
    {
      MutexLock lock(mu_);
      for (auto& [id, owner] : owners_) {
        if (!owner.pidfd.valid()) {
          gone.push_back(id);
          continue;
        }
        fds.push_back(pollfd{owner.pidfd.get(), POLLIN, 0});
        ids.push_back(id);
      }
    }
    for (const std::string& id : gone) OwnerExited(id);
    if (poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) return;
    if (fds[0].revents != 0) {
      uint64_t count = 0;
      if (read(wake_.get(), &count, sizeof(count)) < 0) {
        // EAGAIN: another wake-up already drained it.
      }
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) OwnerExited(ids[i]);
    }
  }
}

void ShmTransport::OwnerExited(const std::string& engine_id) {
  std::vector<std::weak_ptr<ShmSegment>> segments;
  pid_t pid = 0;
  {
    MutexLock lock(mu_);
    auto it = owners_.find(engine_id);
    if (it == owners_.end()) return;
    segments = std::move(it->second.segments);
    pid = it->second.pid;
    owners_.erase(it);
    std::erase_if(mappings_,
                  [&](const auto& entry) { return entry.first.starts_with(engine_id + "/"); });
  }
  size_t dropped = 0;
  for (const auto& weak : segments) {
    if (auto segment = weak.lock()) {
      // Counted before the mapping can go, so that whoever sees mapped_segments fall also sees
      // mappings_dropped rise.
      totals_->dropped.fetch_add(1);
      segment->Drop();
      ++dropped;
    }
  }
  Log().info("engine {} (pid {}) exited: dropped {} mapping(s) of its segments", engine_id, pid,
             dropped);
}

}  // namespace

std::unique_ptr<Transport> CreateShmTransport() { return std::make_unique<ShmTransport>(); }

LARDER_REGISTER_TRANSPORT(shm, 10, true,
                          [](const TransportSelection&) { return CreateShmTransport(); });

}  // namespace larder::transfer
