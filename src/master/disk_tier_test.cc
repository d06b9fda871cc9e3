// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// DiskTier, the master's record of disk copies, on its own: which reports it takes, which copies
// it serves, and what happens to a holder's work when the holder goes.
#include "master/disk_tier.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "testing/wait.h"

namespace larder::master {
namespace {

using std::chrono::milliseconds;

constexpr char kDisk[] = "0123456789abcdef0123456789abcdef";
constexpr char kOtherDisk[] = "fedcba9876543210fedcba9876543210";

DiskHolderReport Report(const char* identity = kDisk) {
  return DiskHolderReport{identity, 1ull << 30, 0, 0};
}

// A holder "c1" on host "h1" that has announced (nothing): ready for work.
void Join(DiskTier& tier, const std::string& client = "c1", const char* identity = kDisk) {
  auto tasks = tier.Poll(client, "h1", Report(identity), milliseconds(0));
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  ASSERT_TRUE(tasks->announce);
  ASSERT_TRUE(tier.Report(client, Report(identity), {}, {}, {}, true, nullptr).ok());
}

TEST(DiskTierTest, RecordsOnlyTheDemotionsItAskedFor) {
  DiskTier tier;
  Join(tier);
  ASSERT_TRUE(tier.QueueDemote("h1", "c1", "a"));
  EXPECT_FALSE(tier.QueueDemote("h1", "c1", "a"));  // queued once
  EXPECT_FALSE(tier.QueueDemote("h2", "c9", "b"));  // no holder on that host
  auto tasks = tier.Poll("c1", "h1", Report(), milliseconds(0));
  ASSERT_TRUE(tasks.ok());
  ASSERT_EQ(tasks->demote, std::vector<std::string>{"a"});
  const DiskCopyReport stored[] = {{"a", 100, 1}, {"never-asked", 5, 2}};
  auto refused = tier.Report("c1", Report(), stored, {}, {}, false, nullptr);
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(*refused, std::vector<std::string>{"never-asked"});
  EXPECT_EQ(tier.Find("a"), std::optional<uint64_t>(100));
  EXPECT_FALSE(tier.Find("never-asked"));
  EXPECT_EQ(tier.counters().demoted.load(), 1u);
  EXPECT_EQ(tier.counters().demote_refused.load(), 1u);
}

TEST(DiskTierTest, AKeyChangedWhileItWasDemotedKeepsNoCopy) {
  DiskTier tier;
  Join(tier);
  ASSERT_TRUE(tier.QueueDemote("h1", "c1", "k"));
  const std::string_view changed[] = {"k"};
  tier.Invalidate(changed);  // overwritten or removed meanwhile
  const DiskCopyReport stored[] = {{"k", 100, 1}};
  auto refused = tier.Report("c1", Report(), stored, {}, {}, false, nullptr);
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(*refused, std::vector<std::string>{"k"});
  EXPECT_FALSE(tier.Has("k"));
}

TEST(DiskTierTest, AnnouncedCopiesAreTakenOnlyWhereTheMasterSaysSo) {
  DiskTier tier;
  auto tasks = tier.Poll("c1", "h1", Report(), milliseconds(0));
  ASSERT_TRUE(tasks.ok() && tasks->announce);
  const DiskCopyReport stored[] = {{"free", 10, 1}, {"in-memory", 20, 2}};
  auto refused = tier.Report("c1", Report(), stored, {}, {}, true,
                             [](std::string_view key, uint64_t) { return key != "in-memory"; });
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(*refused, std::vector<std::string>{"in-memory"});
  EXPECT_TRUE(tier.Has("free"));
  EXPECT_FALSE(tier.Has("in-memory"));
}

TEST(DiskTierTest, AHolderThatLeavesTakesItsCopiesOfflineUntilItIsBack) {
  DiskTier tier;
  Join(tier);
  ASSERT_TRUE(tier.QueueDemote("h1", "c1", "k"));
  const DiskCopyReport stored[] = {{"k", 100, 1}};
  ASSERT_TRUE(tier.Report("c1", Report(), stored, {}, {}, false, nullptr).ok());
  ASSERT_TRUE(tier.QueuePromote("k"));
  tier.ClientGone("c1");
  EXPECT_FALSE(tier.Find("k"));  // not served
  EXPECT_TRUE(tier.Has("k"));    // but kept
  EXPECT_FALSE(tier.QueuePromote("k"));
  // A restart of the holder (another client, same disk and host) announces, then serves again;
  // the old process's promotion is not left waiting.
  auto tasks = tier.Poll("c2", "h1", Report(), milliseconds(0));
  ASSERT_TRUE(tasks.ok());
  EXPECT_TRUE(tasks->announce);
  ASSERT_TRUE(tier.Report("c2", Report(), stored, {}, {}, true, nullptr).ok());
  EXPECT_EQ(tier.Find("k"), std::optional<uint64_t>(100));
  ASSERT_TRUE(tier.QueuePromote("k"));
  tasks = tier.Poll("c2", "h1", Report(), milliseconds(0));
  ASSERT_TRUE(tasks.ok());
  EXPECT_EQ(tasks->promote, std::vector<std::string>{"k"});
}

TEST(DiskTierTest, ADiskHeldOnAnotherHostIsRefused) {
  DiskTier tier;
  Join(tier);
  auto other = tier.Poll("c2", "h2", Report(), milliseconds(0));
  EXPECT_EQ(other.status().code(), StatusCode::kFailedPrecondition) << other.status();
  auto bad = tier.Poll("c3", "h1", Report("not-an-identity"), milliseconds(0));
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  // Reports from a client that holds no disk here are refused.
  EXPECT_EQ(tier.Report("c9", Report(kOtherDisk), {}, {}, {}, false, nullptr).status().code(),
            StatusCode::kFailedPrecondition);
}

TEST(DiskTierTest, DemotionsGoToTheOwnersDiskElseTheEmptiestOfTheHost) {
  DiskTier tier;
  Join(tier, "c1", kDisk);
  Join(tier, "c2", kOtherDisk);
  ASSERT_TRUE(tier.QueueDemote("h1", "c2", "owned-by-c2"));
  ASSERT_TRUE(tier.QueueDemote("h1", "c3", "owned-by-a-client-without-a-disk"));
  auto c2 = tier.Poll("c2", "h1", Report(kOtherDisk), milliseconds(0));
  ASSERT_TRUE(c2.ok());
  EXPECT_NE(std::find(c2->demote.begin(), c2->demote.end(), "owned-by-c2"), c2->demote.end());
  auto c1 = tier.Poll("c1", "h1", Report(kDisk), milliseconds(0));
  ASSERT_TRUE(c1.ok());
  EXPECT_EQ(c1->demote.size() + c2->demote.size(), 2u);
}

TEST(DiskTierTest, APromotionLostByItsHolderIsAskedForAgain) {
  DiskTierOptions options;
  options.promote_timeout = milliseconds(50);
  DiskTier tier(options);
  Join(tier);
  ASSERT_TRUE(tier.QueueDemote("h1", "c1", "k"));
  const DiskCopyReport stored[] = {{"k", 100, 1}};
  ASSERT_TRUE(tier.Report("c1", Report(), stored, {}, {}, false, nullptr).ok());
  ASSERT_TRUE(tier.QueuePromote("k"));
  ASSERT_TRUE(tier.QueuePromote("k"));  // the same promotion
  auto tasks = tier.Poll("c1", "h1", Report(), milliseconds(0));
  ASSERT_EQ(tasks->promote.size(), 1u);
  EXPECT_EQ(tier.counters().promotions_queued.load(), 1u);
  // Once the promotion's timeout has passed, a reader's next get asks for it again.
  EXPECT_TRUE(test::WaitUntil(
      [&] {
        tier.QueuePromote("k");
        return tier.counters().promotions_queued.load() == 2;
      },
      milliseconds(10000)));
  // Done: the holder's put of the key, kept for promoted_grace from eviction.
  EXPECT_TRUE(tier.Promoted("k", "c1"));
  EXPECT_TRUE(tier.JustPromoted("k"));
  // Its put is under way until it ends, however long that takes (past the grace, too).
  EXPECT_TRUE(tier.BeingPromoted("k"));
  const std::string_view ended[] = {"k"};
  tier.PutsEnded(ended);
  EXPECT_FALSE(tier.BeingPromoted("k"));
  EXPECT_FALSE(tier.Promoted("k", "someone-else"));
}

}  // namespace
}  // namespace larder::master
