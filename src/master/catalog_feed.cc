// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/catalog_feed.h"
#include "common/mutex.h"

#include <algorithm>

namespace larder::master {

CatalogFeed::CatalogFeed(size_t shard_count) : shard_count_(shard_count) {}

void CatalogFeed::Log::Push(const LoggedChange& change) {
  if (chunks.empty() || chunks.back()->changes.size() == kChunk) {
    // Both buffers are taken whole at once (keys of 40 bytes on average before a copy).
    auto chunk = std::make_unique<Chunk>();
    chunk->changes.reserve(kChunk);
    chunk->keys.reserve(kChunk * 40);
    chunks.push_back(std::move(chunk));
  }
  Chunk& chunk = *chunks.back();
  chunk.changes.push_back(Stored{change.offset, change.size, change.last_access,
                                 change.soft_pin_until, static_cast<uint32_t>(chunk.keys.size()),
                                 static_cast<uint16_t>(change.key.size()), change.kind,
                                 change.pinned});
  chunk.keys.append(change.key);
  ++next_seq;
}

void CatalogFeed::Log::Clear() {
  chunks.clear();
  first_seq = next_seq;
  front_skip = 0;
}

void CatalogFeed::Log::DropThrough(uint64_t seq) {
  while (!chunks.empty()) {
    const uint64_t in_front = chunks.front()->changes.size();
    if (first_seq + in_front - 1 > seq) {
      if (seq >= first_seq) front_skip = std::max<size_t>(front_skip, seq + 1 - first_seq);
      return;
    }
    chunks.pop_front();
    first_seq += in_front;
    front_skip = 0;
  }
  first_seq = next_seq;
}

void CatalogFeed::BeginReset(Log& log) {
  log.Clear();
  log.overflowed = false;
  log.reset_seq = log.next_seq;
  log.snapshot_shard = 0;
}

template <typename Done>
void CatalogFeed::Release(Log& log, Done done, std::vector<StoredReplica>* released) {
  uint64_t bytes = 0;
  std::erase_if(log.held, [&](const Log::Held& held) {
    if (!done(held.seq)) return false;
    bytes += held.size;
    if (released != nullptr) released->push_back(held.replica);
    return true;
  });
  held_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
}

bool CatalogFeed::Log::AddAcknowledged(uint32_t added) const {
  if (added == 0) return false;
  const uint64_t last = next_seq - 1;
  const uint32_t behind = static_cast<uint32_t>(last) - added;
  return behind <= last && last - behind <= acknowledged;
}

bool CatalogFeed::Hold(const StoredReplica& replica, uint64_t size, uint64_t seq) {
  if (seq == 0) return false;
  Stripe& stripe = StripeOf(replica.segment_id);
  MutexLock lock(stripe.mu);
  auto it = stripe.logs.find(replica.segment_id);
  if (it == stripe.logs.end()) return false;
  Log& log = *it->second;
  if (!log.read && !log.owner_has_catalog) {
    log.freed_unread = true;
    return false;
  }
  if (seq != kAfterReset && seq <= log.acknowledged) return false;
  // The owner's catalog names the object with an identity taken from the object's own bytes: it
  // drops the entry itself should the range hold anything else by the time it reports.
  if (log.owner_verifies && log.AddAcknowledged(replica.added)) return false;
  log.held.push_back(Log::Held{replica, size, seq});
  held_bytes_.fetch_add(size, std::memory_order_relaxed);
  return true;
}

void CatalogFeed::AddSegment(PoolSegmentId id, bool reset, bool owner_has_catalog,
                             bool owner_verifies) {
  auto log = std::make_unique<Log>();
  log->snapshot_shard = shard_count_;
  log->owner_has_catalog = owner_has_catalog || reset;
  log->owner_verifies = owner_verifies;
  if (reset) BeginReset(*log);
  Stripe& stripe = StripeOf(id);
  MutexLock lock(stripe.mu);
  stripe.logs[id] = std::move(log);
}

void CatalogFeed::RemoveSegment(PoolSegmentId id) {
  std::unique_ptr<Log> removed;  // freed outside the lock
  Stripe& stripe = StripeOf(id);
  MutexLock lock(stripe.mu);
  auto it = stripe.logs.find(id);
  if (it == stripe.logs.end()) return;
  removed = std::move(it->second);
  stripe.logs.erase(it);
  // Its ranges go with the segment.
  Release(
      *removed, [](uint64_t) { return true; }, nullptr);
}

uint64_t CatalogFeed::Append(PoolSegmentId id, const LoggedChange& change) {
  Stripe& stripe = StripeOf(id);
  MutexLock lock(stripe.mu);
  auto it = stripe.logs.find(id);
  if (it == stripe.logs.end()) return 0;
  Log& log = *it->second;
  if (log.overflowed) return kAfterReset;
  if (log.pending() >= log.bound()) {
    // The owner is not keeping up (or not asking): rather than holding an unbounded log, the
    // master sends the whole catalog again once it asks.
    log.Clear();
    log.overflowed = true;
    log.reset_seq = 0;
    log.snapshot_shard = shard_count_;
    resets_.fetch_add(1, std::memory_order_relaxed);
    return kAfterReset;
  }
  log.Push(change);
  return log.next_seq - 1;
}

uint64_t CatalogFeed::AppendSnapshot(PoolSegmentId id, const LoggedChange& change) {
  Stripe& stripe = StripeOf(id);
  MutexLock lock(stripe.mu);
  auto it = stripe.logs.find(id);
  if (it == stripe.logs.end() || it->second->overflowed) return 0;
  it->second->Push(change);
  return it->second->next_seq - 1;
}

void CatalogFeed::Append(const TouchBatch& batch) {
  // A batch's touches are mostly of one segment: each stripe lock is taken once per run.
  const std::vector<TouchBatch::Touch>& touches = batch.touches_;
  for (size_t i = 0; i < touches.size();) {
    Stripe& stripe = StripeOf(touches[i].segment);
    MutexLock lock(stripe.mu);
    PoolSegmentId cached_id = 0;
    Log* cached = nullptr;
    for (; i < touches.size() && &StripeOf(touches[i].segment) == &stripe; ++i) {
      const TouchBatch::Touch& touch = touches[i];
      if (cached == nullptr || cached_id != touch.segment) {
        auto it = stripe.logs.find(touch.segment);
        cached = it == stripe.logs.end() ? nullptr : it->second.get();
        cached_id = touch.segment;
      }
      if (cached == nullptr || cached->overflowed || cached->pending() >= cached->bound() / 2) {
        continue;
      }
      LoggedChange change;
      change.kind = CatalogChangeKind::kTouch;
      change.offset = touch.offset;
      change.last_access = touch.last_access;
      cached->Push(change);
    }
  }
}

bool CatalogFeed::Acknowledge(PoolSegmentId id, uint64_t ack, bool full,
                              std::vector<StoredReplica>* released) {
  Stripe& stripe = StripeOf(id);
  MutexLock lock(stripe.mu);
  auto it = stripe.logs.find(id);
  if (it == stripe.logs.end()) return false;
  Log& log = *it->second;
  const bool first_read = !log.read;
  log.read = true;
  if (ack < log.next_seq) {
    // The owner has applied every change up to `ack` (a reset's snapshot too is current to a
    // point after every change before it): the ranges those REMOVEs freed go back.
    log.acknowledged = std::max(log.acknowledged, ack);
    Release(
        log, [ack](uint64_t seq) { return seq != kAfterReset && seq <= ack; }, released);
  }
  if (log.overflowed || (first_read && log.freed_unread && log.reset_seq == 0)) {
    // Cut short, or ranges went back before the owner read anything: the owner gets a snapshot,
    // in which no removed object is.
    BeginReset(log);
    return true;
  }
  // The owner has a reset once it acknowledges a change of it; until then every read answers
  // reset again, from its start.
  const bool owed_reset = log.reset_seq != 0 && (ack < log.reset_seq || ack >= log.next_seq);
  if (full) {
    if (!owed_reset) BeginReset(log);
    return true;
  }
  if (log.reset_seq != 0) {
    if (!owed_reset) {
      // The owner has dropped its old catalog and applied the reset up to `ack`.
      log.reset_seq = 0;
      log.DropThrough(ack);
      // Its catalog now has none of the objects removed while the log was cut short.
      Release(
          log, [](uint64_t seq) { return seq == kAfterReset; }, released);
    }
    return true;
  }
  if (ack >= log.next_seq || ack + 1 < log.first_seq + log.front_skip) {
    // Not a point this log can continue from (changes the owner never applied were dropped, or
    // it acknowledges changes never logged): it gets the whole catalog instead.
    BeginReset(log);
    resets_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  log.DropThrough(ack);
  return true;
}

std::optional<size_t> CatalogFeed::NextSnapshotShard(PoolSegmentId id, uint64_t ack, size_t limit) {
  Stripe& stripe = StripeOf(id);
  MutexLock lock(stripe.mu);
  auto it = stripe.logs.find(id);
  if (it == stripe.logs.end()) return std::nullopt;
  Log& log = *it->second;
  if (log.overflowed || log.snapshot_shard >= shard_count_) return std::nullopt;
  const bool reset = log.reset_seq != 0 && (ack < log.reset_seq || ack >= log.next_seq);
  const uint64_t from = std::max(reset ? log.reset_seq : ack + 1, log.first_seq + log.front_skip);
  if (log.next_seq > from && log.next_seq - from >= limit) return std::nullopt;
  return log.snapshot_shard++;
}

void CatalogFeed::Read(PoolSegmentId id, uint64_t ack, size_t limit, int64_t now,
                       SegmentCatalogChanges* out) const {
  out->segment_id = id;
  out->changes.clear();
  const Stripe& stripe = StripeOf(id);
  MutexLock lock(stripe.mu);
  auto it = stripe.logs.find(id);
  if (it == stripe.logs.end()) return;
  const Log& log = *it->second;
  out->reset = log.reset_seq != 0 && (ack < log.reset_seq || ack >= log.next_seq);
  const uint64_t from =
      std::max(out->reset ? log.reset_seq : ack + 1, log.first_seq + log.front_skip);
  const uint64_t end = from >= log.next_seq ? from : std::min(log.next_seq, from + limit);
  out->changes.reserve(end - from);
  for (uint64_t seq = from; seq < end; ++seq) {
    const uint64_t position = seq - log.first_seq;
    const Chunk& chunk = *log.chunks[position / kChunk];
    const Stored& stored = chunk.changes[position % kChunk];
    CatalogChange& change = out->changes.emplace_back();
    change.seq = seq;
    change.kind = stored.kind;
    change.entry.key.assign(chunk.keys, stored.key_at, stored.key_size);
    change.entry.offset = stored.offset;
    change.entry.size = stored.size;
    change.entry.pinned = stored.pinned;
    change.entry.last_access = stored.last_access;
    if (stored.soft_pin_until > now) {
      change.entry.soft_pin_remaining_ms =
          static_cast<uint64_t>((stored.soft_pin_until - now + 999'999) / 1'000'000);
    }
  }
  out->last_seq = end - 1;
  // An overflow since Acknowledge: the next call starts the reset.
  out->more = end < log.next_seq || log.overflowed || log.snapshot_shard < shard_count_;
}

uint64_t CatalogFeed::resets() const { return resets_.load(std::memory_order_relaxed); }

}  // namespace larder::master
