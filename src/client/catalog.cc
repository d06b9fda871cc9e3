// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "client/catalog.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <random>
#include <vector>

namespace larder::client {

namespace {

// A secret of this process: no peer can choose bytes whose identity matches another object's.
uint64_t RandomSeed() {
  std::random_device random;
  return (uint64_t{random()} << 32) ^ random();
}

}  // namespace

SegmentCatalog::SegmentCatalog(std::span<const uint8_t> memory)
    : memory_(memory), seed_(RandomSeed()) {}

std::optional<uint64_t> SegmentCatalog::IdentityOf(uint64_t offset, uint64_t size) const {
  if (!verifies() || offset > memory_.size() || size > memory_.size() - offset) {
    return std::nullopt;
  }
  return XXH3_64bits_withSeed(memory_.data() + offset, size, seed_);
}

Status SegmentCatalog::Apply(const proto::SegmentCatalogChanges& changes, uint64_t incarnation) {
  const Clock::time_point now = Clock::now();
  std::vector<uint64_t> added;  // offsets of the ADDs applied
  MutexLock lock(mu_);
  // The identities of what this reply added and left in place (an object removed in the same
  // reply costs nothing), read now: the master reuses a range at once only once the ADD is
  // acknowledged, which follows this Apply, so each range still holds its object's bytes.
  auto identify_added = [&]() LARDER_REQUIRES(mu_) {
    for (uint64_t offset : added) {
      auto it = entries_.find(offset);
      if (it == entries_.end() || it->second.has_identity) continue;
      std::optional<uint64_t> noted_identity;
      {
        MutexLock noted_lock(noted_mu_);
        if (auto noted = noted_.find(offset); noted != noted_.end()) {
          if (noted->second.key == it->second.key && noted->second.size == it->second.size) {
            noted_identity = noted->second.identity;
          }
          noted_.erase(noted);
        }
      }
      if (noted_identity) {
        it->second.has_identity = true;
        it->second.identity = *noted_identity;
        continue;
      }
      const std::optional<uint64_t> identity = IdentityOf(offset, it->second.size);
      it->second.has_identity = identity.has_value();
      it->second.identity = identity.value_or(0);
    }
  };
  if (changes.touch_offset_size() != changes.touch_last_access_size()) {
    return InternalError("larder-master sent TOUCH columns of different lengths");
  }
  if (changes.reset()) entries_.clear();
  incarnation_ = incarnation;
  // TOUCHes sent apart fill, in order, the seqs that the changes leave out.
  uint64_t touches_left = static_cast<uint64_t>(changes.touch_offset_size());
  for (const proto::CatalogChange& change : changes.changes()) {
    if (!changes.reset()) {
      if (change.seq() <= seq_ || change.seq() - seq_ - 1 > touches_left) {
        identify_added();
        return InternalError("larder-master sent catalog change " + std::to_string(change.seq()) +
                             " where " + std::to_string(seq_ + 1) + " was next");
      }
      touches_left -= change.seq() - seq_ - 1;
      seq_ = change.seq();
    }
    const proto::CatalogEntry& in = change.entry();
    switch (change.kind()) {
      case proto::CatalogChange::ADD: {
        Entry& entry = entries_[in.offset()];
        entry.key = in.key();
        entry.size = in.size();
        entry.pinned = in.pinned();
        entry.soft_pin_until = in.soft_pin_remaining_ms() > 0
                                   ? now + std::chrono::milliseconds(in.soft_pin_remaining_ms())
                                   : Clock::time_point{};
        entry.last_access = in.last_access();
        entry.has_identity = false;
        added.push_back(in.offset());
        break;
      }
      case proto::CatalogChange::REMOVE: {
        auto it = entries_.find(in.offset());
        if (it != entries_.end() && it->second.key == in.key()) entries_.erase(it);
        break;
      }
      case proto::CatalogChange::TOUCH: {
        auto it = entries_.find(in.offset());
        if (it != entries_.end()) {
          it->second.last_access = std::max(it->second.last_access, in.last_access());
        }
        break;
      }
      default:
        break;  // a kind this client does not know changes nothing it holds
    }
  }
  if (!changes.reset() && touches_left > 0) {
    if (changes.last_seq() != seq_ + touches_left) {
      identify_added();
      return InternalError("larder-master sent " + std::to_string(touches_left) +
                           " TOUCHes after catalog change " + std::to_string(seq_) +
                           " to fill up to " + std::to_string(changes.last_seq()));
    }
    seq_ = changes.last_seq();
  }
  // A TOUCH keeps the larger tick of the entry at its offset: applied after the changes it was
  // logged among, it ends where it would have in order (a late one's tick is older than any ADD
  // that reused its offset since).
  for (int i = 0; i < changes.touch_offset_size(); ++i) {
    auto it = entries_.find(changes.touch_offset(i));
    if (it != entries_.end()) {
      it->second.last_access = std::max(it->second.last_access, changes.touch_last_access(i));
    }
  }
  if (changes.reset()) seq_ = changes.last_seq();
  identify_added();
  return Status::Ok();
}

size_t SegmentCatalog::Fill(proto::SegmentInfo* segment) {
  const Clock::time_point now = Clock::now();
  MutexLock lock(mu_);
  segment->set_catalog_incarnation(incarnation_);
  segment->set_verifies_catalog(verifies());
  size_t stale = 0;
  if (verifies()) {
    stale = std::erase_if(entries_, [this](const auto& item) {
      const auto& [offset, entry] = item;
      return !entry.has_identity || IdentityOf(offset, entry.size) != entry.identity;
    });
  }
  segment->mutable_catalog()->Reserve(static_cast<int>(entries_.size()));
  for (const auto& [offset, entry] : entries_) {
    proto::CatalogEntry* out = segment->add_catalog();
    out->set_key(entry.key);
    out->set_offset(offset);
    out->set_size(entry.size);
    out->set_pinned(entry.pinned);
    if (entry.soft_pin_until > now) {
      out->set_soft_pin_remaining_ms(static_cast<uint64_t>(
          std::chrono::ceil<std::chrono::milliseconds>(entry.soft_pin_until - now).count()));
    }
    out->set_last_access(entry.last_access);
  }
  return stale;
}

void SegmentCatalog::Note(uint64_t offset, std::string_view key, uint64_t size) {
  const std::optional<uint64_t> identity = IdentityOf(offset, size);  // outside the lock
  if (!identity) return;
  MutexLock lock(noted_mu_);
  if (noted_.size() >= kMaxNoted) noted_.clear();  // puts whose ADD never came (revoked, failed)
  noted_[offset] = Noted{std::string(key), size, *identity};
}

void SegmentCatalog::Restart() {
  MutexLock lock(mu_);
  seq_ = 0;
}

uint64_t SegmentCatalog::seq() const {
  MutexLock lock(mu_);
  return seq_;
}

size_t SegmentCatalog::size() const {
  MutexLock lock(mu_);
  return entries_.size();
}

uint64_t SegmentCatalog::incarnation() const {
  MutexLock lock(mu_);
  return incarnation_;
}

}  // namespace larder::client
