// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// A store client's catalog of the committed objects in its own segment: key, offset, size, pin
// state and a last-access hint, kept current from the master's SyncCatalog replies. The bytes of
// those objects live in this process's memory, so the catalog is what lets a new master
// incarnation (after a failover or a restart) rebuild them instead of losing them
// (docs/store.md, "High availability").
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "common/mutex.h"
#include "larder/status.h"
#include "master.pb.h"

namespace larder::client {

// Thread-safe.
class SegmentCatalog {
 public:
  using Clock = std::chrono::steady_clock;

  // Applies one reply's changes for this segment, which the master numbered from `seq()` on.
  // A change whose number is not the next one is refused (Internal: the reply cannot be trusted)
  // and nothing after it is applied. `incarnation` is the master's that sent them.
  Status Apply(const proto::SegmentCatalogChanges& changes, uint64_t incarnation);

  // The catalog as a mount reports it: the entries, and the incarnation they came from.
  void Fill(proto::SegmentInfo* segment) const;

  // A new master segment (a mount): numbering restarts. The entries stay until the master's
  // first reply replaces them (reset), so that a second failover before that loses nothing.
  void Restart();

  uint64_t seq() const;
  size_t size() const;
  uint64_t incarnation() const;

 private:
  struct Entry {
    std::string key;
    uint64_t size = 0;
    bool pinned = false;
    Clock::time_point soft_pin_until{};  // epoch: none
    uint64_t last_access = 0;
  };

  mutable Mutex mu_;
  std::unordered_map<uint64_t, Entry> entries_ LARDER_GUARDED_BY(mu_);  // by offset
  uint64_t seq_ LARDER_GUARDED_BY(mu_) = 0;
  uint64_t incarnation_ LARDER_GUARDED_BY(mu_) = 0;
};

}  // namespace larder::client
