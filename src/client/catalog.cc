// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "client/catalog.h"

#include <algorithm>

namespace larder::client {

Status SegmentCatalog::Apply(const proto::SegmentCatalogChanges& changes, uint64_t incarnation) {
  const Clock::time_point now = Clock::now();
  MutexLock lock(mu_);
  if (changes.reset()) entries_.clear();
  incarnation_ = incarnation;
  for (const proto::CatalogChange& change : changes.changes()) {
    if (!changes.reset() && change.seq() != seq_ + 1) {
      return InternalError("larder-master sent catalog change " + std::to_string(change.seq()) +
                           " where " + std::to_string(seq_ + 1) + " was next");
    }
    if (!changes.reset()) seq_ = change.seq();
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
  if (changes.reset()) seq_ = changes.last_seq();
  return Status::Ok();
}

void SegmentCatalog::Fill(proto::SegmentInfo* segment) const {
  const Clock::time_point now = Clock::now();
  MutexLock lock(mu_);
  segment->set_catalog_incarnation(incarnation_);
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
