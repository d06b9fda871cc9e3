// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

#include <absl/functional/function_ref.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "larder/status.h"
#include "master/leases.h"
#include "master/object_shards.h"
#include "master/segment_table.h"
#include "master/types.h"

namespace larder::master {

// All of the master's metadata and the operations on it, with no networking: the gRPC service
// and the HTTP endpoint are thin layers over this class, and unit tests drive it directly.
//
// Objects live in `options.shards` shards, one mutex each; segments and their allocators live in
// the SegmentTable (its own mutex); clients in a table with its own mutex. Lock order, where two
// are held: shard, then segment table; the quarantine's mutex is taken last, under either, and
// nothing is locked under it. Eviction never holds two shard locks.
//
// Every data call names the calling client; a client the master does not know (never mounted,
// expired, or known only to a previous master incarnation) gets FailedPrecondition for the whole
// call and must mount again.
//
// Thread-safe.
class MasterState {
 public:
  explicit MasterState(MasterOptions options);
  ~MasterState();
  MasterState(const MasterState&) = delete;
  MasterState& operator=(const MasterState&) = delete;

  // Runs RunMaintenance every options.sweep_interval on a background thread until destruction.
  void StartSweeper();

  // A random number drawn at construction: clients notice a restarted master by its change.
  uint64_t incarnation() const { return incarnation_; }
  const MasterOptions& options() const { return options_; }

  // ---- clients and segments ----

  // Registers the client (if new) and mounts each segment; an empty list only registers.
  // Per-item errors: see SegmentTable::Mount.
  std::vector<Result<SegmentId>> MountSegments(const std::string& client_id,
                                               const std::string& host_id,
                                               std::span<const SegmentMount> segments);
  // Unmounts and drops every replica placed on the segments. With `unregister`, the client is
  // leaving: it is forgotten and its unfinished puts are revoked.
  Result<std::vector<Status>> UnmountSegments(const std::string& client_id,
                                              std::span<const SegmentId> segments,
                                              bool unregister = false);
  // Marks the client alive and keeps its traffic report (when given) for the metrics.
  // remount_required when the master does not know it.
  HeartbeatOutcome Heartbeat(const std::string& client_id, ClientTraffic* traffic = nullptr);
  // Bumped whenever a segment is unmounted or lost with its client.
  uint64_t segments_version() const { return segments_version_.load(); }
  // The last traffic report of every live client that sent one, by client id.
  std::vector<std::pair<std::string, ClientTraffic>> Traffic() const;

  // ---- objects ----

  // Reserves the keys and places their replicas. Per item: OK with replicas to write (the same
  // ones again when this client's put of the key is already in progress, so a retried call is
  // harmless); OK with already_exists (stored, or being stored by another client; without
  // options.upsert); InvalidArgument (empty or oversize key, size 0, value larger than every
  // segment, duplicate key in the batch, more replicas than segments; for every item: a soft-pin
  // TTL with an action other than kEnable, one above options().max_soft_pin_ttl, or an unknown
  // action); ResourceExhausted (no space even after evicting everything evictable).
  //
  // With options.upsert, a stored key is replaced: the new object is placed (in the old one's
  // space when it needs it) and the old one is removed, its replicas freed at once, or when its
  // readers' leases end if it is leased. The new object keeps the old one's hard pin, and with
  // SoftPinAction::kPreserve its soft-pin deadline. A value that can never be placed
  // (InvalidArgument) leaves the old object in place; one that finds no space
  // (ResourceExhausted) leaves the key absent. A key another client is writing: Unavailable.
  //
  // The soft-pin action is applied when the put ends (BatchPutEnd); see SoftPinAction.
  Result<std::vector<PutStartOutcome>> BatchPutStart(const std::string& client_id,
                                                     std::span<const PutStartItem> items,
                                                     const PutOptions& options);
  // Makes the objects readable (OK again for one already ended by this client). Per item:
  // NotFound (no such put: revoked, timed out, or its every replica was lost),
  // FailedPrecondition (another client's put).
  Result<std::vector<Status>> BatchPutEnd(const std::string& client_id,
                                          std::span<const std::string_view> keys);
  // Abandons puts of this client and frees their space (after a grace period, since a writer may
  // still be copying). Per item: NotFound, FailedPrecondition as for PutEnd.
  Result<std::vector<Status>> BatchPutRevoke(const std::string& client_id,
                                             std::span<const std::string_view> keys);
  // Replicas of complete objects. With kLease, every object found is leased to this client under
  // one lease id until ReleaseLeases or options.lease_ttl, whichever comes first, and counts as a
  // use. Per item: NotFound (unknown key), Unavailable (still being written).
  // `release`: leases of this client to end first, as ReleaseLeases does (a client's release
  // riding on its next get), with no result of their own.
  Result<GetBatch> BatchGetReplicas(const std::string& client_id,
                                    std::span<const std::string_view> keys,
                                    GetMode mode = GetMode::kLease,
                                    std::span<const uint64_t> release = {});
  // Ends leases of this client. Per item: OK (released, or nothing to release: an id never
  // granted by this master, released before, or expired), PermissionDenied (another client's
  // lease, which stays in place).
  Result<std::vector<Status>> ReleaseLeases(const std::string& client_id,
                                            std::span<const uint64_t> lease_ids);
  // OK when the object is complete, NotFound otherwise. Leases and LRU order are left alone.
  Result<std::vector<Status>> BatchExist(const std::string& client_id,
                                         std::span<const std::string_view> keys);
  // Removes complete objects, soft-pinned and hard-pinned ones included. Per item: NotFound,
  // Unavailable (being written, or leased by a reader without `force`: retry later). With
  // `force`, a leased object is removed too; its replicas are reused only once its leases ended.
  Result<std::vector<Status>> BatchRemove(const std::string& client_id,
                                          std::span<const std::string_view> keys,
                                          bool force = false);
  // Removes every complete object of `tenant` (see KeyInTenant) that no reader holds a lease on;
  // with `force`, leased ones too (their replicas reused once their leases ended; counted in
  // `removed`). Objects being written stay. Errors: InvalidArgument (bad tenant name).
  Result<RemoveAllOutcome> RemoveAll(const std::string& client_id, std::string_view tenant = {},
                                     bool force = false);
  // As RemoveAll, for the objects of `tenant` whose key without the tenant prefix matches
  // `pattern` in full (RE2 syntax, UTF-8; RE2::FullMatch). The pattern is compiled once per call
  // and matched in time linear in each key. Errors: InvalidArgument (bad tenant name, pattern
  // longer than kMaxRegexBytes, or not a valid RE2 pattern: RE2's error text).
  Result<RemoveAllOutcome> RemoveByRegex(const std::string& client_id, std::string_view tenant,
                                         std::string_view pattern, bool force = false);

  // ---- operators ----

  std::vector<SegmentView> ListSegments(std::span<const SegmentId> ids) const;
  // Complete objects whose key starts with `prefix`, sorted, at most `limit`.
  std::vector<std::pair<std::string, uint64_t>> ListKeys(std::string_view prefix,
                                                         size_t limit) const;
  // Size and replicas of complete objects, for operators: no client, no lease, no use. Per item:
  // NotFound (absent, or still being written), InvalidArgument (empty or oversize key). The
  // caller bounds the number of keys.
  std::vector<GetOutcome> DescribeKeys(std::span<const std::string_view> keys) const;
  MasterStats Stats() const;
  // How long leases were held: from grant to release, or the TTL for those that expired.
  LatencyHistogram::Snapshot LeaseHoldTimes() const { return lease_hold_.Read(); }
  // How long each eviction run took.
  LatencyHistogram::Snapshot EvictionTimes() const { return eviction_time_.Read(); }

  // One sweep: expire silent clients, unreleased leases past their TTL and soft pins past their
  // deadline, revoke timed-out puts, release quarantined ranges, and evict down from the high
  // watermark (when one is set). The sweeper calls it; tests call it with a fake clock.
  void RunMaintenance();

  // Evicts least-recently-used objects (never leased, hard-pinned or incomplete ones) until
  // `bytes` are freed or nothing is evictable: unpinned objects first; once none is left, soft
  // pins past their deadline end, and then (with options().evict_soft_pinned) soft-pinned
  // objects go, least recently used first. Returns the bytes freed.
  uint64_t Evict(uint64_t bytes);
  // Evictions that a put needs: `bytes` plus options.eviction_slack of the capacity.
  uint64_t EvictForPut(uint64_t bytes);

 private:
  struct ClientRecord {
    uint32_t slot = 0;
    std::string host_id;
    int64_t last_seen = 0;
  };
  struct QuarantinedRanges {
    int64_t release_at = 0;
    std::vector<StoredReplica> replicas;
  };

  int64_t Now() const;
  Shard& ShardFor(const KeyRef& key) const;
  // The client's record, marked as seen now; nullptr when the master does not know it.
  // REQUIRES: clients_mu_ held.
  ClientRecord* TouchClientLocked(const std::string& client_id);
  static Status UnknownClientError(const std::string& client_id);
  Result<ClientRecord> LookupClient(const std::string& client_id);
  // As LookupClient, without copying the record: the client's slot.
  Result<uint32_t> LookupSlot(const std::string& client_id);
  // Ends the leases; fills (*results)[i] for refused ones when results is not null.
  void ReleaseLeasesOf(uint32_t slot, const std::string& client_id,
                       std::span<const uint64_t> lease_ids, std::vector<Status>* results);
  Status ValidateKey(std::string_view key) const;
  // The TTL (ns) a put's soft pin gets at its end with SoftPinAction::kEnable (0: none), or
  // InvalidArgument for options that ask for an impossible soft pin.
  Result<int64_t> SoftPinTtl(const PutOptions& options) const;
  PutStartOutcome PutStartOne(const ClientRecord& client, const PutStartItem& item,
                              const SegmentTable::Plan& plan, const PutOptions& options,
                              int64_t soft_pin_ttl);
  // Takes a complete object out for an upsert or a forced removal: its replicas are freed at
  // once, or quarantined until its lease ends when a reader holds one.
  // REQUIRES: shard.mu held.
  void ReleaseLocked(Shard& shard, Object* object, int64_t now);
  // Before a batch of puts into a nearly full pool: evicts at once what its new keys need beyond
  // the free space, rather than once per key.
  void MakeRoomForBatch(std::span<const PutStartItem> items, uint32_t replicas);
  // Removes the object from the shard (and its list); returns the replicas to free.
  std::vector<StoredReplica> EraseLocked(Shard& shard, Object* object);
  // Keeps the ranges out of use until `release_at` (master clock, ns) at least: they are freed by
  // the first sweep at or after it that finds every earlier quarantined range released too.
  void Quarantine(std::vector<StoredReplica> replicas, int64_t release_at);
  // The removal behind RemoveAll and RemoveByRegex: complete objects of `tenant` whose key in the
  // tenant `match`es.
  RemoveAllOutcome RemoveWhere(std::string_view tenant, bool force,
                               absl::FunctionRef<bool(std::string_view)> match);
  // The eviction rounds of Evict over one list (kLru or kSoftPinned) of every shard.
  uint64_t EvictFrom(ObjectList list, uint64_t bytes, uint64_t* scanned, uint64_t* evicted);
  // Ends the soft pins past their deadline in every shard; returns how many.
  size_t ExpireSoftPins(int64_t now);
  // Drops replicas on `segments` everywhere; revokes the puts of `writer_slot` (if non-zero).
  void DropSegments(std::span<const SegmentId> segments, uint32_t writer_slot);
  void ExpireClients(int64_t now);
  void ExpireLeases(int64_t now);
  void RevokeTimedOutPuts(int64_t now);
  void ReleaseQuarantine(int64_t now);
  void EvictAboveWatermark();
  void SweeperLoop();

  const MasterOptions options_;
  const uint64_t incarnation_;
  const size_t shard_count_;
  std::unique_ptr<Shard[]> shards_;
  SegmentTable segments_;

  mutable std::mutex clients_mu_;
  std::unordered_map<std::string, ClientRecord> clients_;  // guarded by clients_mu_
  std::atomic<uint64_t> segments_version_{1};

  mutable std::mutex traffic_mu_;
  std::map<std::string, ClientTraffic> traffic_;  // of live clients, guarded by traffic_mu_
  void ForgetTraffic(const std::string& client_id);
  uint32_t next_client_slot_ = 1;  // guarded by clients_mu_

  std::mutex quarantine_mu_;
  std::deque<QuarantinedRanges> quarantine_;  // guarded by quarantine_mu_

  std::mutex evict_mu_;  // one evictor at a time, so two never pick the same victims

  // Declared after shards_, so destroyed before them: its leases end while their objects exist.
  LeaseTable leases_;
  LatencyHistogram lease_hold_;
  LatencyHistogram eviction_time_;

  std::atomic<uint64_t> tick_{0};
  std::atomic<uint64_t> objects_{0};
  struct Counters {
    std::atomic<uint64_t> puts{0}, gets{0}, get_misses{0}, removes{0}, evictions{0},
        evicted_bytes{0}, lease_expiries{0}, lease_releases{0}, lease_releases_unknown{0},
        lease_releases_refused{0}, put_refusals_no_space{0}, put_refusals_invalid{0},
        eviction_runs{0}, eviction_scanned{0}, put_revokes{0}, client_expiries{0};
  };
  mutable Counters counters_;

  // (master clock, evictions so far), one sample per sweep over the last kRateWindow.
  mutable std::mutex rate_mu_;
  std::deque<std::pair<int64_t, uint64_t>> eviction_samples_;  // guarded by rate_mu_
  void SampleRates(int64_t now);

  std::mutex sweeper_mu_;
  std::condition_variable sweeper_cv_;
  bool stopping_ = false;  // guarded by sweeper_mu_
  std::thread sweeper_;
};

}  // namespace larder::master
