// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

// Plain types shared by the master's parts (state, placement, service). No gRPC here: the
// service translates these to and from proto/master.proto.

#include <absl/container/inlined_vector.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/limits.h"
#include "larder/soft_pin.h"
#include "larder/status.h"
#include "larder/transfer_engine.h"
#include "master/disk_tier.h"

namespace larder::master {

// A mounted segment's id in the pool, assigned by the master and unique across its incarnations
// (larder::SegmentId, by contrast, is an engine's own id of a segment it exports).
using PoolSegmentId = uint64_t;
using Clock = std::chrono::steady_clock;

enum class PlacementStrategy {
  kLocalHostFirst,  // segments on the writer's host first (same process first), then free ratio
  kFreeRatio,       // the segments with the largest free fraction, wherever they are
};

// Every field has its default here and in docs/configuration.md.
struct MasterOptions {
  // How long a GetReplicas lease protects an object from eviction and removal when the reader
  // does not release it (it died or stalled mid-copy). Readers release their leases when their
  // copy ends, so this bounds only what a dead reader can hold.
  std::chrono::milliseconds lease_ttl{5000};
  // A client silent for this long is expired: its segments unmounted, its replicas dropped.
  std::chrono::milliseconds client_ttl{10000};
  // A put that finds no space evicts what it needs plus this fraction of the capacity (least
  // recently used first), so that the pool stays full, as an exact LRU cache of its bytes would.
  double eviction_slack = 0.001;
  // Background eviction, off by default (1.0): when used/capacity exceeds this, the sweeper
  // evicts ...
  double eviction_high_watermark = 1.0;
  // ... this fraction of the capacity, so that puts find free space without evicting.
  double eviction_ratio = 0.05;
  // A put started and neither ended nor revoked after this long is revoked.
  std::chrono::milliseconds put_timeout{30000};
  size_t max_key_size = 4096;  // at most kMaxKeyBytes (65535)
  PlacementStrategy placement = PlacementStrategy::kLocalHostFirst;
  // Number of metadata shards (each has its own lock).
  size_t shards = 64;
  // Every replica starts at a multiple of this many bytes within its segment.
  uint64_t allocation_alignment = 64;
  // How often the background sweeper runs liveness, zombie-put and watermark checks.
  std::chrono::milliseconds sweep_interval{100};
  // A soft pin asked without a TTL (PutOptions::soft_pin_ttl absent) lasts this long.
  std::chrono::milliseconds default_soft_pin_ttl{std::chrono::minutes(30)};
  // The longest soft pin a put may ask for; a longer one is refused (InvalidArgument).
  std::chrono::milliseconds max_soft_pin_ttl{std::chrono::hours(24)};
  // Whether eviction may take soft-pinned objects (oldest first) once no unpinned object is left
  // to evict. false: soft-pinned objects are evicted only after their pin ran out.
  bool evict_soft_pinned = true;
  // Whether /metrics also has series per client engine (larder_client_*{client, peer, route}).
  // Their labels are engine ids, which hold a pid and a per-process key: every restart of a
  // client starts new series. false: only the totals by route and locality.
  bool metrics_per_client = false;
  // The disk tier's master side (disk_tier.h): idle until a holder polls.
  DiskTierOptions disk = {};
  // Time source; tests substitute a fake clock.
  std::function<Clock::time_point()> clock = [] { return Clock::now(); };
};

// One committed object in a segment, as the segment's owner keeps it in its catalog (see
// MasterState::SyncCatalog) and reports it when it mounts the segment again (SegmentMount).
struct CatalogEntry {
  std::string key;  // the master's key (tenant prefix included)
  uint64_t offset = 0;
  uint64_t size = 0;
  bool pinned = false;
  uint64_t soft_pin_remaining_ms = 0;  // 0: not soft-pinned
  // The master's access tick when the object was last reported used (ADD, TOUCH): orders
  // eviction after a rebuild. Comparable only between entries of one master lineage.
  uint64_t last_access = 0;
};

// A segment a client asks the master to place replicas in.
struct SegmentMount {
  std::string name;   // unique in the cluster
  uint64_t base = 0;  // owner's address of byte 0; ranges of one client may not overlap
  uint64_t size = 0;  // > 0
  // The owner engine's descriptor, handed to readers and writers as is; checked by the service to
  // be the mounting client's own (service.cc, OwnMount).
  SegmentDescriptor descriptor = {};
  // The committed objects the owner holds in the segment, as it learnt them from the master
  // incarnation `catalog_incarnation` (0: unknown). A master rebuilds them from a catalog of
  // another incarnation; one of its own is ignored (see MasterState::MountSegments).
  std::vector<CatalogEntry> catalog = {};
  uint64_t catalog_incarnation = 0;
  // The owner checks its catalog against its own memory before it reports it (see
  // CatalogFeed::Hold): a removed object's range may then be reused at once.
  bool verifies_catalog = false;
};

// Who mounts: the calling client and its process.
struct MountCaller {
  std::string client_id;
  std::string host_id;
  uint32_t pid = 0;  // the caller's process id on host_id; 0: not said
  // The pid of the client that holds a segment name the caller asks for, as a refused mount
  // reported it (MountOutcome::holder_pid): the caller says that process is gone. 0: none.
  uint32_t take_over_pid = 0;
};

// What a mount rebuilt from one segment's catalog.
struct CatalogRecovery {
  uint64_t restored = 0;  // objects, or replicas of objects already known, rebuilt
  uint64_t dropped = 0;   // entries refused (see MasterState::MountSegments)
};

// What MasterState::MountSegments did with one segment.
struct MountOutcome {
  Status status;  // OK: mounted as segment_id
  PoolSegmentId segment_id = 0;
  CatalogRecovery recovery;
  // With AlreadyExists because another client holds the name: that client's host and pid.
  std::string holder_host_id;
  uint32_t holder_pid = 0;
};

// What happened to one object of a segment's catalog. Values as proto::CatalogChange::Kind.
enum class CatalogChangeKind : uint8_t {
  kAdd = 0,     // committed at entry.offset (replaces any entry there)
  kRemove = 1,  // the object entry.key at entry.offset is gone
  kTouch = 2,   // the object entry.key at entry.offset was used at tick entry.last_access
};

struct CatalogChange {
  uint64_t seq = 0;  // of its segment's log; increasing, never reused
  CatalogChangeKind kind = CatalogChangeKind::kAdd;
  CatalogEntry entry;
};

// The changes of one segment's catalog that a client has not acknowledged yet.
struct SegmentCatalogChanges {
  PoolSegmentId segment_id = 0;
  // The changes rebuild the catalog from nothing: drop every entry held first (asked for with
  // CatalogAck::full, or the log was cut short). The reset's first changes are a snapshot of the
  // segment's objects (ADDs), later ones what happened since; a long reset goes on over several
  // replies, with reset set in the first only.
  bool reset = false;
  std::vector<CatalogChange> changes;  // in seq order, each one above the one before
  bool more = false;                   // more changes wait: ask again at once
  // The seq of the last change this reply covers (with reset, what the catalog is current to,
  // even when it holds no change): the next change is last_seq + 1. Acknowledge it.
  uint64_t last_seq = 0;
};

// A client's acknowledgement: it applied every change of the segment's log up to `seq`.
struct CatalogAck {
  PoolSegmentId segment_id = 0;
  uint64_t seq = 0;  // 0: none yet
  // Send the whole catalog (a reset) instead of the changes after `seq`: after a mount that
  // rebuilt objects from the client's catalog, to learn which were kept, or after the client
  // found a reply it cannot apply. Ignored while a reset it has not received is under way.
  bool full = false;
};

struct SegmentView {
  PoolSegmentId segment_id = 0;
  std::string name;
  std::string client_id;
  std::string host_id;
  uint64_t base = 0;
  uint64_t size = 0;
  uint64_t used = 0;
  uint64_t objects = 0;
  SegmentDescriptor descriptor;  // as mounted (SegmentMount::descriptor)
  bool draining = false;         // an operator's drain: no put places a replica here
  // Its owner's disk directory was taken over (MasterState::MarkReplaced): no put places a
  // replica here until the owner heartbeats again.
  bool owner_replaced = false;
};

// An object as an operator's listing of one segment gives it.
struct SegmentObject {
  std::string key;  // the whole key (a tenant's keys start with its prefix)
  uint64_t size = 0;
  uint32_t replicas = 0;  // in all segments
  bool pinned = false;
};

struct ReplicaLocation {
  PoolSegmentId segment_id = 0;
  uint64_t offset = 0;
};

// Most replicas one object may have.
inline constexpr uint32_t kMaxReplicas = 64;

struct PutOptions {
  uint32_t replica_num = 1;                     // 1..kMaxReplicas
  std::vector<std::string> preferred_segments;  // names, tried in order before the strategy
  std::vector<uint64_t> avoid_segments;  // ids the writer cannot reach: left out if others suffice
  // Hard pin: never evicted (removal still works). An upsert keeps the replaced object's pin.
  bool pin = false;
  // Soft pin: evicted only after every unpinned object, until its deadline (see
  // MasterOptions::evict_soft_pinned). Default: kPreserve.
  SoftPinAction soft_pin_action = SoftPinAction::kPreserve;
  // Only with kEnable (otherwise InvalidArgument); at most MasterOptions::max_soft_pin_ttl.
  // Absent: MasterOptions::default_soft_pin_ttl. Zero: no soft pin. Default: absent.
  std::optional<std::chrono::milliseconds> soft_pin_ttl;
  // A key stored and complete is replaced by the new value instead of being kept (its old
  // replicas are freed once no reader can be copying them). Default: false (objects immutable).
  bool upsert = false;
};

// Replica locations of one object. Most objects have one or two replicas, which are then held
// without an allocation of their own.
using ReplicaLocations = absl::InlinedVector<ReplicaLocation, 2>;

struct PutStartItem {
  std::string_view key;  // the caller's memory, valid for the duration of the call
  uint64_t size = 0;
};

struct PutStartOutcome {
  Status status;
  bool already_exists = false;  // OK and nothing to write: the key is stored or being stored
  ReplicaLocations replicas;
};

struct GetOutcome {
  Status status;
  uint64_t size = 0;
  ReplicaLocations replicas;
};

enum class GetMode {
  kLease,  // a read: every object found is leased (and counts as a use for LRU)
  kPeek,   // metadata only (GetSize): no lease, no use
  // A lease that is no use: a disk holder reading an object to demote it, which must not make
  // the object recently used.
  kLeaseQuiet,
};

// What BatchGetReplicas answers: one outcome per key, and the lease that holds every object found.
struct GetBatch {
  std::vector<GetOutcome> items;
  // Release with MasterState::ReleaseLeases once the copy has ended. 0: no lease (nothing found,
  // or GetMode::kPeek).
  uint64_t lease_id = 0;
  std::chrono::milliseconds lease_ttl{0};  // the lease ends by itself this long after the call
};

struct HeartbeatOutcome {
  bool remount_required = false;
  uint64_t segments_version = 0;  // see MasterState::segments_version
};

// A client's transfer counters with one peer on one route, as its heartbeat reported them.
struct RouteTrafficReport {
  std::string peer_client_id;
  std::string route;
  uint64_t requests = 0;
  uint64_t bytes = 0;
  uint64_t failures = 0;
};

// A level one of a client's transports keeps now, as its heartbeat reported it.
struct TransportGaugeReport {
  std::string transport;
  std::string name;  // [a-z0-9_]+: the metric larder_client_<name>
  uint64_t value = 0;
};

// What a client's heartbeats say about its data path.
struct ClientTraffic {
  std::vector<RouteTrafficReport> routes;
  std::vector<TransportGaugeReport> gauges;  // distinct names, in the order reported
  // The value of the gauge `name`, 0 when the client did not report it.
  uint64_t Gauge(std::string_view name) const {
    for (const TransportGaugeReport& gauge : gauges) {
      if (gauge.name == name) return gauge.value;
    }
    return 0;
  }
};

// Bounds on a heartbeat's report; a report past them is cut, never trusted to be small.
inline constexpr size_t kMaxTrafficEntries = 1024;
inline constexpr size_t kMaxTrafficLabelBytes = 256;
inline constexpr size_t kMaxTransportGauges = 64;
inline constexpr size_t kMaxGaugeNameBytes = 64;

// Bounds on what one request may ask, checked before any work is done for it.
inline constexpr size_t kMaxNameBytes = 256;        // client ids, host ids, segment names
inline constexpr size_t kMaxSegmentsPerMount = 64;  // also catalog acks of one SyncCatalog
inline constexpr size_t kMaxPreferredSegments = 64;
// Largest segment (64 TiB, the most a process's address space maps) and the largest pool.
inline constexpr uint64_t kMaxSegmentBytes = 1ULL << 46;
inline constexpr uint64_t kMaxPoolBytes = 1ULL << 60;

// A key as errors quote it: at most its first 64 bytes, with anything that is not printable
// ASCII escaped as \xNN, in quotes, and its length when it was cut: 'abc'... (70000 bytes).
std::string QuoteKey(std::string_view key);
// InvalidArgument when a call carries more than kMaxBatchKeys `what`s.
Status CheckBatchSize(size_t items, const char* what);

// Tenants are key namespaces: the keys of tenant T (non-empty) are "\0" + T + "\0" + key; the
// default tenant's ("") are the keys that do not start with '\0', and "\0\0" + key for a key
// that does. A tenant name has at most kMaxTenantBytes bytes and no '\0'.
inline constexpr size_t kMaxTenantBytes = 128;
// Longest pattern RemoveByRegex accepts.
inline constexpr size_t kMaxRegexBytes = 4096;

// InvalidArgument unless `tenant` is a valid tenant name ("" is the default tenant).
Status ValidateTenant(std::string_view tenant);
// The key without its tenant prefix when `key` belongs to `tenant`, nullopt otherwise.
// REQUIRES: ValidateTenant(tenant).ok().
std::optional<std::string_view> KeyInTenant(std::string_view key, std::string_view tenant);

struct RemoveAllOutcome {
  uint64_t removed = 0;         // leased objects removed by a forced call included
  uint64_t skipped_leased = 0;  // leased objects left in place (calls without force)
};

struct MasterStats {
  uint64_t objects = 0;
  uint64_t soft_pinned_objects = 0;  // complete objects with a soft pin that has not run out
  uint64_t bytes_used = 0;
  uint64_t bytes_capacity = 0;
  uint64_t segments = 0;
  uint64_t clients = 0;
  uint64_t puts = 0;
  uint64_t gets = 0;
  uint64_t get_misses = 0;
  uint64_t lookups = 0;        // keys asked of BatchExist, hit or miss
  uint64_t lookup_misses = 0;  // of those, absent or incomplete
  uint64_t removes = 0;
  uint64_t evictions = 0;
  uint64_t evicted_bytes = 0;
  uint64_t lease_expiries = 0;          // leases that were never released and ran out
  uint64_t lease_releases = 0;          // leases released by their reader
  uint64_t lease_releases_unknown = 0;  // releases of ids not held (twice, expired, restart)
  uint64_t lease_releases_refused = 0;  // releases by a client that does not hold the lease
  uint64_t leases_active = 0;           // granted, neither released nor expired
  uint64_t put_refusals_no_space = 0;   // ResourceExhausted: nothing evictable
  uint64_t put_refusals_invalid = 0;    // InvalidArgument: key, size, replicas, duplicates
  uint64_t eviction_runs = 0;           // calls of Evict that looked for victims
  uint64_t eviction_scanned = 0;        // objects those runs examined
  double evictions_per_second = 0;      // over the last 10 s (sampled by the sweeper)
  uint64_t put_revokes = 0;
  uint64_t client_expiries = 0;
  uint64_t incarnation = 0;
  uint64_t recovered_objects = 0;        // objects and replicas rebuilt from catalogs
  uint64_t catalog_entries_dropped = 0;  // catalog entries refused by a rebuild
  uint64_t catalog_resets = 0;           // catalog logs cut short: resent whole
};

}  // namespace larder::master
