// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The catalog feed: per mounted segment, the log of changes to the committed objects that have a
// replica there, which the segment's owner fetches (MasterState::SyncCatalog) to keep its
// catalog: the list it reports when it mounts the segment again, from which a new or restarted
// master rebuilds those objects.
//
// Sequence numbers are per segment, start at 1, increase by one per change and are never reused.
// A client acknowledges the last change it applied; changes up to there are dropped.
//
// A removed object's range may be named by its owner's catalog until the owner applies the
// REMOVE; a master that rebuilt from that catalog would serve whatever a new object wrote into the
// range as the old object's value. Two ways keep that from happening (Hold):
//  - an owner that checks its catalog (it mounted with verifies_catalog) records an identity of
//    each object's bytes, read from its own memory when it applies the object's ADD, and drops
//    every entry whose range no longer holds those bytes before it reports a catalog. Once the
//    owner has acknowledged the object's ADD, its catalog's identity was taken while the range
//    held the object's bytes, so the range may be reused the moment the object goes;
//  - otherwise (an owner that cannot read its segment's memory, e.g. device memory, or an object
//    removed before its owner applied its ADD) the range is held here until the owner
//    acknowledges the REMOVE: held, it keeps its bytes until no catalog names them.
#pragma once

#include <absl/container/flat_hash_map.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/mutex.h"
#include "master/segment_table.h"
#include "master/types.h"

namespace larder::master {

// Changes past this many pending (not acknowledged) ones for one segment cut its log short: it is
// cleared, and the next read resends the segment's whole catalog (SegmentCatalogChanges::reset).
inline constexpr size_t kMaxPendingCatalogChanges = size_t{1} << 20;
// The same bound for a log that no one has read yet: an owner that never reads its catalog (one
// that predates catalogs) costs the master at most this many changes per segment.
inline constexpr size_t kMaxPendingCatalogChangesUnread = size_t{1} << 16;
// TOUCHes are hints: one that finds half the bound pending is dropped, never cuts a log short.
// Most changes one read returns for one segment, and for all of a client's segments together
// (about 64 bytes each on the wire, so that a reply stays far below the 256 MiB message limit).
inline constexpr size_t kMaxCatalogChangesPerSegment = 65536;
inline constexpr size_t kMaxCatalogChangesPerReply = 4 * kMaxCatalogChangesPerSegment;
// Append's answer for a change that the log, cut short, leaves to the coming reset's snapshot.
inline constexpr uint64_t kAfterReset = UINT64_MAX;

// A change as it is logged. `key` is the caller's memory, copied by the feed. REQUIRES: key has
// at most kMaxKeyBytes (65535) bytes.
struct LoggedChange {
  CatalogChangeKind kind = CatalogChangeKind::kAdd;
  std::string_view key;
  uint64_t offset = 0;
  uint64_t size = 0;
  bool pinned = false;
  int64_t soft_pin_until = 0;  // master clock (ns); 0: not soft-pinned
  uint64_t last_access = 0;
};

// TOUCHes gathered while a get holds its shard locks, logged after it let them go. A TOUCH names
// its object by offset alone: the owner's catalog is indexed by offset, and a TOUCH is a hint (the
// owner keeps the latest tick of the entry there), so it carries neither key nor size.
class TouchBatch {
 public:
  void Add(PoolSegmentId segment, uint64_t offset, uint64_t last_access) {
    touches_.push_back(Touch{segment, offset, last_access});
  }
  // Room for `touches` more, so that gathering them allocates once.
  void Reserve(size_t touches) { touches_.reserve(touches_.size() + touches); }
  bool empty() const { return touches_.empty(); }

 private:
  friend class CatalogFeed;
  struct Touch {
    PoolSegmentId segment = 0;
    uint64_t offset = 0;
    uint64_t last_access = 0;
  };
  std::vector<Touch> touches_;
};

// Thread-safe. Its locks are leaves: they are taken under shard and segment-table locks, and
// nothing is locked under them. Logs are split over a few stripes by segment id, each with its
// own mutex, so that puts into different segments do not wait on one another.
class CatalogFeed {
 public:
  // `shard_count`: how many shards a reset's snapshot walks (see NextSnapshotShard).
  explicit CatalogFeed(size_t shard_count);
  CatalogFeed(const CatalogFeed&) = delete;
  CatalogFeed& operator=(const CatalogFeed&) = delete;

  // Starts the (empty) log of a new segment. With `reset`, the owner must drop the catalog it
  // holds: its first read answers reset, with a snapshot of the segment's objects.
  // `owner_has_catalog`: the owner mounted it with catalog entries (an owner without any holds
  // nothing stale until it reads, so ranges need not wait for it until then; see Hold).
  // `owner_verifies`: the owner checks its catalog against its memory (see the top of this file).
  void AddSegment(PoolSegmentId id, bool reset, bool owner_has_catalog = true,
                  bool owner_verifies = false);
  // Forgets the segment's log. Appends for it are ignored from now on.
  void RemoveSegment(PoolSegmentId id);

  // Logs ADD or REMOVE. Past kMaxPendingCatalogChanges pending changes (or
  // kMaxPendingCatalogChangesUnread before the log's first Acknowledge) the log is cleared and
  // marked for a reset; until that reset starts, changes are not logged (the snapshot will hold
  // their outcome). Returns the change's sequence number: kAfterReset when it was left to a reset,
  // 0 when the segment has no log (the change is ignored).
  uint64_t Append(PoolSegmentId id, const LoggedChange& change);
  // Logs each touch (best effort: dropped past half the bound of pending changes).
  void Append(const TouchBatch& batch);

  // ---- reads, for MasterState::SyncCatalog ----

  // Drops the changes up to `ack` and starts a reset where one is due: the log overflowed, `ack`
  // is one it cannot continue from (past the last change, or before changes dropped), or the
  // owner asks (`full`) and is not already owed a reset. Returns false when the segment has no
  // log. Ranges held for changes the owner has now applied are appended to *released (when given),
  // for the caller to free.
  bool Acknowledge(PoolSegmentId id, uint64_t ack, bool full = false,
                   std::vector<StoredReplica>* released = nullptr);

  // ---- ranges that wait for their owner ----

  // Holds `replica` (`size` bytes), which the change `seq` of its segment's log removed, until
  // the owner acknowledges that change (kAfterReset: until it has taken the coming reset). Returns
  // false when it need not wait: the segment has no log (0, or forgotten), the owner has
  // acknowledged `seq` already, the owner checks its catalog and has acknowledged the object's ADD
  // (replica.added), or the owner holds no catalog yet (it mounted without one and has not read
  // since: its first read is then a reset, a snapshot without the removed object); the caller
  // frees it then.
  bool Hold(const StoredReplica& replica, uint64_t size, uint64_t seq);
  // What StoredReplica::added keeps of the sequence number that Append or AppendSnapshot returned
  // for an ADD: its low 32 bits, 0 when the ADD has none (not logged, or left to a reset).
  static uint32_t AddedMark(uint64_t seq) {
    return seq == kAfterReset ? 0 : static_cast<uint32_t>(seq);
  }
  // Bytes held now, over every segment.
  uint64_t held_bytes() const { return held_bytes_.load(std::memory_order_relaxed); }
  // During a reset, the next shard whose objects on the segment are to be appended as a snapshot
  // (with AppendSnapshot, under that shard's lock), while fewer than `limit` changes after `ack`
  // wait; nullopt when none is to be scanned now. Each shard is handed out once per reset.
  std::optional<size_t> NextSnapshotShard(PoolSegmentId id, uint64_t ack, size_t limit);
  // As Append for ADD, for a reset's snapshot: never cuts the log short. Returns the change's
  // sequence number, or 0 when it was not logged (no log, or cut short since).
  uint64_t AppendSnapshot(PoolSegmentId id, const LoggedChange& change);
  // At most `limit` changes after `ack` into *out (segment_id, reset, changes, more, last_seq),
  // with soft-pin deadlines as the time left after `now` (master clock, ns).
  void Read(PoolSegmentId id, uint64_t ack, size_t limit, int64_t now,
            SegmentCatalogChanges* out) const;

  // Logs cut short since construction.
  uint64_t resets() const;

 private:
  // Changes are kept in chunks of kChunk, their keys in one buffer per chunk, so that logging
  // one costs no allocation of its own, and dropping acknowledged ones frees whole chunks.
  static constexpr size_t kChunk = 4096;
  struct Stored {
    uint64_t offset = 0;
    uint64_t size = 0;
    uint64_t last_access = 0;
    int64_t soft_pin_until = 0;
    uint32_t key_at = 0;
    uint16_t key_size = 0;
    CatalogChangeKind kind = CatalogChangeKind::kAdd;
    bool pinned = false;
  };
  struct Chunk {
    std::vector<Stored> changes;
    std::string keys;  // of `changes`, back to back
  };
  struct Log {
    uint64_t first_seq = 1;  // of chunks.front()->changes[0]
    uint64_t next_seq = 1;   // of the next change logged
    size_t front_skip = 0;   // changes of the front chunk already dropped
    std::deque<std::unique_ptr<Chunk>> chunks;
    bool overflowed = false;        // cleared; a reset starts at the next Acknowledge
    bool read = false;              // acknowledged at least once: the larger bound applies
    bool owner_has_catalog = true;  // mounted with catalog entries
    bool owner_verifies = false;    // checks its catalog against its memory
    bool freed_unread = false;      // ranges went back before the first read: it is a reset
    // A reset in progress: the owner must drop its catalog before applying the changes from
    // reset_seq on (0: none), and shards from snapshot_shard on are still to be scanned.
    uint64_t reset_seq = 0;
    size_t snapshot_shard = 0;
    // The last change the owner acknowledged (ranges removed up to it are free).
    uint64_t acknowledged = 0;
    // Ranges that wait for the owner: the REMOVE that gave each up, or kAfterReset.
    struct Held {
      StoredReplica replica;
      uint64_t size = 0;
      uint64_t seq = 0;
    };
    std::vector<Held> held;

    uint64_t pending() const { return next_seq - first_seq - front_skip; }
    // Whether the owner has applied the ADD whose AddedMark is `added`: the ADD is the latest
    // change numbered at most next_seq - 1 with those low bits (or an earlier one, never a later
    // one, so a mark that wrapped around only ever holds a range longer).
    bool AddAcknowledged(uint32_t added) const;
    size_t bound() const {
      return read ? kMaxPendingCatalogChanges : kMaxPendingCatalogChangesUnread;
    }
    void Push(const LoggedChange& change);
    void Clear();
    void DropThrough(uint64_t seq);
  };
  struct Stripe {
    mutable Mutex mu;
    absl::flat_hash_map<PoolSegmentId, std::unique_ptr<Log>> logs LARDER_GUARDED_BY(mu);
  };
  static constexpr size_t kStripes = 16;

  Stripe& StripeOf(PoolSegmentId id) { return stripes_[id % kStripes]; }
  const Stripe& StripeOf(PoolSegmentId id) const { return stripes_[id % kStripes]; }
  // Clears the log and starts a reset from its next change; held ranges then wait for the reset.
  // REQUIRES: its stripe's mu held.
  void BeginReset(Log& log);
  // Moves the held ranges that `done` says may go to *released. REQUIRES: its stripe's mu held.
  template <typename Done>
  void Release(Log& log, Done done, std::vector<StoredReplica>* released);

  const size_t shard_count_;
  std::array<Stripe, kStripes> stripes_;
  std::atomic<uint64_t> resets_{0};
  std::atomic<uint64_t> held_bytes_{0};
};

}  // namespace larder::master
