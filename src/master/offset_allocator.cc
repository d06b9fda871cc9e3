// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/offset_allocator.h"

#include <bit>
#include <cassert>

namespace larder::master {

// Size classes: sizes below 8 units have one class each (first level 0); from 8 units up, the
// first level is the position of the highest bit and the second level the next three bits, so a
// class spans at most 1/8 of its sizes. A range is filed under the class of its size rounded down;
// a request searches from the class of its size rounded up, so any range found there fits.
uint32_t OffsetAllocator::ClassOf(uint64_t units) {
  if (units < kSubLists) return static_cast<uint32_t>(units);
  uint32_t msb = 63 - static_cast<uint32_t>(std::countl_zero(units));
  uint32_t first = msb - kSubBits + 1;
  uint32_t second = static_cast<uint32_t>(units >> (msb - kSubBits)) & (kSubLists - 1);
  return first * kSubLists + second;
}

uint64_t OffsetAllocator::RoundUpToClass(uint64_t units) {
  if (units < kSubLists) return units;
  uint32_t msb = 63 - static_cast<uint32_t>(std::countl_zero(units));
  uint64_t step = uint64_t{1} << (msb - kSubBits);
  return (units + step - 1) & ~(step - 1);
}

OffsetAllocator::OffsetAllocator(uint64_t capacity, uint64_t alignment)
    : alignment_(alignment),
      alignment_shift_(static_cast<uint32_t>(std::countr_zero(alignment))),
      units_total_(capacity >> alignment_shift_),
      units_free_(0) {
  assert(std::has_single_bit(alignment));
  for (uint32_t& head : heads_) head = kNone;
  if (units_total_ == 0) return;
  uint32_t node = NewNode();
  nodes_[node].offset = 0;
  nodes_[node].size = units_total_;
  nodes_[node].free = true;
  InsertFree(node);
  units_free_ = units_total_;
}

uint32_t OffsetAllocator::NewNode() {
  uint32_t index;
  if (!spare_nodes_.empty()) {
    index = spare_nodes_.back();
    spare_nodes_.pop_back();
    nodes_[index] = Node{};
  } else {
    index = static_cast<uint32_t>(nodes_.size());
    nodes_.emplace_back();
  }
  nodes_[index].in_use = true;
  return index;
}

void OffsetAllocator::ReleaseNode(uint32_t index) {
  nodes_[index].in_use = false;
  spare_nodes_.push_back(index);
}

void OffsetAllocator::InsertFree(uint32_t index) {
  Node& node = nodes_[index];
  uint32_t cls = ClassOf(node.size);
  node.prev_free = kNone;
  node.next_free = heads_[cls];
  if (heads_[cls] != kNone) nodes_[heads_[cls]].prev_free = index;
  heads_[cls] = index;
  top_bitmap_ |= uint64_t{1} << (cls / kSubLists);
  sub_bitmap_[cls / kSubLists] |= static_cast<uint8_t>(1u << (cls % kSubLists));
}

void OffsetAllocator::RemoveFree(uint32_t index) {
  Node& node = nodes_[index];
  uint32_t cls = ClassOf(node.size);
  if (node.prev_free != kNone) {
    nodes_[node.prev_free].next_free = node.next_free;
  } else {
    heads_[cls] = node.next_free;
  }
  if (node.next_free != kNone) nodes_[node.next_free].prev_free = node.prev_free;
  node.prev_free = node.next_free = kNone;
  if (heads_[cls] == kNone) {
    sub_bitmap_[cls / kSubLists] &= static_cast<uint8_t>(~(1u << (cls % kSubLists)));
    if (sub_bitmap_[cls / kSubLists] == 0) top_bitmap_ &= ~(uint64_t{1} << (cls / kSubLists));
  }
}

uint32_t OffsetAllocator::FindFree(uint32_t min_class) const {
  uint32_t first = min_class / kSubLists;
  uint32_t sub_mask = sub_bitmap_[first] & (~0u << (min_class % kSubLists)) & 0xffu;
  if (sub_mask != 0) return heads_[first * kSubLists + std::countr_zero(sub_mask)];
  if (first + 1 >= 64) return kNone;
  uint64_t top_mask = top_bitmap_ & (~uint64_t{0} << (first + 1));
  if (top_mask == 0) return kNone;
  first = static_cast<uint32_t>(std::countr_zero(top_mask));
  return heads_[first * kSubLists + std::countr_zero(static_cast<uint32_t>(sub_bitmap_[first]))];
}

std::optional<OffsetAllocator::Allocation> OffsetAllocator::Allocate(uint64_t size) {
  if (size == 0) return std::nullopt;
  uint64_t units = (size + alignment_ - 1) >> alignment_shift_;
  if (units > units_free_) return std::nullopt;
  uint64_t search = RoundUpToClass(units);
  uint32_t index = search > units_total_ ? kNone : FindFree(ClassOf(search));
  if (index == kNone) {
    // The class of `units` itself may hold a range that fits (the rounded-up search skips it);
    // look at a bounded number of its entries so that, e.g., a request for the whole free space
    // still succeeds.
    uint32_t candidate = heads_[ClassOf(units)];
    for (int i = 0; i < 16 && candidate != kNone; ++i, candidate = nodes_[candidate].next_free) {
      if (nodes_[candidate].size >= units) {
        index = candidate;
        break;
      }
    }
    if (index == kNone) return std::nullopt;
  }
  RemoveFree(index);
  if (nodes_[index].size > units) SplitOff(index, units);  // the tail stays free
  nodes_[index].free = false;
  units_free_ -= units;
  ++live_;
  return Allocation{nodes_[index].offset << alignment_shift_, index};
}

uint32_t OffsetAllocator::SplitOff(uint32_t index, uint64_t units) {
  uint32_t rest = NewNode();  // may reallocate nodes_: index, not references, from here on
  nodes_[rest].offset = nodes_[index].offset + units;
  nodes_[rest].size = nodes_[index].size - units;
  nodes_[rest].free = true;
  nodes_[rest].prev_phys = index;
  nodes_[rest].next_phys = nodes_[index].next_phys;
  if (nodes_[index].next_phys != kNone) nodes_[nodes_[index].next_phys].prev_phys = rest;
  nodes_[index].next_phys = rest;
  nodes_[index].size = units;
  InsertFree(rest);
  return rest;
}

// Node 0 always holds offset 0: the constructor creates it, a split keeps the front part in the
// node split, and a free that coalesces keeps the lower node. So a walk can start there.
uint32_t OffsetAllocator::NodeHolding(uint64_t unit) const {
  uint32_t index = 0;
  if (reserve_hint_ < nodes_.size() && nodes_[reserve_hint_].in_use &&
      nodes_[reserve_hint_].offset <= unit) {
    index = reserve_hint_;
  }
  while (nodes_[index].offset + nodes_[index].size <= unit) index = nodes_[index].next_phys;
  return index;
}

std::optional<OffsetAllocator::Allocation> OffsetAllocator::Reserve(uint64_t offset,
                                                                    uint64_t size) {
  if (size == 0 || (offset & (alignment_ - 1)) != 0) return std::nullopt;
  const uint64_t start = offset >> alignment_shift_;
  if (start >= units_total_ || size > (units_total_ - start) << alignment_shift_) {
    return std::nullopt;
  }
  const uint64_t units = (size + alignment_ - 1) >> alignment_shift_;
  uint32_t index = NodeHolding(start);
  if (!nodes_[index].free || nodes_[index].offset + nodes_[index].size < start + units) {
    return std::nullopt;
  }
  RemoveFree(index);
  if (nodes_[index].offset < start) {
    // The part below the range stays free, in this node; the range moves to the node split off.
    uint32_t front = index;
    index = SplitOff(front, start - nodes_[front].offset);
    RemoveFree(index);
    InsertFree(front);  // filed again under the class of its new size
  }
  if (nodes_[index].size > units) {
    reserve_hint_ = SplitOff(index, units);
  } else {
    reserve_hint_ = nodes_[index].next_phys;
  }
  nodes_[index].free = false;
  units_free_ -= units;
  ++live_;
  return Allocation{offset, index};
}

void OffsetAllocator::Free(Handle handle) {
  assert(handle < nodes_.size() && nodes_[handle].in_use && !nodes_[handle].free);
  uint32_t index = handle;
  units_free_ += nodes_[index].size;
  --live_;
  uint32_t next = nodes_[index].next_phys;
  if (next != kNone && nodes_[next].free) {
    RemoveFree(next);
    nodes_[index].size += nodes_[next].size;
    nodes_[index].next_phys = nodes_[next].next_phys;
    if (nodes_[next].next_phys != kNone) nodes_[nodes_[next].next_phys].prev_phys = index;
    ReleaseNode(next);
  }
  uint32_t prev = nodes_[index].prev_phys;
  if (prev != kNone && nodes_[prev].free) {
    RemoveFree(prev);
    nodes_[prev].size += nodes_[index].size;
    nodes_[prev].next_phys = nodes_[index].next_phys;
    if (nodes_[index].next_phys != kNone) nodes_[nodes_[index].next_phys].prev_phys = prev;
    ReleaseNode(index);
    index = prev;
  }
  nodes_[index].free = true;
  InsertFree(index);
}

}  // namespace larder::master
