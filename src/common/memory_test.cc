// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "common/memory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>

namespace larder {
namespace {

// A field of /proc/self/status in bytes ("VmRSS", "RssShmem", "VmPTE", "HugetlbPages").
uint64_t StatusBytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with(field + ":")) return std::stoull(line.substr(field.size() + 1)) * 1024;
  }
  return 0;
}

// Sets the 2 MiB hugetlb pool to hold `pages` free pages for the test, and restores it after.
// Other processes on the host take free pages too (UCX's memory pools in every engine with ucx
// take a few while the pool has some): the test's own use is read from /proc/self/status.
class HugePageReservation {
 public:
  explicit HugePageReservation(uint64_t pages) {
    HugePagePool pool = ReadHugePagePool(kHugePageSize);
    old_total_ = pool.total;
    if (geteuid() != 0) {
      reason_ = "not root: cannot reserve huge pages";
      return;
    }
    if (!Write(pool.total - pool.free + pages)) {
      reason_ = "cannot write /proc/sys/vm/nr_hugepages";
      return;
    }
    written_ = true;
    if (ReadHugePagePool(kHugePageSize).free < pages) {
      reason_ = "the kernel could not find " + std::to_string(pages) + " free 2 MiB pages";
    }
  }
  ~HugePageReservation() {
    if (written_) Write(old_total_);
  }
  bool ok() const { return reason_.empty(); }
  const std::string& reason() const { return reason_; }

 private:
  static bool Write(uint64_t total) {
    std::ofstream out("/proc/sys/vm/nr_hugepages");
    out << total;
    out.close();
    return static_cast<bool>(out);
  }
  uint64_t old_total_ = 0;
  bool written_ = false;
  std::string reason_;
};

TEST(HugePagesTest, ParsesEveryModeAndRefusesOthers) {
  EXPECT_EQ(ParseHugePages("off").value(), HugePages::kOff);
  EXPECT_EQ(ParseHugePages("2M").value(), HugePages::k2M);
  EXPECT_EQ(ParseHugePages("1g").value(), HugePages::k1G);
  EXPECT_EQ(ParseHugePages("auto").value(), HugePages::kAuto);
  auto bad = ParseHugePages("4m");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("off, 2m, 1g or auto"), std::string::npos);
  for (HugePages mode : {HugePages::kOff, HugePages::k2M, HugePages::k1G, HugePages::kAuto}) {
    EXPECT_EQ(ParseHugePages(HugePagesName(mode)).value(), mode);
  }
}

TEST(HugePagesTest, ShortPoolSaysHowManyAreNeededAndWhichSysctlSetsThem) {
  HugePageReservation none(0);
  uint64_t free_pages = ReadHugePagePool(kHugePageSize).free;
  // Ask for more pages than are free, whatever the pool holds.
  size_t size = (free_pages + 8) * kHugePageSize;
  auto region = AllocateMemfd("test", size, HugePages::k2M);
  ASSERT_FALSE(region.ok()) << "the pool had " << free_pages << " free pages";
  EXPECT_EQ(region.status().code(), StatusCode::kResourceExhausted);
  const std::string& message = region.status().message();
  EXPECT_NE(message.find("need " + std::to_string(free_pages + 8) + " 2 MiB pages"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find(std::to_string(free_pages) + " free"), std::string::npos) << message;
  EXPECT_NE(message.find("vm.nr_hugepages"), std::string::npos) << message;

  // auto falls back to normal pages instead.
  auto fallback = AllocateMemfd("test", size, HugePages::kAuto);
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  EXPECT_EQ((*fallback)->page_size(), static_cast<size_t>(sysconf(_SC_PAGESIZE)));
  EXPECT_FALSE((*fallback)->huge_pages());
}

TEST(HugePagesTest, ReservedPoolBacksAHugePageMemfd) {
  // Room for what other processes take meanwhile (see HugePageReservation).
  HugePageReservation reserved(40);
  if (!reserved.ok()) GTEST_SKIP() << reserved.reason();
  const uint64_t used_before = StatusBytes("HugetlbPages");
  auto region = AllocateMemfd("test", 3 * kHugePageSize + 1, HugePages::k2M);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_EQ((*region)->page_size(), kHugePageSize);
  EXPECT_EQ((*region)->size(), 4 * kHugePageSize);  // rounded up to whole pages
  auto* bytes = static_cast<uint8_t*>((*region)->data());
  std::memset(bytes, 0x5a, (*region)->size());
  EXPECT_EQ(bytes[(*region)->size() - 1], 0x5a);
  EXPECT_EQ(StatusBytes("HugetlbPages"), used_before + 4 * kHugePageSize);  // the pages it touched
  auto automatic = AllocateMemfd("test", kHugePageSize, HugePages::kAuto);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_EQ((*automatic)->page_size(), kHugePageSize);
}

TEST(SparseSegmentTest, OneTebibyteMemfdCostsOnlyWhatIsWritten) {
  const uint64_t before = StatusBytes("RssShmem");
  auto region = AllocateMemfd("test", 1ull << 40, HugePages::kOff);
  ASSERT_TRUE(region.ok()) << region.status();
  auto* bytes = static_cast<uint8_t*>((*region)->data());
  // A few pages far apart.
  for (uint64_t offset : {0ull, 1ull << 30, 1ull << 39, (1ull << 40) - 4096}) {
    bytes[offset] = 7;
    EXPECT_EQ(bytes[offset], 7);
  }
  EXPECT_LT(StatusBytes("RssShmem"), before + (16u << 20));
  EXPECT_LT(StatusBytes("VmPTE"), 16u << 20);
}

TEST(SparseSegmentTest, SizesPastTheAddressSpaceAreRefusedClearly) {
  auto region = AllocateMemfd("test", kMaxSegmentBytes + 1, HugePages::kOff);
  ASSERT_FALSE(region.ok());
  EXPECT_EQ(region.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(region.status().message().find("address space"), std::string::npos);
  EXPECT_EQ(AllocateMemfd("test", 0, HugePages::kOff).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(AllocateAnonymous(SIZE_MAX, HugePages::kOff).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace larder
