// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// A store client's standing with larder-master: it waits for a master (or its cluster's leader)
// to answer, mounts the client's segment, heartbeats, keeps the segment's catalog current, and
// mounts again with that catalog when the master forgot the client or a new master incarnation
// took over (a failover or a restart), so that the objects in the segment survive
// (docs/store.md, "High availability"). The put and get paths only ask it to remount.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "client/catalog.h"
#include "client/master_client.h"
#include "common/mutex.h"
#include "larder/status.h"
#include "larder/transfer_engine.h"

namespace larder::client {

struct MasterMembershipOptions {
  std::string client_id;
  std::string host_id;
  // The segment this client contributes; null when it contributes none.
  std::shared_ptr<MemoryRegion> segment_memory;
  std::string segment_name;
  SegmentDescriptor descriptor;  // the engine's, of that segment
  // Longest time between heartbeats; shortened to a third of the master's client TTL.
  std::chrono::milliseconds heartbeat_interval{1000};
  // How long Start waits for a master to answer before it fails.
  std::chrono::milliseconds connect_timeout{30000};
  // How often the catalog is brought up to date.
  std::chrono::milliseconds catalog_sync_interval{200};
  // Fills a heartbeat's traffic report.
  std::function<void(proto::HeartbeatRequest*)> add_traffic;
  // Called after every mount: segment ids of an earlier master incarnation mean nothing now.
  std::function<void()> on_mount;
  // Called when the master's segments changed (one was unmounted, or lost with its owner);
  // returns false when it could not find out which.
  std::function<bool()> on_segments_changed;
};

// Thread-safe.
class MasterMembership {
 public:
  MasterMembership(const MasterClient* master, MasterMembershipOptions options);
  // Stop(), when Start succeeded.
  ~MasterMembership();
  MasterMembership(const MasterMembership&) = delete;
  MasterMembership& operator=(const MasterMembership&) = delete;

  // Mounts, waiting up to options.connect_timeout for a master that answers (logging what it
  // waits for), and starts the heartbeat thread. A segment name held by a previous process of
  // this client that is provably gone is taken over. Errors: the last mount's, with context.
  Status Start();
  // Stops the thread and leaves the master (unmounts and unregisters). Idempotent.
  void Stop();

  // Bumped by every mount. A call that finds the master does not know the client remounts with
  // Remount(the generation it saw), so that racing callers mount once.
  uint64_t generation() const { return generation_.load(); }
  Status Remount(uint64_t seen_generation);

  // The master's id of this client's segment (0: none).
  uint64_t segment_id() const;
  const SegmentCatalog& catalog() const { return catalog_; }
  // This process wrote an object into its own segment (see SegmentCatalog::Note).
  void NoteWritten(uint64_t offset, std::string_view key, uint64_t size) {
    catalog_.Note(offset, key, size);
  }

 private:
  // One MountSegments call; the reply is left in `reply` (for a refusal's holder).
  Status MountLocked(uint32_t take_over_pid, proto::MountSegmentsReply* reply)
      LARDER_REQUIRES(mount_mu_);
  Status MountWithTakeOver();
  void Loop();
  void Heartbeat(bool* reachable, std::chrono::milliseconds* interval);
  // Brings the catalog up to date; true when the master has more changes waiting. Sets *removed
  // when the reply held REMOVEs, which the master's next sync learns were applied.
  bool SyncCatalog(bool* removed);

  const MasterClient* master_;
  const MasterMembershipOptions options_;
  SegmentCatalog catalog_;

  mutable Mutex mount_mu_;
  std::atomic<uint64_t> generation_{0};
  uint64_t segment_id_ LARDER_GUARDED_BY(mount_mu_) = 0;
  uint64_t incarnation_ LARDER_GUARDED_BY(mount_mu_) = 0;
  // Ask the whole catalog next.
  bool catalog_full_sync_ LARDER_GUARDED_BY(mount_mu_) = false;
  uint64_t segments_version_ = 0;  // the thread's

  Mutex loop_mu_;
  CondVar loop_cv_;
  bool stopping_ LARDER_GUARDED_BY(loop_mu_) = false;
  bool started_ LARDER_GUARDED_BY(loop_mu_) = false;
  std::thread thread_;
};

}  // namespace larder::client
