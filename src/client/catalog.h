// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// A store client's catalog of the committed objects in its own segment: key, offset, size, pin
// state and a last-access hint, kept current from the master's SyncCatalog replies. The bytes of
// those objects live in this process's memory, so the catalog is what lets a new master
// incarnation (after a failover or a restart) rebuild them instead of losing them
// (docs/store.md, "High availability").
//
// A catalog that can read its segment's memory also checks itself against it: it records an
// identity of each object's bytes (a hash keyed with a secret of this process) when it applies the
// object's ADD, and reports only the entries whose ranges still hold those bytes. The master can
// then reuse a removed object's range at once: should it fail before this catalog applied the
// REMOVE, the entry no longer matches its bytes and is dropped here, never served as the old
// object's value (see master/catalog_feed.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
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

  // `memory`: the segment's bytes, when this process can read them (not for device memory): the
  // catalog then checks itself against them (see above).
  explicit SegmentCatalog(std::span<const uint8_t> memory = {});
  bool verifies() const { return memory_.data() != nullptr; }

  // Applies one reply's changes for this segment, which the master numbered from `seq()` on.
  // A change whose number is not the next one is refused (Internal: the reply cannot be trusted)
  // and nothing after it is applied. `incarnation` is the master's that sent them.
  Status Apply(const proto::SegmentCatalogChanges& changes, uint64_t incarnation);

  // The catalog as a mount reports it: the entries, and the incarnation they came from. A
  // catalog that verifies leaves out (and forgets) every entry whose range no longer holds the
  // bytes it had when the entry was added; returns how many.
  size_t Fill(proto::SegmentInfo* segment);

  // This process wrote `size` bytes of `key` at `offset` of its own segment: their identity is
  // read now, while they are likely still in this core's cache, and used by that key's coming ADD
  // instead of reading the range again (an ADD of another key or size there reads it). At most
  // kMaxNoted are kept. No-op for a catalog that does not verify.
  void Note(uint64_t offset, std::string_view key, uint64_t size);

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
    // Of the bytes at the entry's range when it was added; none when the range is not inside
    // memory_ (such an entry is never reported by a catalog that verifies).
    bool has_identity = false;
    uint64_t identity = 0;
  };

  // The identity of `size` bytes at `offset`, or nullopt when they are not inside memory_.
  std::optional<uint64_t> IdentityOf(uint64_t offset, uint64_t size) const;

  struct Noted {
    std::string key;
    uint64_t size = 0;
    uint64_t identity = 0;
  };
  static constexpr size_t kMaxNoted = 1 << 16;

  const std::span<const uint8_t> memory_;
  const uint64_t seed_;
  mutable Mutex mu_;
  std::unordered_map<uint64_t, Entry> entries_ LARDER_GUARDED_BY(mu_);  // by offset
  // Its own lock (taken under mu_, never the other way), so that a put noting its write never
  // waits for an Apply that is hashing under mu_.
  mutable Mutex noted_mu_;
  std::unordered_map<uint64_t, Noted> noted_ LARDER_GUARDED_BY(noted_mu_);  // by offset
  uint64_t seq_ LARDER_GUARDED_BY(mu_) = 0;
  uint64_t incarnation_ LARDER_GUARDED_BY(mu_) = 0;
};

}  // namespace larder::client
