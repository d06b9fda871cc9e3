// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "disk/disk_io.h"

#include <liburing.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <new>
#include <utility>

#include "common/logging.h"

namespace larder::disk {

AlignedBuffer::AlignedBuffer(uint64_t size) : size_(AlignUp(size)) {
  if (size_ == 0) return;
  data_ = static_cast<std::byte*>(std::aligned_alloc(kBlock, size_));
  if (data_ == nullptr) throw std::bad_alloc();
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

struct DiskIo::Ring {
  io_uring ring{};
  ~Ring() { io_uring_queue_exit(&ring); }
};

std::unique_ptr<DiskIo> DiskIo::Create(unsigned queue_depth, bool use_uring) {
  if (queue_depth == 0) queue_depth = 1;
  std::unique_ptr<DiskIo> io(new DiskIo(queue_depth, use_uring));
  if (use_uring) {
    // A first ring proves that the kernel lets this process use io_uring.
    auto ring = std::make_unique<Ring>();
    const int err = io_uring_queue_init(queue_depth, &ring->ring, 0);
    if (err < 0) {
      ring.release();  // nothing to exit
      Log().warn("disk tier: io_uring is not available ({}); using pread/pwrite",
                 ErrnoToStatus(-err, "io_uring_queue_init").message());
      io->uring_ = false;
    } else {
      io->GiveRing(std::move(ring));
    }
  }
  return io;
}

DiskIo::DiskIo(unsigned queue_depth, bool uring) : queue_depth_(queue_depth), uring_(uring) {}

DiskIo::~DiskIo() = default;

std::unique_ptr<DiskIo::Ring> DiskIo::TakeRing() {
  {
    MutexLock lock(mu_);
    if (!rings_.empty()) {
      std::unique_ptr<Ring> ring = std::move(rings_.back());
      rings_.pop_back();
      return ring;
    }
  }
  auto ring = std::make_unique<Ring>();
  if (io_uring_queue_init(queue_depth_, &ring->ring, 0) < 0) {
    ring.release();
    return nullptr;
  }
  return ring;
}

void DiskIo::GiveRing(std::unique_ptr<Ring> ring) {
  MutexLock lock(mu_);
  rings_.push_back(std::move(ring));
}

void DiskIo::Run(std::span<IoOp> ops, const OpDone& done) {
  if (ops.empty()) return;
  if (uring_) {
    if (std::unique_ptr<Ring> ring = TakeRing()) {
      RunRing(ring.get(), ops, done);
      GiveRing(std::move(ring));
      return;
    }
  }
  RunSync(ops, done);
}

void DiskIo::RunSync(std::span<IoOp> ops, const OpDone& on_done) {
  for (size_t i = 0; i < ops.size(); ++i) {
    IoOp& op = ops[i];
    uint64_t done = 0;
    while (done < op.length) {
      auto* at = static_cast<char*>(op.buffer) + done;
      const ssize_t n =
          op.write ? pwrite(op.fd, at, op.length - done, static_cast<off_t>(op.offset + done))
                   : pread(op.fd, at, op.length - done, static_cast<off_t>(op.offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        op.result = -errno;
        break;
      }
      if (n == 0) break;  // end of file
      done += static_cast<uint64_t>(n);
    }
    if (op.result >= 0) op.result = static_cast<int64_t>(done);
    if (on_done) on_done(i);
  }
}

void DiskIo::RunRing(Ring* ring, std::span<IoOp> ops, const OpDone& on_done) {
  // done[i]: bytes of ops[i] moved so far; an op is resubmitted for its rest after a short
  // transfer, and ends at an error, at the end of the file, or when all of it moved.
  std::vector<uint64_t> done(ops.size(), 0);
  std::vector<size_t> ready;  // ops to submit (again)
  ready.reserve(ops.size());
  for (size_t i = ops.size(); i-- > 0;) {
    ops[i].result = 0;
    if (ops[i].length > 0) ready.push_back(i);
  }
  size_t inflight = 0;
  std::vector<size_t> finished;  // ended since the last submission: told once the next ones went
  while (!ready.empty() || inflight > 0 || !finished.empty()) {
    while (!ready.empty() && inflight < queue_depth_) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring->ring);
      if (sqe == nullptr) break;
      const size_t i = ready.back();
      ready.pop_back();
      IoOp& op = ops[i];
      auto* at = static_cast<char*>(op.buffer) + done[i];
      const auto length = static_cast<unsigned>(std::min<uint64_t>(op.length - done[i], 1u << 30));
      if (op.write) {
        io_uring_prep_write(sqe, op.fd, at, length, op.offset + done[i]);
      } else {
        io_uring_prep_read(sqe, op.fd, at, length, op.offset + done[i]);
      }
      io_uring_sqe_set_data64(sqe, i);
      ++inflight;
    }
    if (!finished.empty()) {
      if (io_uring_sq_ready(&ring->ring) > 0) io_uring_submit(&ring->ring);
      for (size_t i : finished) on_done(i);
      finished.clear();
      if (ready.empty() && inflight == 0) break;
    }
    int err = io_uring_submit_and_wait(&ring->ring, 1);
    if (err < 0 && err != -EINTR) {
      // The ring itself failed: finish what is left synchronously.
      Log().warn("disk tier: io_uring_submit: {}", ErrnoToStatus(-err, "submit").message());
      io_uring_cqe* cqe;
      while (inflight > 0 && io_uring_wait_cqe(&ring->ring, &cqe) == 0) {
        io_uring_cqe_seen(&ring->ring, cqe);
        --inflight;
      }
      for (size_t i = 0; i < ops.size(); ++i) {
        if (ops[i].result == 0 && done[i] < ops[i].length) {
          IoOp rest = ops[i];
          rest.buffer = static_cast<char*>(rest.buffer) + done[i];
          rest.offset += done[i];
          rest.length -= done[i];
          RunSync(std::span(&rest, 1), {});
          ops[i].result =
              rest.result < 0 ? rest.result : static_cast<int64_t>(done[i]) + rest.result;
          done[i] = ops[i].length;
          if (on_done) on_done(i);
        }
      }
      return;
    }
    io_uring_cqe* cqe;
    unsigned head;
    unsigned seen = 0;
    io_uring_for_each_cqe(&ring->ring, head, cqe) {
      ++seen;
      --inflight;
      const auto i = static_cast<size_t>(io_uring_cqe_get_data64(cqe));
      const int res = cqe->res;
      if (res == -EINTR || res == -EAGAIN) {
        ready.push_back(i);
        continue;
      }
      if (res < 0) {
        ops[i].result = res;
      } else if (res == 0) {
        ops[i].result = static_cast<int64_t>(done[i]);  // end of file
      } else {
        done[i] += static_cast<uint64_t>(res);
        if (done[i] < ops[i].length) {
          ready.push_back(i);
          continue;
        }
        ops[i].result = static_cast<int64_t>(done[i]);
      }
      if (on_done) finished.push_back(i);
    }
    io_uring_cq_advance(&ring->ring, seen);
  }
}

}  // namespace larder::disk
