// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

#include <absl/functional/function_ref.h>

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "larder/status.h"
#include "master/catalog_feed.h"
#include "master/leases.h"
#include "master/object_shards.h"
#include "master/segment_table.h"
#include "master/tenant_stats.h"
#include "master/traffic_totals.h"
#include "master/types.h"

namespace larder::master {

// While the master rebuilds its objects from the catalogs that clients bring when they mount
// (see MasterState::MountSegments, "recovery window"), a get of a key it does not hold (yet) is
// answered Unavailable with a message that starts with this, followed by
// " (until N ms from now); retry". A client retries such a get shortly instead of taking the key
// as absent: another client's catalog may still bring it.
inline constexpr std::string_view kRebuildingMessage =
    "larder-master is rebuilding its catalog from the clients";

// A registered client as the master sees it.
struct ClientView {
  std::string client_id;
  std::string host_id;
  uint32_t pid = 0;                // of the process that mounted last; 0: not said
  int64_t since_last_seen_ms = 0;  // since its last call or heartbeat
  // False for a client that the master expired (silent past the client TTL) in the last
  // kExpiredClientsKept, and that has not mounted again since.
  bool alive = true;
};

// How long, and how many, expired clients ListClients still shows (alive = false).
inline constexpr std::chrono::minutes kExpiredClientsKept{10};
inline constexpr size_t kMaxExpiredClientsShown = 64;

// All of the master's metadata and the operations on it, with no networking: the gRPC service
// and the HTTP endpoint are thin layers over this class, and unit tests drive it directly.
//
// Objects live in `options.shards` shards, one mutex each; segments and their allocators live in
// the SegmentTable (its own mutex); clients in a table with its own mutex. Lock order, where two
// are held: shard, then segment table; the quarantine's mutex and the catalog feed's locks are
// taken last, under either, and nothing is locked under them. Eviction never holds two shard
// locks.
//
// Every mounted segment has a catalog log (CatalogFeed) that its owner reads with SyncCatalog,
// so that it can bring its objects to the next master incarnation when it mounts again.
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
  // The disk tier: holders, disk copies and their work (disk_tier.h).
  DiskTier& disk() { return disk_; }
  const DiskTier& disk() const { return disk_; }
  // The host of a registered client; FailedPrecondition (kRemountRequired) for an unknown one.
  Result<std::string> ClientHostId(const std::string& client_id);
  // A new process of the client's host took over its disk directory, whose lock the client held
  // for its life: it has most likely exited. Until it heartbeats again (it was alive after all:
  // the claim came from another client, and is not trusted further), no put places a replica in
  // its segments, where the space that evictions free would wait for it to apply them; silent
  // for a third of the client TTL (about three heartbeats), it expires then, not after the whole
  // TTL. Unknown clients are ignored.
  void MarkReplaced(const std::string& client_id);
  // Queues the demotion of `key`'s object to its host's disk now, whatever the watermark (a put
  // with write-through). False when it is not complete, or has no holder on its host.
  bool DemoteNow(std::string_view key);
  // Whether an object of `key` is in memory, complete or being written.
  bool HasObject(std::string_view key) const;
  // Queues demotions of the least recently used objects once memory use passes the disk tier's
  // demote watermark (demotion.cc). Runs on the demotion thread (StartSweeper starts it), once a
  // sweep interval and when kicked.
  void ScheduleDemotions();
  // Wakes the demotion thread (puts, holders' polls): cheap, never blocks on its work.
  void KickDemotions();

  // ---- clients and segments (clients.cc) ----

  // Registers the client (if new; its pid, when given, is kept) and mounts each segment; an
  // empty list only registers. Per segment, SegmentTable::Mount's errors, and:
  //
  // Takeover. A name that another client holds is refused (AlreadyExists, with the holder's host
  // and pid in the outcome) unless that holder is provably gone; its segment is then unmounted
  // (its replicas dropped: their bytes went with its process) and the name mounted afresh for the
  // caller. Gone means: (a) caller.take_over_pid is the holder's pid and the caller is on the
  // holder's host (the holder's process no longer exists there); or (b) the caller was refused
  // the name before and the holder has not been heard from (no heartbeat, no call) since that
  // first refusal, for at least client_ttl / 3. A holder that keeps heartbeating is never taken
  // over by (b). A name the caller itself holds: AlreadyExists, as before.
  //
  // Rebuild. A catalog (SegmentMount::catalog) from another master incarnation is rebuilt into
  // objects. Refused (counted in recovery.dropped and Stats().catalog_entries_dropped) are the
  // entries with an empty or oversize key, size 0, an offset that is not a multiple of
  // options().allocation_alignment, or a range past the segment's end; every entry of a group of
  // overlapping ranges; and every entry of a key that appears twice in the catalog. Each other
  // entry's range is taken in the new segment's allocator, and its key:
  //   - unknown: becomes a complete object with that one replica;
  //   - rebuilt from another catalog, with the same size, no unexpired lease on it and fewer than
  //     kMaxReplicas replicas: gets the replica added (its pins and LRU position stay);
  //   - rebuilt from another catalog with another size: the object is dropped too (its ranges
  //     freed, or held until its leases end), and the key is refused in every catalog until the
  //     recovery window ends;
  //   - put to this master (complete or being written), leased or at kMaxReplicas, or refused
  //     before in this window: refused. A claim is never added beside bytes a writer put here.
  // The ranges of refused entries stay free, and the segment's catalog log starts with a REMOVE
  // for each of them, so that the owner forgets them. A restored object keeps its hard pin; its
  // soft pin lasts soft_pin_remaining_ms from now (at most options().max_soft_pin_ttl). Restored
  // objects go on the LRU lists in last_access order, and the master's access tick moves past
  // the largest last_access, so eviction order survives approximately.
  //
  // A catalog of this incarnation is ignored, all its entries counted as dropped (this master
  // dropped those objects itself, when it lost the segment); the segment's first SyncCatalog
  // answers reset, so that its owner drops them too.
  //
  // Recovery window. The first mount that brings a catalog of another incarnation opens it,
  // until client_ttl after this master was constructed, or client_ttl after that mount when that
  // is past (by then every live client has noticed the new master and mounted again); it is
  // neither extended nor opened again. A catalog of another incarnation that comes after it closed
  // is ignored as one of this incarnation is. While it is open, a get (GetMode::kLease) of a key
  // that is not stored answers Unavailable (see kRebuildingMessage) instead of NotFound.
  std::vector<MountOutcome> MountSegments(const MountCaller& caller,
                                          std::span<const SegmentMount> segments);
  // As above, for a caller that gives no pid: each segment's id, or its error.
  std::vector<Result<PoolSegmentId>> MountSegments(const std::string& client_id,
                                                   const std::string& host_id,
                                                   std::span<const SegmentMount> segments);
  // The changes of the caller's catalogs that it has not applied: for each segment it has
  // mounted (in id order), the changes after the seq it acknowledges in `acks` (0 or absent:
  // from the log's start), at most kMaxCatalogChangesPerSegment per segment and
  // kMaxCatalogChangesPerReply in all; `more` where more wait (call again at once); last_seq,
  // the seq to acknowledge next. The changes up to an acknowledged seq are forgotten. `reset`:
  // drop the catalog held first; the changes (over one call or several) rebuild it: a snapshot
  // of the segment's objects, then what happened since. A reset is answered when the owner asks
  // (CatalogAck::full: after a mount that rebuilt objects, to learn which were kept), when the
  // log was cut short (kMaxPendingCatalogChanges, or kMaxPendingCatalogChangesUnread before its
  // first read), when the ack is not one the log can continue from, and after a mount that
  // brought a catalog of this incarnation. Acks of other segments are ignored. An owner should
  // read its log soon after it mounts: until then the smaller bound applies.
  //
  // Logged for a segment: ADD when an object with a replica there is committed (BatchPutEnd);
  // REMOVE when such a complete object leaves the index (removed, evicted, replaced by an
  // upsert, dropped by a rebuild), and for each entry a rebuild refused; TOUCH (a hint, dropped
  // when the log is long) when a get is its object's first use in an epoch of ticks (a tick per
  // key got or put): 4096 ticks, or objects / 8 rounded up to a power of two when larger. So a
  // catalog's last_access is at most one epoch (about an eighth to a quarter of the pool's
  // objects) behind the object's last use: the LRU order survives a rebuild to within that. And
  // the cost is bounded: one TOUCH per object per epoch at most, however hot; a get that logs
  // none pays two shifts and a comparison; those that do are logged after the shard locks, with
  // one feed lock per call.
  //
  // Applying them (the owner's side): ADD puts the entry at its offset, replacing any there;
  // REMOVE acts only on the entry at its offset with its key; TOUCH names only the offset (it
  // carries no key nor size: most changes of a read-mostly pool are TOUCHes) and keeps the larger
  // last_access. A TOUCH logged late, after its object's REMOVE and the ADD of another object at
  // that offset, changes nothing: its tick is older than that ADD's. ADD and REMOVE of one object
  // always come in the order they happened, and a range's REMOVE before the ADD that reuses it.
  //
  // Errors: FailedPrecondition (unknown client, as for every data call), InvalidArgument (more
  // than kMaxSegmentsPerMount acks).
  Result<std::vector<SegmentCatalogChanges>> SyncCatalog(const std::string& client_id,
                                                         std::span<const CatalogAck> acks);
  // Unmounts and drops every replica placed on the segments. With `unregister`, the client is
  // leaving: it is forgotten and its unfinished puts are revoked.
  Result<std::vector<Status>> UnmountSegments(const std::string& client_id,
                                              std::span<const PoolSegmentId> segments,
                                              bool unregister = false);
  // Marks the client alive and keeps its traffic report (when given) for the metrics, adding what
  // it counts beyond the client's previous report to TrafficByLocality.
  // remount_required when the master does not know it.
  HeartbeatOutcome Heartbeat(const std::string& client_id, ClientTraffic* traffic = nullptr);
  // Bumped whenever a segment is unmounted or lost with its client.
  uint64_t segments_version() const { return segments_version_.load(); }
  // The last traffic report of every live client that sent one, by client id.
  std::vector<std::pair<std::string, ClientTraffic>> Traffic() const;
  // Every client's transfer counters summed by route and locality since this master started
  // (traffic_totals.h).
  std::map<TrafficTotals::Key, TrafficTotals::Counters> TrafficByLocality() const;
  // The registered clients (those not yet expired or gone), sorted by id.
  std::vector<ClientView> ListClients() const;

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
  // With a `segment` name, only each object's replica on that segment goes (its range logged
  // REMOVE in that segment's catalog), and the object with its last replica; per item NotFound
  // also when the object has no replica there. With `unused_for` > 0, objects put or read within
  // that long (counted from the sweeps' tick samples, so up to a sweep_interval more) stay,
  // Unavailable with kLeased, as Mooncake's batch_replica_clear skips objects in their KV lease;
  // `force` does not override it. Errors: InvalidArgument when `unused_for` exceeds
  // kMaxUnusedFor.
  Result<std::vector<Status>> BatchRemove(const std::string& client_id,
                                          std::span<const std::string_view> keys,
                                          bool force = false, std::string_view segment = {},
                                          std::chrono::milliseconds unused_for = {});
  static constexpr std::chrono::hours kMaxUnusedFor{24};
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

  // Removes every complete object whose whole key (as ListKeys gives it: a tenant's keys start
  // with its prefix, see KeyInTenant) starts with `prefix`, as RemoveAll does (leased ones only
  // with `force`). For operators: no client, no tenant.
  RemoveAllOutcome RemoveByPrefix(std::string_view prefix, bool force = false);

  std::vector<SegmentView> ListSegments(std::span<const PoolSegmentId> ids) const;

  // Drains the segment named `segment_name` (or ends its drain): see SegmentTable::SetDraining.
  // The mark lives in this master only: a new master incarnation places there again. Returns
  // the segment as it is now. Errors: NotFound (no segment of that name).
  Result<SegmentView> SetDraining(const std::string& segment_name, bool draining);
  // The complete objects with a replica in the segment, the most recently used first, at most
  // `limit` (`truncated` when there were more). Errors: NotFound.
  struct SegmentObjects {
    std::vector<SegmentObject> objects;
    bool truncated = false;
  };
  Result<SegmentObjects> ListSegmentObjects(const std::string& segment_name, size_t limit) const;
  // Removes every complete object with a replica in the segment, as RemoveByPrefix does (leased
  // ones only with `force`): the end of a drain. Errors: NotFound, FailedPrecondition (the
  // segment is not draining: a drain comes first, so that nothing new lands there meanwhile).
  Result<RemoveAllOutcome> RemoveOnSegment(const std::string& segment_name, bool force);
  // Complete objects whose key starts with `prefix`, sorted, at most `limit`.
  std::vector<std::pair<std::string, uint64_t>> ListKeys(std::string_view prefix,
                                                         size_t limit) const;
  // Size and replicas of complete objects, for operators: no client, no lease, no use. Per item:
  // NotFound (absent, or still being written), InvalidArgument (empty or oversize key). The
  // caller bounds the number of keys.
  std::vector<GetOutcome> DescribeKeys(std::span<const std::string_view> keys) const;
  MasterStats Stats() const;
  // Lookups and gets by tenant (tenant_stats.h).
  TenantCounters::Snapshot TenantStats() const { return tenant_counters_.Get(); }
  // How long leases were held: from grant to release, or the TTL for those that expired.
  LatencyHistogram::Snapshot LeaseHoldTimes() const { return lease_hold_.Read(); }
  // How long each eviction run took.
  LatencyHistogram::Snapshot EvictionTimes() const { return eviction_time_.Read(); }

  // One sweep: expire silent clients, unreleased leases past their TTL and soft pins past their
  // deadline, revoke timed-out puts, release quarantined ranges, and evict down from the high
  // watermark (when one is set). The sweeper calls it; tests call it with a fake clock.
  //
  // A master never blames its clients for its own stall: when more than client_ttl / 3 (the
  // clients' heartbeat interval) plus sweep_interval passed since the previous sweep (the master
  // was paused, swapped out or starved), every client is marked seen now before any is expired.
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
    uint32_t pid = 0;       // of the process that mounted last; 0: not said
    bool replaced = false;  // see MarkReplaced
  };
  // A client the master expired, shown by ListClients for a while (alive = false).
  struct ExpiredClient {
    std::string client_id;
    std::string host_id;
    uint32_t pid = 0;
    int64_t last_seen = 0;
    int64_t expired_at = 0;
  };
  // A client refused a segment name that another client holds (see MountSegments, takeover).
  struct NameClaim {
    std::string client_id;
    int64_t since = 0;  // master clock (ns) of its first refusal, or of the holder's last sign
  };
  // A catalog checked for a rebuild (recovery.cc).
  struct PreparedCatalog;
  // A replica whose range a removal gave up, with the size and the REMOVE (CatalogFeed::Append's
  // sequence number; 0: none logged) that its segment's owner must apply before it is reused.
  struct FreedReplica {
    StoredReplica replica;
    uint64_t size = 0;
    uint64_t seq = 0;
  };
  struct QuarantinedRanges {
    int64_t release_at = 0;
    std::vector<FreedReplica> replicas;
  };

  int64_t Now() const;
  size_t ShardIndex(const KeyRef& key) const;
  Shard& ShardFor(const KeyRef& key) const;
  // Orders `indices` (into `refs`) by the shard of their key, keeping their order within a shard.
  void SortByShard(std::span<const KeyRef> refs, std::vector<uint32_t>* indices) const;
  // The client's record, marked as seen now; nullptr when the master does not know it.
  ClientRecord* TouchClientLocked(const std::string& client_id) LARDER_REQUIRES(clients_mu_);
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
  void ReleaseLocked(Shard& shard, Object* object, int64_t now) LARDER_REQUIRES(shard.mu);
  // Before a batch of puts into a nearly full pool: evicts at once what its new keys need beyond
  // the free space, rather than once per key.
  void MakeRoomForBatch(std::span<const PutStartItem> items, uint32_t replicas);
  // Removes the object from the shard (and its list); returns the replicas to free.
  std::vector<FreedReplica> EraseLocked(Shard& shard, Object* object) LARDER_REQUIRES(shard.mu);
  // Keeps the ranges out of use until `release_at` (master clock, ns) at least: they are freed by
  // the first sweep at or after it that finds every earlier quarantined range released too.
  void Quarantine(std::vector<FreedReplica> replicas, int64_t release_at);
  // Frees the ranges whose owners have applied their REMOVE, and hands the others to the feed,
  // which frees them once their owners have (CatalogFeed::Hold).
  void FreeReplicas(std::span<const FreedReplica> replicas);
  // Frees ranges the feed released, and wakes puts waiting for space.
  void FreeReleased(std::span<const StoredReplica> replicas);
  // Waits until some held range was freed after `seen` (reclaimed_'s value then) or until
  // `deadline`; true when one was.
  bool WaitForReclaim(uint64_t seen, std::chrono::steady_clock::time_point deadline);
  // The removal behind RemoveAll, RemoveByRegex, RemoveByPrefix and RemoveOnSegment: complete
  // objects of `tenant` whose key in the tenant `match`es; with no tenant, objects whose whole
  // key does; with `on_segment` (not 0), only those with a replica in that segment.
  RemoveAllOutcome RemoveWhere(std::optional<std::string_view> tenant, bool force,
                               absl::FunctionRef<bool(std::string_view)> match,
                               PoolSegmentId on_segment = 0);
  // The eviction rounds of Evict over one list (kLru or kSoftPinned) of every shard.
  uint64_t EvictFrom(ObjectList list, uint64_t bytes, uint64_t* scanned, uint64_t* evicted);
  // Ends the soft pins past their deadline in every shard; returns how many.
  size_t ExpireSoftPins(int64_t now);
  // Drops replicas on `segments` everywhere; revokes the puts of `writer_slot` (if non-zero).
  void DropSegments(std::span<const PoolSegmentId> segments, uint32_t writer_slot);
  // ---- catalogs, rebuilds and takeovers (recovery.cc) ----

  // Mounts one segment for the caller (registered as `slot`), with its rebuild and takeover.
  MountOutcome MountOne(const MountCaller& caller, uint32_t slot, const SegmentMount& mount);
  // Whether the caller may take over the name `holder` holds now (see MountSegments); fills the
  // refusal's holder fields otherwise.
  bool MayTakeOver(const MountCaller& caller, const SegmentTable::NameHolder& holder,
                   const std::string& name, MountOutcome* refusal);
  // Checks a foreign catalog against the segment: what to reserve, what is refused.
  PreparedCatalog PrepareCatalog(const SegmentMount& mount) const;
  // Makes the prepared entries objects of the new segment `segment`; returns how many were
  // restored and refused.
  CatalogRecovery RebuildObjects(PoolSegmentId segment, uint32_t slot, PreparedCatalog& prepared);
  // Opens the recovery window (see MountSegments) unless it is open.
  void OpenRecoveryWindow(int64_t now);
  // The recovery window opened and ended: catalogs of other incarnations are ignored since.
  bool RecoveryWindowClosed(int64_t now) const;
  // The error of a get that found no object while the recovery window is open.
  static Status RebuildingError(std::string_view key, int64_t left_ns);
  // Logs REMOVE of a complete object leaving the index into each of its replicas' segments, and
  // appends its replicas, with the REMOVE that gates each, to *freed.
  // REQUIRES: its shard's mu held.
  void LogRemovedLocked(const Object* object, std::vector<FreedReplica>* freed);
  // Drops the object's replicas on `segment` (REMOVE in that segment's catalog; the range freed,
  // or held while the object is leased). REQUIRES: another replica stays; the shard's lock.
  void DropReplicaLocked(Object* object, PoolSegmentId segment, int64_t now);
  // Logs ADD of an object just committed into each of its replicas' segments.
  // REQUIRES: its shard's mu held.
  void LogAddedLocked(Object* object, int64_t soft_pin_until);
  // The snapshot of a reset: appends ADD for each complete object of shard `shard` with a
  // replica in the segment.
  void SnapshotShard(PoolSegmentId segment, size_t shard);
  // Forgets the refused keys of the recovery window once it has ended.
  void EndRecoveryWindow(int64_t now);

  // Marks every client seen now when the sweeps were stalled (see RunMaintenance).
  void ForgiveStall(int64_t now);
  void ExpireClients(int64_t now);
  void ExpireLeases(int64_t now);
  void RevokeTimedOutPuts(int64_t now);
  void ReleaseQuarantine(int64_t now);
  void EvictAboveWatermark();
  void SweeperLoop();
  void DemotionLoop();

  const MasterOptions options_;
  DiskTier disk_{options_.disk};
  // The demotion thread (demotion.cc): kicked by puts and polls.
  std::atomic<bool> demotion_kicked_{false};
  Mutex demotion_mu_;
  CondVar demotion_cv_;
  bool demotion_stopping_ LARDER_GUARDED_BY(demotion_mu_) = false;
  std::thread demoter_;
  const uint64_t incarnation_;
  const size_t shard_count_;
  std::unique_ptr<Shard[]> shards_;
  SegmentTable segments_;
  CatalogFeed feed_;
  const int64_t started_;  // master clock (ns) at construction

  mutable Mutex clients_mu_;
  std::unordered_map<std::string, ClientRecord> clients_ LARDER_GUARDED_BY(clients_mu_);
  // Oldest first; at most kMaxExpiredClientsShown, none older than kExpiredClientsKept, none
  // that mounted again.
  std::deque<ExpiredClient> expired_clients_ LARDER_GUARDED_BY(clients_mu_);
  // By segment name; pruned by the sweeper once old.
  std::unordered_map<std::string, NameClaim> claims_ LARDER_GUARDED_BY(clients_mu_);
  std::atomic<uint64_t> segments_version_{1};

  mutable Mutex traffic_mu_;
  // Of live clients.
  std::map<std::string, ClientTraffic> traffic_ LARDER_GUARDED_BY(traffic_mu_);
  TrafficTotals traffic_totals_ LARDER_GUARDED_BY(traffic_mu_);
  void ForgetTraffic(const std::string& client_id) LARDER_EXCLUDES(traffic_mu_);
  uint32_t next_client_slot_ LARDER_GUARDED_BY(clients_mu_) = 1;

  Mutex quarantine_mu_;
  std::deque<QuarantinedRanges> quarantine_ LARDER_GUARDED_BY(quarantine_mu_);

  Mutex evict_mu_;  // one evictor at a time, so two never pick the same victims

  // Puts that found the pool full while ranges were held for their owners wait here for them.
  Mutex reclaim_mu_;
  CondVar reclaim_cv_;
  // How many times held ranges were freed.
  uint64_t reclaimed_ LARDER_GUARDED_BY(reclaim_mu_) = 0;

  // Declared after shards_, so destroyed before them: its leases end while their objects exist.
  LeaseTable leases_;
  LatencyHistogram lease_hold_;
  LatencyHistogram eviction_time_;

  // The recovery window's end (master clock, ns); 0: never opened. Opened under recovery_mu_,
  // read without it.
  Mutex recovery_mu_;
  std::atomic<int64_t> rebuilding_until_{0};
  std::atomic<bool> conflicted_keys_{false};  // some shard has conflicted_keys to forget

  Mutex sweep_mu_;
  int64_t last_sweep_ LARDER_GUARDED_BY(sweep_mu_);  // master clock (ns) of the previous sweep

  std::atomic<uint64_t> tick_{0};
  std::atomic<uint64_t> objects_{0};
  struct Counters {
    std::atomic<uint64_t> puts{0}, gets{0}, get_misses{0}, lookups{0}, lookup_misses{0}, removes{0},
        evictions{0}, evicted_bytes{0}, lease_expiries{0}, lease_releases{0},
        lease_releases_unknown{0}, lease_releases_refused{0}, put_refusals_no_space{0},
        put_refusals_invalid{0}, eviction_runs{0}, eviction_scanned{0}, put_revokes{0},
        client_expiries{0}, recovered_objects{0}, catalog_entries_dropped{0};
  };
  mutable Counters counters_;
  TenantCounters tenant_counters_;

  // (master clock, evictions so far), one sample per sweep over the last kRateWindow.
  mutable Mutex rate_mu_;
  std::deque<std::pair<int64_t, uint64_t>> eviction_samples_ LARDER_GUARDED_BY(rate_mu_);
  // (master clock, tick_) at sweeps where the tick had moved, oldest first: an object whose
  // last_access is above a sample's tick was put or read after that sample's time. Bounded by
  // thinning the older half when full, so old times keep a coarser record.
  std::vector<std::pair<int64_t, uint64_t>> tick_samples_ LARDER_GUARDED_BY(rate_mu_);
  // The tick of the newest sample taken at or before `time`; nullopt when there is none (every
  // object may have been used since).
  std::optional<uint64_t> TickAtOrBefore(int64_t time) const;
  void SampleRates(int64_t now);

  Mutex sweeper_mu_;
  CondVar sweeper_cv_;
  bool stopping_ LARDER_GUARDED_BY(sweeper_mu_) = false;
  std::thread sweeper_;
};

}  // namespace larder::master
