// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "larder/status.h"
#include "master/offset_allocator.h"
#include "master/types.h"

namespace larder::master {

// One replica as the master stores it: where it is and the allocator handle that frees it.
struct StoredReplica {
  PoolSegmentId segment_id = 0;
  uint64_t offset = 0;
  OffsetAllocator::Handle handle = OffsetAllocator::kInvalidHandle;
  // The low 32 bits of the sequence number of the object's last ADD in its segment's catalog log
  // (0: none known), which decides whether the range may be reused at once when the object goes
  // (CatalogFeed::Hold). Fills what would otherwise be padding.
  uint32_t added = 0;
};
static_assert(sizeof(StoredReplica) == 24);

// A range of bytes in a segment.
struct ByteRange {
  uint64_t offset = 0;
  uint64_t size = 0;
};

// What SegmentTable::Mount does to a new segment before any put can place a replica in it.
struct MountPreparation {
  // Ranges to take in its allocator (as OffsetAllocator::Reserve; fastest in ascending order).
  std::span<const ByteRange> reserve;
  // Receives one allocation per range of `reserve`, nullopt where it was refused (it overlaps
  // another, or lies past the segment's end), when the mount succeeds. Should not be null when
  // `reserve` is not empty: the ranges would stay taken for good.
  std::vector<std::optional<OffsetAllocator::Allocation>>* reserved = nullptr;
  // Called with the new segment's id under the table's lock, after the ranges were taken and
  // before the segment is visible to anyone. It may take leaf locks only. May be empty.
  std::function<void(PoolSegmentId)> on_mount;
};

// The mounted segments, their offset allocators and placement.
// Thread-safe: one mutex guards the table and every allocator (allocation is O(1), and a batch
// takes it once per key).
class SegmentTable {
 public:
  // Segment ids start above `id_base`, so that ids of two master incarnations differ.
  SegmentTable(uint64_t id_base, uint64_t alignment, PlacementStrategy strategy);

  // Mounts a segment owned by client `client_slot` (mount.catalog is not looked at; see
  // `prepare`). Errors: InvalidArgument (size 0, empty name), AlreadyExists (the name is mounted,
  // or the range overlaps one of the client's segments); `prepare` is then not acted on.
  Result<PoolSegmentId> Mount(uint32_t client_slot, const std::string& client_id,
                              const std::string& host_id, const SegmentMount& mount,
                              const MountPreparation& prepare = {});

  // Who holds a segment name.
  struct NameHolder {
    PoolSegmentId segment_id = 0;
    uint32_t client_slot = 0;
    std::string client_id;
  };
  // The segment mounted under `name`, if any.
  std::optional<NameHolder> FindByName(const std::string& name) const;

  // Forgets the segment; its allocations vanish with it. Errors: NotFound (unknown id),
  // PermissionDenied (another client's segment).
  Status Unmount(PoolSegmentId id, uint32_t client_slot);

  std::vector<PoolSegmentId> SegmentsOf(uint32_t client_slot) const;

  // An operator's drain: while a segment drains, MakePlan leaves it out, so that no put places a
  // replica there; what it holds stays readable. Errors: NotFound (unknown id).
  Status SetDraining(PoolSegmentId id, bool draining);
  // Leaves the segments of a client out of MakePlan, or takes them back
  // (MasterState::MarkReplaced).
  void SetOwnerReplaced(uint32_t client_slot, bool replaced);

  // The order in which segments are tried for one writer's puts (OrderPlacement over the segments
  // mounted now and not draining). One plan serves a whole batch.
  struct Plan {
    std::vector<PoolSegmentId> order;
    uint32_t replicas = 1;
  };
  Plan MakePlan(const PutOptions& options, uint32_t writer_slot,
                const std::string& writer_host) const;

  // Allocates `plan.replicas` ranges of `size` bytes on distinct segments, along the plan.
  // All or nothing. Errors: InvalidArgument (no segment could ever hold it, or fewer segments
  // than replicas), ResourceExhausted (not enough free space now: evicting may help).
  Result<std::vector<StoredReplica>> Allocate(uint64_t size, const Plan& plan);

  // Returns the ranges. Replicas on segments unmounted since are ignored.
  void Free(std::span<const StoredReplica> replicas);

  struct Usage {
    uint64_t used = 0;
    uint64_t capacity = 0;
    uint64_t segments = 0;
  };
  Usage usage() const;

  // Segments by id (all when `ids` is empty); unknown ids are skipped.
  std::vector<SegmentView> List(std::span<const PoolSegmentId> ids) const;

 private:
  struct Segment {
    SegmentView view;  // used/objects filled on demand from the allocator
    uint32_t client_slot = 0;
    OffsetAllocator allocator;
    Segment(SegmentView v, uint32_t slot, uint64_t alignment)
        : view(std::move(v)), client_slot(slot), allocator(view.size, alignment) {}
  };

  SegmentView ViewOf(const Segment& segment) const;

  const uint64_t alignment_;
  const PlacementStrategy strategy_;
  mutable Mutex mu_;
  uint64_t next_id_ LARDER_GUARDED_BY(mu_);
  std::unordered_map<PoolSegmentId, std::unique_ptr<Segment>> segments_ LARDER_GUARDED_BY(mu_);
  std::unordered_map<std::string, PoolSegmentId> by_name_ LARDER_GUARDED_BY(mu_);
  uint64_t capacity_ LARDER_GUARDED_BY(mu_) = 0;
  uint64_t largest_ LARDER_GUARDED_BY(mu_) = 0;
};

}  // namespace larder::master
