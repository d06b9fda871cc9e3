// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/tcp/tcp_client.h"

#include <sys/socket.h>

#include <algorithm>

#include "common/logging.h"
#include "common/priority.h"
#include "transfer/wire/frame.h"

namespace larder::transfer::tcp {

using namespace wire;  // NOLINT: the frame protocol is this file's vocabulary

namespace {

constexpr size_t kPipelineDepth = 16;
constexpr uint64_t kPipelineBytes = 32ULL << 20;
constexpr auto kConnectTimeout = std::chrono::seconds(5);
constexpr auto kBackoffBase = std::chrono::milliseconds(100);
constexpr auto kBackoffMax = std::chrono::milliseconds(5000);

Status NotSentInTime(const std::string& peer) {
  return DeadlineExceededError("deadline passed before sending to peer " + peer);
}

}  // namespace

TcpPeer::TcpPeer(HostPort address, std::string engine_id,
                 std::shared_ptr<const TcpClientConfig> config, size_t connections, bool latency)
    : address_(std::move(address)),
      engine_id_(std::move(engine_id)),
      config_(std::move(config)),
      name_(address_.ToString()),
      connections_(std::max<size_t>(1, connections)),
      latency_(latency) {}

TcpPeer::~TcpPeer() { Stop(); }

void TcpPeer::Enqueue(uint64_t segment_id, std::span<Slice* const> slices, SliceCallback* done) {
  {
    MutexLock lock(mu_);
    if (!stopping_) {
      for (Slice* s : slices) {
        // Earliest deadline first. Batches mostly arrive in deadline order, so this rarely moves.
        auto at = queue_.end();
        while (at != queue_.begin() && std::prev(at)->slice->deadline > s->deadline) --at;
        queue_.insert(at, {s, segment_id, done});
      }
      while (workers_.size() < connections_) workers_.emplace_back([this] { Worker(); });
      cv_.SignalAll();
      return;
    }
  }
  for (Slice* s : slices) done->OnSliceDone(s, CancelledError("engine is shutting down"));
}

void TcpPeer::Stop() {
  std::vector<std::thread> workers;
  std::deque<Job> orphans;
  {
    MutexLock lock(mu_);
    stopping_ = true;
    workers.swap(workers_);
    orphans.swap(queue_);
  }
  cv_.SignalAll();
  for (auto& j : orphans) j.done->OnSliceDone(j.slice, CancelledError("engine is shutting down"));
  for (auto& t : workers) t.join();
}

Status TcpPeer::CheckBackoff() {
  MutexLock lock(mu_);
  if (failures_ > 0 && Clock::now() < retry_after_) {
    // A refusal (token, TLS, certificate) does not go away by retrying: it keeps its code.
    StatusCode code = last_failure_.code() == StatusCode::kPermissionDenied
                          ? StatusCode::kPermissionDenied
                          : StatusCode::kUnavailable;
    return Status(code, "peer " + name_ + " is backed off after " + std::to_string(failures_) +
                            " failed attempt(s); last: " + last_failure_.ToString());
  }
  return Status();
}

void TcpPeer::RecordFailure(const Status& status) {
  MutexLock lock(mu_);
  ++failures_;
  auto backoff = kBackoffBase * (1 << std::min(failures_ - 1, 6));
  retry_after_ = Clock::now() + std::min<Clock::duration>(backoff, kBackoffMax);
  last_failure_ = status;
  if (failures_ == 1) Log().warn("tcp peer {} failed: {}", name_, status.ToString());
}

void TcpPeer::RecordSuccess() {
  MutexLock lock(mu_);
  failures_ = 0;
}

void TcpPeer::Worker() {
  if (latency_) {
    RaiseThisThreadPriority();
  } else {
    LowerThisThreadPriority(kBulkNice);
  }
  TcpStream conn;
  std::vector<Job> jobs;
  for (;;) {
    jobs.clear();
    {
      MutexLock lock(mu_);
      ++idle_;
      while (!stopping_ && queue_.empty()) cv_.Wait(lock);
      --idle_;
      if (stopping_) return;
      // With other connections idle, an even share of what is queued: the slices of a request
      // spread over the connections (and the peer's threads) instead of queueing behind one.
      const size_t share = std::min(kPipelineDepth, (queue_.size() + idle_) / (idle_ + 1));
      uint64_t bytes = 0;
      bool window_has_read = false;
      while (!queue_.empty() && jobs.size() < share && bytes < kPipelineBytes) {
        // Replies are only read once the whole window is sent. A write behind a read would let
        // the peer block sending the read's reply while we block sending the write's payload, a
        // deadlock as soon as both exceed the socket buffers; such a write waits for the next
        // window. (Reads behind writes are fine: read requests are headers only.)
        bool is_read = queue_.front().slice->op == TransferOp::kRead;
        if (window_has_read && !is_read) break;
        window_has_read |= is_read;
        bytes += queue_.front().slice->length;
        jobs.push_back(queue_.front());
        queue_.pop_front();
      }
    }
    RunJobs(&conn, jobs);
  }
}

void TcpPeer::RunJobs(TcpStream* conn, std::vector<Job>& jobs) {
  auto fail_from = [&](size_t first, const Status& status) {
    for (size_t i = first; i < jobs.size(); ++i) jobs[i].done->OnSliceDone(jobs[i].slice, status);
  };
  if (!conn->valid()) {
    if (Status s = CheckBackoff(); !s.ok()) return fail_from(0, s);
    Deadline deadline = Clock::now() + kConnectTimeout;
    for (const Job& j : jobs) deadline = std::min(deadline, j.slice->deadline);
    auto connected = ConnectAndAuthenticate(address_, *config_, deadline, engine_id_);
    if (!connected.ok()) {
      RecordFailure(connected.status());
      return fail_from(0, connected.status());
    }
    RecordSuccess();
    *conn = std::move(connected).value();
  }
  TcpStream& stream = *conn;
  Deadline now = Clock::now();
  // Send phase: every request of the window goes out before any reply is read.
  std::vector<bool> sent(jobs.size(), false);
  for (size_t i = 0; i < jobs.size(); ++i) {
    Slice* s = jobs[i].slice;
    if (now >= s->deadline) continue;
    FrameHeader h;
    h.type = s->op == TransferOp::kRead ? FrameType::kRead : FrameType::kWrite;
    if (latency_) h.flags = kFlagLatency;
    h.request_id = i;
    h.segment_id = jobs[i].segment_id;
    h.offset = s->offset;
    h.length = s->length;
    Status st =
        SendFrame(stream, h, s->local, s->op == TransferOp::kWrite ? s->length : 0, s->deadline);
    if (!st.ok()) {
      conn->Reset();
      RecordFailure(st);
      // Replies to what was sent can no longer be read; everything in the window fails.
      for (size_t k = 0; k < jobs.size(); ++k) {
        Status fail = (k < i && !sent[k]) ? NotSentInTime(name_) : st;
        jobs[k].done->OnSliceDone(jobs[k].slice, fail);
      }
      return;
    }
    sent[i] = true;
  }
  // Receive phase: replies arrive in request order.
  for (size_t i = 0; i < jobs.size(); ++i) {
    Slice* s = jobs[i].slice;
    if (!sent[i]) {
      jobs[i].done->OnSliceDone(s, NotSentInTime(name_));
      continue;
    }
    FrameHeader h;
    Status st = RecvHeader(stream, &h, s->deadline);
    if (st.ok() && h.request_id != i) {
      st = DataLossError("peer " + name_ + " answered out of order");
    }
    if (st.ok()) {
      switch (h.type) {
        case FrameType::kError: {
          Status reported;
          st = ReadErrorFrame(stream, h, s->deadline, &reported);
          if (st.ok()) {
            // The stream is still in sync after an error frame: only this request failed.
            jobs[i].done->OnSliceDone(s, reported);
            continue;
          }
          break;
        }
        case FrameType::kReadReply:
          if (s->op != TransferOp::kRead || h.length != s->length) {
            st = DataLossError("peer " + name_ + " sent a read reply of the wrong size");
          } else {
            st = stream.RecvAll(s->local, s->length, s->deadline);
          }
          break;
        case FrameType::kWriteReply:
          if (s->op != TransferOp::kWrite || h.length != 0) {
            st = DataLossError("peer " + name_ + " sent an unexpected write reply");
          }
          break;
        default:
          st = DataLossError("peer " + name_ + " sent an unexpected frame");
      }
    }
    if (!st.ok()) {
      // The stream is out of sync (or gone): drop the connection and fail the rest of the window.
      conn->Reset();
      if (st.code() != StatusCode::kDeadlineExceeded) RecordFailure(st);
      for (size_t k = i; k < jobs.size(); ++k) {
        jobs[k].done->OnSliceDone(jobs[k].slice, k == i || sent[k] ? st : NotSentInTime(name_));
      }
      return;
    }
    jobs[i].done->OnSliceDone(s, Status());
  }
}

}  // namespace larder::transfer::tcp
