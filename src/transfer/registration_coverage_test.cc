// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// RegistrationCoverage against a strict fake native layer that, like the device fabric, rejects
// misaligned registrations and any overlap with an earlier one; and SplitAtBoundaries.
#include "transfer/registration_coverage.h"

#include <gtest/gtest.h>

#include <atomic>
#include <ostream>
#include <random>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace larder::transfer {

// Lets gtest print ranges in failure messages (found by ADL, hence outside the anonymous
// namespace).
void PrintTo(const RegistrationCoverage::NativeRange& range, std::ostream* os) {
  *os << std::hex << "[0x" << range.begin << ", 0x" << range.end << ")" << std::dec;
}

namespace {

using NativeRange = RegistrationCoverage::NativeRange;
using Piece = std::pair<uint64_t, uint64_t>;  // (offset, length) from SplitAtBoundaries

constexpr uint64_t kMiB = 1ULL << 20;
constexpr uint64_t kGranule = 2 * kMiB;

// A native layer that accepts only granule-aligned, non-empty ranges that overlap nothing it
// accepted before, and can fail one chosen call. Records every call, failed ones included.
class StrictNativeLayer {
 public:
  explicit StrictNativeLayer(uint64_t granularity) : granularity_(granularity) {}

  RegistrationCoverage::NativeRegister Callback() {
    return [this](uint64_t begin, uint64_t length) { return Register(begin, length); };
  }

  // Makes the n-th call from now (1 = the next one) fail with Unavailable.
  void FailNthCallFromNow(size_t n) {
    MutexLock lock(mu_);
    fail_at_call_ = calls_.size() + n;
  }

  std::vector<NativeRange> calls() const {
    MutexLock lock(mu_);
    return calls_;
  }
  uint64_t accepted_bytes() const {
    MutexLock lock(mu_);
    return accepted_bytes_;
  }
  // Calls that a real fabric would have rejected: misaligned, empty or overlapping.
  int violations() const {
    MutexLock lock(mu_);
    return violations_;
  }

 private:
  Status Register(uint64_t begin, uint64_t length) {
    MutexLock lock(mu_);
    const uint64_t end = begin + length;
    calls_.push_back(NativeRange{begin, end});
    if (calls_.size() == fail_at_call_) return UnavailableError("injected native failure");
    if (length == 0 || begin % granularity_ != 0 || length % granularity_ != 0 || end < begin) {
      ++violations_;
      return InvalidArgumentError("misaligned native registration");
    }
    for (const NativeRange& r : accepted_) {
      if (begin < r.end && r.begin < end) {
        ++violations_;
        return AlreadyExistsError("overlapping native registration");
      }
    }
    accepted_.push_back(NativeRange{begin, end});
    accepted_bytes_ += length;
    return Status();
  }

  const uint64_t granularity_;
  mutable Mutex mu_;
  std::vector<NativeRange> calls_ LARDER_GUARDED_BY(mu_);
  std::vector<NativeRange> accepted_ LARDER_GUARDED_BY(mu_);
  size_t fail_at_call_ LARDER_GUARDED_BY(mu_) = 0;  // 1-based call index to fail, 0 for none
  int violations_ LARDER_GUARDED_BY(mu_) = 0;
  uint64_t accepted_bytes_ LARDER_GUARDED_BY(mu_) = 0;
};

// A coverage with 2 MiB granules in front of a strict fabric.
class RegistrationCoverageTest : public ::testing::Test {
 protected:
  Status Register(uint64_t address, uint64_t length) {
    return coverage_.Register(address, length, fabric_.Callback());
  }

  StrictNativeLayer fabric_{kGranule};
  RegistrationCoverage coverage_{kGranule};
};

TEST(AlignTest, RoundsToPowerOfTwoAndReportsOverflowAsZero) {
  EXPECT_EQ(AlignDown(0x5fffff, kGranule), 0x400000u);
  EXPECT_EQ(AlignDown(0x600000, kGranule), 0x600000u);
  EXPECT_EQ(AlignUp(0x500001, kGranule), 0x600000u);
  EXPECT_EQ(AlignUp(0x600000, kGranule), 0x600000u);
  EXPECT_EQ(AlignUp(0, kGranule), 0u);
  EXPECT_EQ(AlignUp(UINT64_MAX - kGranule + 1, kGranule), UINT64_MAX - kGranule + 1);
  EXPECT_EQ(AlignUp(UINT64_MAX - kGranule + 2, kGranule), 0u);
  EXPECT_EQ(AlignUp(UINT64_MAX, kGranule), 0u);
}

TEST_F(RegistrationCoverageTest, RfcExampleRegistersOnlyTheUncoveredTail) {
  ASSERT_TRUE(Register(0x200000, 3 * kMiB).ok());
  ASSERT_TRUE(Register(0x500000, 3 * kMiB).ok());

  const std::vector<NativeRange> expected = {{0x200000, 0x600000}, {0x600000, 0x800000}};
  EXPECT_EQ(fabric_.calls(), expected);
  EXPECT_EQ(fabric_.violations(), 0);
  EXPECT_EQ(coverage_.NativeRanges(), expected);  // adjacent, kept distinct
  EXPECT_EQ(coverage_.native_calls(), 2u);
  EXPECT_EQ(coverage_.native_bytes(), 0x600000u);
  EXPECT_EQ(coverage_.logical_registrations(), 2u);

  // The union is exactly [0x200000, 0x800000).
  EXPECT_TRUE(coverage_.Covers(0x200000, 0x600000));
  EXPECT_FALSE(coverage_.Covers(0x1fffff, 0x600000));
  EXPECT_FALSE(coverage_.Covers(0x200000, 0x600001));

  EXPECT_EQ(coverage_.FindNative(0x5fffff), (NativeRange{0x200000, 0x600000}));
  EXPECT_EQ(coverage_.FindNative(0x600000), (NativeRange{0x600000, 0x800000}));
  EXPECT_EQ(coverage_.FindNative(0x800000), std::nullopt);
  EXPECT_EQ(coverage_.FindNative(0x1fffff), std::nullopt);
}

TEST_F(RegistrationCoverageTest, BufferInsideCoverageMakesNoNativeCall) {
  ASSERT_TRUE(Register(0x200000, 3 * kMiB).ok());
  ASSERT_TRUE(Register(0x500000, 3 * kMiB).ok());
  ASSERT_EQ(fabric_.calls().size(), 2u);

  // Inside one native range, then across the boundary of two adjacent ones.
  EXPECT_TRUE(Register(0x300000, 0x1000).ok());
  EXPECT_TRUE(Register(0x5ff000, 0x2000).ok());
  EXPECT_EQ(fabric_.calls().size(), 2u);
  EXPECT_EQ(coverage_.native_calls(), 2u);
  EXPECT_EQ(coverage_.logical_registrations(), 4u);
  EXPECT_TRUE(coverage_.IsLogicallyRegistered(0x5ff000, 0x2000));
}

TEST_F(RegistrationCoverageTest, BufferSpanningAGapRegistersOnlyTheGap) {
  ASSERT_TRUE(Register(0, kGranule).ok());
  ASSERT_TRUE(Register(6 * kMiB, kGranule).ok());
  EXPECT_FALSE(coverage_.Covers(0, 8 * kMiB));

  ASSERT_TRUE(Register(1 * kMiB, 6 * kMiB).ok());
  const std::vector<NativeRange> calls = fabric_.calls();
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[2], (NativeRange{2 * kMiB, 6 * kMiB}));
  EXPECT_EQ(fabric_.violations(), 0);
  EXPECT_EQ(coverage_.NativeRanges().size(), 3u);
  EXPECT_EQ(coverage_.native_bytes(), 8 * kMiB);
  EXPECT_TRUE(coverage_.Covers(0, 8 * kMiB));
}

TEST_F(RegistrationCoverageTest, PartialFailureKeepsEarlierNativeRangesAndRetriesTheRest) {
  ASSERT_TRUE(Register(4 * kMiB, kGranule).ok());

  // [2, 8) MiB has two gaps around [4, 6); the second native call fails.
  fabric_.FailNthCallFromNow(2);
  Status status = Register(2 * kMiB, 6 * kMiB);
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);
  EXPECT_NE(status.message().find("injected native failure"), std::string::npos) << status;
  EXPECT_NE(status.message().find("0x600000"), std::string::npos) << status;
  const std::vector<NativeRange> after_failure = {{2 * kMiB, 4 * kMiB}, {4 * kMiB, 6 * kMiB}};
  EXPECT_EQ(coverage_.NativeRanges(), after_failure);
  EXPECT_EQ(coverage_.native_bytes(), 4 * kMiB);
  EXPECT_EQ(coverage_.native_calls(), 3u);
  EXPECT_EQ(coverage_.logical_registrations(), 1u);
  EXPECT_FALSE(coverage_.IsLogicallyRegistered(2 * kMiB, 6 * kMiB));

  ASSERT_TRUE(Register(2 * kMiB, 6 * kMiB).ok());
  const std::vector<NativeRange> calls = fabric_.calls();
  ASSERT_EQ(calls.size(), 4u);
  EXPECT_EQ(calls[3], (NativeRange{6 * kMiB, 8 * kMiB}));
  EXPECT_EQ(fabric_.violations(), 0);
  EXPECT_EQ(coverage_.logical_registrations(), 2u);
  EXPECT_TRUE(coverage_.IsLogicallyRegistered(2 * kMiB, 6 * kMiB));
  EXPECT_TRUE(coverage_.Covers(2 * kMiB, 6 * kMiB));
}

TEST_F(RegistrationCoverageTest, DeregisterKeepsNativeCoverageForReRegistration) {
  ASSERT_TRUE(Register(0x201000, 3 * kMiB).ok());
  const std::vector<NativeRange> ranges = coverage_.NativeRanges();
  ASSERT_EQ(fabric_.calls().size(), 1u);

  ASSERT_TRUE(coverage_.Deregister(0x201000).ok());
  EXPECT_EQ(coverage_.logical_registrations(), 0u);
  EXPECT_FALSE(coverage_.IsLogicallyRegistered(0x201000, 1));
  EXPECT_EQ(coverage_.NativeRanges(), ranges);
  EXPECT_TRUE(coverage_.Covers(0x201000, 3 * kMiB));

  ASSERT_TRUE(Register(0x201000, 3 * kMiB).ok());
  EXPECT_EQ(fabric_.calls().size(), 1u);
  EXPECT_EQ(fabric_.violations(), 0);
  EXPECT_TRUE(coverage_.IsLogicallyRegistered(0x201000, 3 * kMiB));
}

TEST_F(RegistrationCoverageTest, DeregisterOfUnknownAddressIsNotFound) {
  EXPECT_EQ(coverage_.Deregister(0x200000).code(), StatusCode::kNotFound);
  ASSERT_TRUE(Register(0x200000, kMiB).ok());
  // Inside the buffer but not its start.
  EXPECT_EQ(coverage_.Deregister(0x200001).code(), StatusCode::kNotFound);
  ASSERT_TRUE(coverage_.Deregister(0x200000).ok());
  EXPECT_EQ(coverage_.Deregister(0x200000).code(), StatusCode::kNotFound);
}

TEST_F(RegistrationCoverageTest, DuplicateLogicalStartIsAlreadyExists) {
  ASSERT_TRUE(Register(0x200000, kMiB).ok());
  // Longer, so it would need a native call if it were accepted.
  EXPECT_EQ(Register(0x200000, 3 * kMiB).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(fabric_.calls().size(), 1u);
  EXPECT_EQ(coverage_.logical_registrations(), 1u);
  EXPECT_FALSE(coverage_.Covers(0x200000, 3 * kMiB));
}

TEST_F(RegistrationCoverageTest, ZeroLengthAndOverflowAreInvalidArgument) {
  EXPECT_EQ(Register(0x200000, 0).code(), StatusCode::kInvalidArgument);
  // address + length wraps, or ends exactly at 2^64.
  EXPECT_EQ(Register(UINT64_MAX - 0xfff, 0x2000).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Register(UINT64_MAX - 0xfff, 0x1000).code(), StatusCode::kInvalidArgument);
  // The buffer fits but its last granule does not.
  EXPECT_EQ(Register(UINT64_MAX - kMiB, 0x1000).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(fabric_.calls().empty());
  EXPECT_EQ(coverage_.logical_registrations(), 0u);

  // The last granule ends at 2^64, which a native range cannot express; the one before it works.
  const uint64_t last_granule = UINT64_MAX - kGranule + 1;
  EXPECT_EQ(Register(last_granule, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(fabric_.calls().empty());
  const uint64_t top = last_granule - kGranule;
  ASSERT_TRUE(Register(top + 1, kGranule - 1).ok());
  EXPECT_EQ(coverage_.NativeRanges(), (std::vector<NativeRange>{{top, last_granule}}));
  EXPECT_TRUE(coverage_.Covers(top, kGranule));
  EXPECT_FALSE(coverage_.Covers(top, kGranule + 1));
  EXPECT_FALSE(coverage_.Covers(last_granule, UINT64_MAX - last_granule + 1));  // wraps
}

TEST_F(RegistrationCoverageTest, IsLogicallyRegisteredFindsOverlappingBuffers) {
  ASSERT_TRUE(Register(0x1000, 0x2000).ok());
  EXPECT_TRUE(coverage_.IsLogicallyRegistered(0x1000, 0x2000));
  EXPECT_TRUE(coverage_.IsLogicallyRegistered(0x2fff, 1));
  EXPECT_FALSE(coverage_.IsLogicallyRegistered(0x2fff, 2));
  EXPECT_FALSE(coverage_.IsLogicallyRegistered(0xfff, 1));
  EXPECT_FALSE(coverage_.IsLogicallyRegistered(0x1000, 0));
  EXPECT_TRUE(coverage_.Covers(0, kGranule));  // natively covered beyond the logical buffer

  // A big buffer that starts before the small one still contains ranges past the small one.
  ASSERT_TRUE(Register(0, kMiB).ok());
  EXPECT_TRUE(coverage_.IsLogicallyRegistered(0x1800, 0x10000));
  EXPECT_FALSE(coverage_.IsLogicallyRegistered(0x1800, kMiB));
}

// Random buffers, some deregistered again, against the strict fabric; checks every invariant
// against an independent bitmap of the granules that the aligned ranges touch.
TEST_F(RegistrationCoverageTest, RandomBuffersMatchAnIndependentGranuleBitmap) {
  constexpr uint64_t kSpaceGranules = 1024;
  constexpr uint64_t kMaxBufferGranules = 8;
  std::mt19937_64 rng(20261029);
  std::vector<bool> granules(kSpaceGranules + kMaxBufferGranules + 1, false);
  std::vector<uint64_t> live;

  for (int i = 0; i < 500; ++i) {
    const uint64_t address = rng() % (kSpaceGranules * kGranule);
    const uint64_t length = 1 + rng() % (kMaxBufferGranules * kGranule);
    const uint64_t aligned_begin = AlignDown(address, kGranule);
    const uint64_t aligned_end = AlignUp(address + length, kGranule);
    Status status = Register(address, length);
    ASSERT_TRUE(status.ok()) << "buffer " << i << ": " << status;
    live.push_back(address);
    for (uint64_t g = aligned_begin / kGranule; g < aligned_end / kGranule; ++g) {
      granules[g] = true;
    }

    ASSERT_TRUE(coverage_.Covers(aligned_begin, aligned_end - aligned_begin)) << "buffer " << i;
    ASSERT_TRUE(coverage_.IsLogicallyRegistered(address, length)) << "buffer " << i;
    uint64_t union_bytes = 0;
    for (bool set : granules) union_bytes += set ? kGranule : 0;
    ASSERT_EQ(coverage_.native_bytes(), union_bytes) << "buffer " << i;
    ASSERT_EQ(fabric_.accepted_bytes(), union_bytes) << "buffer " << i;
    ASSERT_EQ(fabric_.violations(), 0) << "buffer " << i;

    // Now and then drop a random live buffer: native coverage must not shrink.
    if (rng() % 5 == 0) {
      const size_t victim = rng() % live.size();
      ASSERT_TRUE(coverage_.Deregister(live[victim]).ok());
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(victim));
    }
  }
  EXPECT_EQ(coverage_.logical_registrations(), live.size());

  // The native ranges are aligned, disjoint, sorted, and sum to native_bytes.
  uint64_t sum = 0;
  uint64_t previous_end = 0;
  for (const NativeRange& r : coverage_.NativeRanges()) {
    EXPECT_EQ(r.begin % kGranule, 0u);
    EXPECT_EQ(r.end % kGranule, 0u);
    EXPECT_LT(r.begin, r.end);
    EXPECT_GE(r.begin, previous_end);
    previous_end = r.end;
    sum += r.end - r.begin;
  }
  EXPECT_EQ(sum, coverage_.native_bytes());

  // FindNative agrees with the bitmap everywhere, including just outside each range.
  for (uint64_t g = 0; g < granules.size(); ++g) {
    for (uint64_t probe : {g * kGranule, g * kGranule + kGranule / 2, (g + 1) * kGranule - 1}) {
      std::optional<NativeRange> found = coverage_.FindNative(probe);
      ASSERT_EQ(found.has_value(), granules[g]) << "probe " << probe;
      if (found) {
        EXPECT_LE(found->begin, probe);
        EXPECT_GT(found->end, probe);
      }
    }
  }
}

// Buffers that tile one address range with irregular lengths, so that neighbours share granules,
// registered round-robin from four threads while a fifth thread queries.
TEST_F(RegistrationCoverageTest, ConcurrentAdjacentBuffersRegisterTheUnionOnce) {
  constexpr int kThreads = 4;
  constexpr int kBuffers = 400;
  std::mt19937_64 rng(7);
  std::vector<std::pair<uint64_t, uint64_t>> buffers;  // (address, length)
  const uint64_t first = 0x40123000;
  uint64_t next = first;
  for (int i = 0; i < kBuffers; ++i) {
    const uint64_t length = kGranule / 3 + rng() % (3 * kGranule);
    buffers.emplace_back(next, length);
    next += length;
  }

  std::atomic<int> failures{0};
  std::atomic<bool> writers_done{false};
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&, t] {
      for (int i = t; i < kBuffers; i += kThreads) {
        if (!Register(buffers[i].first, buffers[i].second).ok()) failures.fetch_add(1);
      }
    });
  }
  std::atomic<int> bad_lookups{0};
  std::thread reader([&] {
    while (!writers_done.load()) {
      for (const auto& [address, length] : buffers) {
        std::optional<NativeRange> found = coverage_.FindNative(address);
        if (found && (found->begin > address || found->end <= address)) bad_lookups.fetch_add(1);
        (void)coverage_.Covers(address, length);
      }
    }
  });
  for (std::thread& writer : writers) writer.join();
  writers_done.store(true);
  reader.join();

  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(bad_lookups.load(), 0);
  EXPECT_EQ(fabric_.violations(), 0);
  const uint64_t union_begin = AlignDown(first, kGranule);
  const uint64_t union_end = AlignUp(next, kGranule);
  EXPECT_EQ(coverage_.native_bytes(), union_end - union_begin);
  EXPECT_EQ(fabric_.accepted_bytes(), union_end - union_begin);
  EXPECT_TRUE(coverage_.Covers(union_begin, union_end - union_begin));
  EXPECT_EQ(coverage_.logical_registrations(), static_cast<size_t>(kBuffers));
  for (const auto& [address, length] : buffers) {
    EXPECT_TRUE(coverage_.IsLogicallyRegistered(address, length));
  }
}

// Checks that `pieces` tile [0, length) in order and that no piece crosses a granule boundary on
// either side.
void ExpectValidPieces(uint64_t src, uint64_t dst, uint64_t length, uint64_t granularity,
                       const std::vector<Piece>& pieces) {
  uint64_t expected_offset = 0;
  for (const auto& [offset, piece] : pieces) {
    ASSERT_EQ(offset, expected_offset);
    ASSERT_GT(piece, 0u);
    EXPECT_EQ(AlignDown(src + offset, granularity),
              AlignDown(src + offset + piece - 1, granularity))
        << "source piece at offset " << offset << " crosses a boundary";
    EXPECT_EQ(AlignDown(dst + offset, granularity),
              AlignDown(dst + offset + piece - 1, granularity))
        << "destination piece at offset " << offset << " crosses a boundary";
    expected_offset += piece;
  }
  EXPECT_EQ(expected_offset, length);
}

TEST(SplitAtBoundariesTest, DifferentlyMisalignedSourceAndDestination) {
  const uint64_t src = 0x1ff000;
  const uint64_t dst = 0x3fe000;
  const uint64_t length = 5 * kMiB;
  auto pieces = SplitAtBoundaries(src, dst, length, kGranule);
  ExpectValidPieces(src, dst, length, kGranule, pieces);
  // Three source boundaries (0x200000, 0x400000, 0x600000) and three destination ones
  // (0x400000, 0x600000, 0x800000), at distinct offsets: seven pieces.
  ASSERT_EQ(pieces.size(), 7u);
  EXPECT_EQ(pieces[0], (Piece{0, 0x1000}));
  EXPECT_EQ(pieces[1], (Piece{0x1000, 0x1000}));
  EXPECT_EQ(pieces[2], (Piece{0x2000, 0x1ff000}));
}

TEST(SplitAtBoundariesTest, AlignedCopyGivesGranuleSizedPieces) {
  auto pieces = SplitAtBoundaries(0x200000, 0x800000, 8 * kMiB, kGranule);
  ExpectValidPieces(0x200000, 0x800000, 8 * kMiB, kGranule, pieces);
  ASSERT_EQ(pieces.size(), 4u);
  for (const auto& [offset, piece] : pieces) EXPECT_EQ(piece, kGranule);

  // Equally misaligned sides cut at the same offsets.
  pieces = SplitAtBoundaries(0x201000, 0x401000, 4 * kMiB, kGranule);
  ExpectValidPieces(0x201000, 0x401000, 4 * kMiB, kGranule, pieces);
  EXPECT_EQ(pieces.size(), 3u);
}

TEST(SplitAtBoundariesTest, ShortCopyIsOnePieceAndEmptyCopyIsNone) {
  auto pieces = SplitAtBoundaries(0x201000, 0x3000, 0x1000, kGranule);
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0], (Piece{0, 0x1000}));
  EXPECT_TRUE(SplitAtBoundaries(0x201000, 0x3000, 0, kGranule).empty());
}

TEST(SplitAtBoundariesTest, RandomCopiesCutExactlyAtBoundaries) {
  std::mt19937_64 rng(42);
  for (int i = 0; i < 2000; ++i) {
    const uint64_t granularity = 1ULL << (12 + rng() % 10);
    const uint64_t src = rng() % (1ULL << 40);
    const uint64_t dst = rng() % (1ULL << 40);
    const uint64_t length = 1 + rng() % (8 * granularity);
    auto pieces = SplitAtBoundaries(src, dst, length, granularity);
    ExpectValidPieces(src, dst, length, granularity, pieces);
    // Pieces are maximal: one cut per distinct offset in (0, length) where either side reaches a
    // boundary. Both sides cut at the same offsets when src and dst are equally misaligned, and
    // never at the same offset otherwise.
    auto boundaries_inside = [&](uint64_t a) {
      return (a + length - 1) / granularity - a / granularity;
    };
    const uint64_t cuts = (src - dst) % granularity == 0
                              ? boundaries_inside(src)
                              : boundaries_inside(src) + boundaries_inside(dst);
    ASSERT_EQ(pieces.size(), cuts + 1) << "copy " << i;
  }
}

}  // namespace
}  // namespace larder::transfer
