// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "client/catalog.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <vector>

namespace larder::client {
namespace {

proto::CatalogChange Change(uint64_t seq, proto::CatalogChange::Kind kind, std::string key,
                            uint64_t offset, uint64_t size = 0, uint64_t last_access = 0) {
  proto::CatalogChange change;
  change.set_seq(seq);
  change.set_kind(kind);
  change.mutable_entry()->set_key(std::move(key));
  change.mutable_entry()->set_offset(offset);
  change.mutable_entry()->set_size(size);
  change.mutable_entry()->set_last_access(last_access);
  return change;
}

// offset -> (key, size, last_access), as a mount would report the catalog.
std::map<uint64_t, std::tuple<std::string, uint64_t, uint64_t>> Reported(
    SegmentCatalog& catalog, uint64_t* incarnation = nullptr) {
  proto::SegmentInfo segment;
  catalog.Fill(&segment);
  if (incarnation != nullptr) *incarnation = segment.catalog_incarnation();
  std::map<uint64_t, std::tuple<std::string, uint64_t, uint64_t>> out;
  for (const proto::CatalogEntry& entry : segment.catalog()) {
    out[entry.offset()] = {entry.key(), entry.size(), entry.last_access()};
  }
  return out;
}

TEST(SegmentCatalogTest, AppliesAddsRemovesAndTouchesInOrder) {
  SegmentCatalog catalog;
  proto::SegmentCatalogChanges changes;
  changes.set_segment_id(7);
  *changes.add_changes() = Change(1, proto::CatalogChange::ADD, "a", 0, 100, 5);
  *changes.add_changes() = Change(2, proto::CatalogChange::ADD, "b", 128, 64, 6);
  *changes.add_changes() = Change(3, proto::CatalogChange::TOUCH, "a", 0, 0, 9);
  *changes.add_changes() = Change(4, proto::CatalogChange::REMOVE, "b", 128);
  changes.set_last_seq(4);
  ASSERT_TRUE(catalog.Apply(changes, 0xabc).ok());
  EXPECT_EQ(catalog.seq(), 4u);
  uint64_t incarnation = 0;
  auto reported = Reported(catalog, &incarnation);
  EXPECT_EQ(incarnation, 0xabcu);
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_EQ(reported[0], std::make_tuple(std::string("a"), uint64_t{100}, uint64_t{9}));
}

// TOUCHes in columns fill the seqs that the changes leave out; a late one (its object replaced at
// its offset since) leaves the newer entry's tick alone.
TEST(SegmentCatalogTest, TouchesApartFillTheSeqsBetweenChanges) {
  SegmentCatalog catalog;
  proto::SegmentCatalogChanges changes;
  *changes.add_changes() = Change(1, proto::CatalogChange::ADD, "a", 0, 100, 5);
  *changes.add_changes() = Change(2, proto::CatalogChange::ADD, "b", 128, 64, 6);
  // seq 3: TOUCH a (tick 9); seq 4: REMOVE b; seq 5: ADD c at b's offset (tick 12);
  // seqs 6 and 7: TOUCH of b logged late (tick 7), TOUCH c (tick 20)
  *changes.add_changes() = Change(4, proto::CatalogChange::REMOVE, "b", 128);
  *changes.add_changes() = Change(5, proto::CatalogChange::ADD, "c", 128, 32, 12);
  for (auto [offset, tick] : {std::pair<uint64_t, uint64_t>{0, 9}, {128, 7}, {0, 8}}) {
    changes.add_touch_offset(offset);
    changes.add_touch_last_access(tick);
  }
  changes.set_last_seq(7);
  ASSERT_TRUE(catalog.Apply(changes, 1).ok());
  EXPECT_EQ(catalog.seq(), 7u);
  auto reported = Reported(catalog);
  ASSERT_EQ(reported.size(), 2u);
  EXPECT_EQ(reported[0], std::make_tuple(std::string("a"), uint64_t{100}, uint64_t{9}));
  EXPECT_EQ(reported[128], std::make_tuple(std::string("c"), uint64_t{32}, uint64_t{12}));

  // Touches that do not fill the numbering up to last_seq, or columns of different lengths, are
  // refused: the client then asks for the whole catalog.
  proto::SegmentCatalogChanges short_of = changes;
  short_of.clear_changes();
  short_of.set_last_seq(12);  // seqs 8..12: five touches needed, three sent
  EXPECT_FALSE(catalog.Apply(short_of, 1).ok());
  proto::SegmentCatalogChanges too_many = short_of;
  too_many.set_last_seq(9);
  *too_many.add_changes() = Change(9, proto::CatalogChange::ADD, "d", 256, 8, 30);
  EXPECT_FALSE(catalog.Apply(too_many, 1).ok());  // three touches, one free seq (8)
  proto::SegmentCatalogChanges uneven;
  uneven.add_touch_offset(0);
  uneven.set_last_seq(8);
  EXPECT_FALSE(catalog.Apply(uneven, 1).ok());
}

TEST(SegmentCatalogTest, RemoveOfAnotherKeyAtTheOffsetKeepsTheEntry) {
  SegmentCatalog catalog;
  proto::SegmentCatalogChanges changes;
  *changes.add_changes() = Change(1, proto::CatalogChange::ADD, "new", 0, 10);
  *changes.add_changes() = Change(2, proto::CatalogChange::REMOVE, "old", 0);
  ASSERT_TRUE(catalog.Apply(changes, 1).ok());
  EXPECT_EQ(catalog.size(), 1u);
}

TEST(SegmentCatalogTest, AGapInTheNumberingIsRefusedAndAppliesNothingAfterIt) {
  SegmentCatalog catalog;
  proto::SegmentCatalogChanges changes;
  *changes.add_changes() = Change(1, proto::CatalogChange::ADD, "a", 0, 10);
  *changes.add_changes() = Change(3, proto::CatalogChange::ADD, "c", 64, 10);
  Status status = catalog.Apply(changes, 1);
  EXPECT_EQ(status.code(), StatusCode::kInternal) << status;
  EXPECT_EQ(catalog.seq(), 1u);
  EXPECT_EQ(catalog.size(), 1u);
}

TEST(SegmentCatalogTest, AResetReplacesEverythingAndSetsTheNumbering) {
  SegmentCatalog catalog;
  proto::SegmentCatalogChanges first;
  *first.add_changes() = Change(1, proto::CatalogChange::ADD, "stale", 0, 10);
  ASSERT_TRUE(catalog.Apply(first, 1).ok());
  catalog.Restart();
  EXPECT_EQ(catalog.seq(), 0u);
  EXPECT_EQ(catalog.size(), 1u) << "kept until the master says what it kept";

  proto::SegmentCatalogChanges reset;
  reset.set_reset(true);
  *reset.add_changes() = Change(0, proto::CatalogChange::ADD, "kept", 256, 20);
  reset.set_last_seq(41);
  ASSERT_TRUE(catalog.Apply(reset, 2).ok());
  EXPECT_EQ(catalog.seq(), 41u);
  auto reported = Reported(catalog);
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_EQ(std::get<0>(reported[256]), "kept");

  proto::SegmentCatalogChanges next;
  *next.add_changes() = Change(42, proto::CatalogChange::ADD, "after", 512, 5);
  EXPECT_TRUE(catalog.Apply(next, 2).ok());
  EXPECT_EQ(catalog.size(), 2u);
}

TEST(SegmentCatalogTest, SoftPinsReportWhatRemainsOfThem) {
  SegmentCatalog catalog;
  proto::SegmentCatalogChanges changes;
  proto::CatalogChange add = Change(1, proto::CatalogChange::ADD, "pinned", 0, 10);
  add.mutable_entry()->set_pinned(true);
  add.mutable_entry()->set_soft_pin_remaining_ms(60000);
  *changes.add_changes() = add;
  ASSERT_TRUE(catalog.Apply(changes, 1).ok());
  proto::SegmentInfo segment;
  catalog.Fill(&segment);
  ASSERT_EQ(segment.catalog_size(), 1);
  EXPECT_TRUE(segment.catalog(0).pinned());
  EXPECT_GT(segment.catalog(0).soft_pin_remaining_ms(), 0u);
  EXPECT_LE(segment.catalog(0).soft_pin_remaining_ms(), 60000u);
}

// A catalog that can read its segment checks itself against it: an entry is reported only while
// its range holds the bytes it held when the entry was added (whatever overwrote them, in part or
// whole), so that a range the master reused before this catalog heard of the removal is never
// reported as the old object's.
TEST(SegmentCatalogTest, AVerifyingCatalogReportsOnlyEntriesWhoseBytesAreTheirOwn) {
  std::vector<uint8_t> memory(4096);
  for (size_t i = 0; i < memory.size(); ++i) memory[i] = static_cast<uint8_t>(i * 7);
  SegmentCatalog catalog(memory);
  ASSERT_TRUE(catalog.verifies());
  proto::SegmentCatalogChanges changes;
  *changes.add_changes() = Change(1, proto::CatalogChange::ADD, "kept", 0, 1024);
  *changes.add_changes() = Change(2, proto::CatalogChange::ADD, "rewritten", 1024, 1024);
  *changes.add_changes() = Change(3, proto::CatalogChange::ADD, "one-byte", 2048, 1024);
  *changes.add_changes() = Change(4, proto::CatalogChange::ADD, "outside", 4000, 1024);
  ASSERT_TRUE(catalog.Apply(changes, 1).ok());
  // Another object's bytes land where two of them were (the master reused their ranges).
  std::fill(memory.begin() + 1024, memory.begin() + 2048, uint8_t{0x5a});
  memory[3071] ^= 1;
  proto::SegmentInfo segment;
  EXPECT_EQ(catalog.Fill(&segment), 3u);
  EXPECT_TRUE(segment.verifies_catalog());
  ASSERT_EQ(segment.catalog_size(), 1);
  EXPECT_EQ(segment.catalog(0).key(), "kept");
  EXPECT_EQ(catalog.size(), 1u) << "what no longer matches is forgotten";
  // Touches change no identity; identical bytes written again match again.
  proto::SegmentCatalogChanges touch;
  *touch.add_changes() = Change(5, proto::CatalogChange::TOUCH, "kept", 0, 0, 9);
  ASSERT_TRUE(catalog.Apply(touch, 1).ok());
  EXPECT_EQ(Reported(catalog).size(), 1u);
}

// What this process wrote into its own segment is hashed at the write (Note) and used by that
// key's ADD; an ADD of another key or size at the offset reads the range itself.
TEST(SegmentCatalogTest, AnAddUsesTheIdentityNotedAtTheWriteOnlyForTheSameKeyAndSize) {
  std::vector<uint8_t> memory(4096, 0x33);
  SegmentCatalog catalog(memory);
  catalog.Note(0, "noted", 1024);
  catalog.Note(1024, "noted-too", 1024);
  // The bytes change after the notes: an identity taken at the note no longer matches them, one
  // read at the ADD does.
  std::fill(memory.begin(), memory.begin() + 2048, uint8_t{0x44});
  proto::SegmentCatalogChanges changes;
  *changes.add_changes() = Change(1, proto::CatalogChange::ADD, "noted", 0, 1024);
  *changes.add_changes() = Change(2, proto::CatalogChange::ADD, "another", 1024, 1024);
  ASSERT_TRUE(catalog.Apply(changes, 1).ok());
  proto::SegmentInfo segment;
  EXPECT_EQ(catalog.Fill(&segment), 1u) << "the noted identity was used for 'noted'";
  ASSERT_EQ(segment.catalog_size(), 1);
  EXPECT_EQ(segment.catalog(0).key(), "another");
}

TEST(SegmentCatalogTest, ACatalogWithoutMemoryReportsWhatTheMasterSaid) {
  SegmentCatalog catalog;
  EXPECT_FALSE(catalog.verifies());
  proto::SegmentCatalogChanges changes;
  *changes.add_changes() = Change(1, proto::CatalogChange::ADD, "a", 1 << 30, 1024);
  ASSERT_TRUE(catalog.Apply(changes, 1).ok());
  proto::SegmentInfo segment;
  EXPECT_EQ(catalog.Fill(&segment), 0u);
  EXPECT_FALSE(segment.verifies_catalog());
  EXPECT_EQ(segment.catalog_size(), 1);
}

}  // namespace
}  // namespace larder::client
