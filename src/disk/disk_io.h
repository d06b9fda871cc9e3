// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Batched file I/O for the disk tier: io_uring (liburing) when the kernel allows it, pread/pwrite
// otherwise. A batch is a list of operations; Run keeps up to the queue depth of them in flight and
// returns when every one has ended. Not part of the public API.
//
// Thread safety: a DiskIo may be used by several threads at once; each Run takes a ring of its own
// from a pool (rings are not shared between concurrent batches).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "common/mutex.h"
#include "larder/status.h"

namespace larder::disk {

// The alignment O_DIRECT asks of buffers, offsets and lengths, and the unit of every record.
inline constexpr uint64_t kBlock = 4096;

inline constexpr uint64_t AlignUp(uint64_t n) { return (n + kBlock - 1) & ~(kBlock - 1); }

// One read or write of `length` bytes at `offset` of `fd`. `result` is the number of bytes moved,
// or -errno. A short transfer is continued until the whole length moved or the file ended.
struct IoOp {
  int fd = -1;
  bool write = false;
  void* buffer = nullptr;
  uint64_t length = 0;
  uint64_t offset = 0;
  int64_t result = 0;
};

// Memory aligned to kBlock, freed with the object.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(uint64_t size);
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  ~AlignedBuffer();

  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
};

class DiskIo {
 public:
  // use_uring false: pread/pwrite. With true, a kernel that refuses io_uring (an old one, or a
  // seccomp policy) makes Create fall back to pread/pwrite; uring() says which runs.
  static std::unique_ptr<DiskIo> Create(unsigned queue_depth, bool use_uring);
  ~DiskIo();

  bool uring() const { return uring_; }
  unsigned queue_depth() const { return queue_depth_; }

  // Told the index of each operation as it ends (its result set), on the calling thread while
  // the others stay in flight: work on finished data overlaps the I/O still going on.
  using OpDone = std::function<void(size_t index)>;

  // Runs every operation of `ops` (at most queue_depth in flight) and fills their results.
  void Run(std::span<IoOp> ops, const OpDone& done = {});

 private:
  struct Ring;
  DiskIo(unsigned queue_depth, bool uring);
  std::unique_ptr<Ring> TakeRing();
  void GiveRing(std::unique_ptr<Ring> ring);
  void RunSync(std::span<IoOp> ops, const OpDone& done);
  void RunRing(Ring* ring, std::span<IoOp> ops, const OpDone& done);

  const unsigned queue_depth_;
  bool uring_;
  Mutex mu_;
  std::vector<std::unique_ptr<Ring>> rings_ LARDER_GUARDED_BY(mu_);
};

}  // namespace larder::disk
