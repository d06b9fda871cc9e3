// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "client/testing/store_client_conformance.h"

#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace larder::testutil {
namespace {

std::vector<std::byte> Bytes(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte(static_cast<uint8_t>(seed + i * 7));
  return v;
}

bool Same(std::string_view got, const std::vector<std::byte>& want) {
  return got.size() == want.size() && std::memcmp(got.data(), want.data(), want.size()) == 0;
}

std::span<const std::byte> View(const std::vector<std::byte>& v) { return v; }

}  // namespace

void StoreClientConformanceTest::SetUp() {
  auto made = GetParam().make();
  ASSERT_TRUE(made.ok()) << made.status();
  fixture_ = std::move(*made);
}

TEST_P(StoreClientConformanceTest, CopyingCallsRoundTripAndObjectsAreImmutable) {
  const auto value = Bytes(100000, 1);
  ASSERT_TRUE(client().Put("conf/k", value).ok());
  auto got = client().Get("conf/k");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(Same(*got, value));
  // A second put of the key succeeds and does not rewrite it.
  EXPECT_TRUE(client().Put("conf/k", Bytes(10, 9)).ok());
  EXPECT_TRUE(Same(*client().Get("conf/k"), value));
  EXPECT_EQ(*client().GetSize("conf/k"), value.size());
  EXPECT_EQ(client().Put("", value).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client().Put("conf/empty", {}).code(), StatusCode::kInvalidArgument);
}

TEST_P(StoreClientConformanceTest, BatchesAnswerPerKeyAndSingleFormsAgree) {
  const auto a = Bytes(4096, 2);
  const auto b = Bytes(5000, 3);
  const std::vector<std::string> keys = {"conf/a", "conf/b"};
  const std::vector<std::span<const std::byte>> values = {View(a), View(b)};
  for (const Status& put : client().BatchPut(keys, values)) EXPECT_TRUE(put.ok()) << put;

  const std::vector<std::string> asked = {"conf/a", "conf/missing", "conf/b"};
  auto got = client().BatchGet(asked);
  ASSERT_EQ(got.size(), 3u);
  ASSERT_TRUE(got[0].ok()) << got[0].status();
  EXPECT_TRUE(Same(*got[0], a));
  EXPECT_EQ(got[1].status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(got[2].ok()) << got[2].status();
  EXPECT_TRUE(Same(*got[2], b));
  EXPECT_EQ(client().Get("conf/missing").status().code(), StatusCode::kNotFound);

  auto exist = client().BatchExist(asked);
  ASSERT_EQ(exist.size(), 3u);
  EXPECT_TRUE(*exist[0]);
  EXPECT_FALSE(*exist[1]);
  EXPECT_TRUE(*exist[2]);
  EXPECT_TRUE(*client().Exist("conf/a"));
  EXPECT_FALSE(*client().Exist("conf/missing"));

  auto info = client().BatchGetObjectInfo(asked);
  ASSERT_EQ(info.size(), 3u);
  ASSERT_TRUE(info[0].ok()) << info[0].status();
  EXPECT_EQ(info[0]->size, a.size());
  EXPECT_FALSE(info[0]->replicas.empty());
  EXPECT_EQ(info[1].status().code(), StatusCode::kNotFound);
  EXPECT_EQ(client().GetSize("conf/missing").status().code(), StatusCode::kNotFound);
}

TEST_P(StoreClientConformanceTest, ZeroCopyCallsMoveTheBytes) {
  constexpr size_t kValue = 64 << 10;
  auto* memory = static_cast<std::byte*>(fixture_->ZeroCopyMemory(8 * kValue));
  ASSERT_NE(memory, nullptr);
  const auto value = Bytes(kValue, 4);
  std::memcpy(memory, value.data(), kValue);
  ASSERT_TRUE(client().PutFrom("conf/z", memory, kValue).ok());

  std::byte* into = memory + kValue;
  auto size = client().GetInto("conf/z", into, kValue);
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(*size, kValue);
  EXPECT_EQ(std::memcmp(into, value.data(), kValue), 0);
  EXPECT_EQ(client().GetInto("conf/z", into, kValue - 1).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(client().GetInto("conf/none", into, kValue).status().code(), StatusCode::kNotFound);

  // One object from two slices, read back across two others of other sizes.
  const std::vector<std::string> sliced = {"conf/sliced"};
  const std::vector<std::vector<BufferSlice>> put_slices = {
      {BufferSlice{memory, 1000}, BufferSlice{memory + 2000, kValue - 1000}}};
  EXPECT_TRUE(client().BatchPutFromSlices(sliced, put_slices)[0].ok());
  std::byte* out = memory + 2 * kValue;
  std::memset(out, 0, 2 * kValue);
  const std::vector<std::vector<BufferSlice>> get_slices = {
      {BufferSlice{out, kValue / 2}, BufferSlice{out + kValue, kValue / 2}}};
  auto sliced_size = client().BatchGetIntoSlices(sliced, get_slices);
  ASSERT_TRUE(sliced_size[0].ok()) << sliced_size[0].status();
  EXPECT_EQ(*sliced_size[0], kValue);
  std::vector<std::byte> want(memory, memory + 1000);
  want.insert(want.end(), memory + 2000, memory + 2000 + (kValue - 1000));
  EXPECT_EQ(std::memcmp(out, want.data(), kValue / 2), 0);
  EXPECT_EQ(std::memcmp(out + kValue, want.data() + kValue / 2, kValue / 2), 0);

  // Parts of objects: in range, past the end, and of a missing key.
  std::byte* part = memory + 4 * kValue;
  const std::vector<ObjectRange> ranges = {{"conf/z", 100, part, 300},
                                           {"conf/z", kValue - 10, part + 300, 20},
                                           {"conf/none", 0, part + 400, 10}};
  auto parts = client().BatchGetRanges(ranges);
  ASSERT_EQ(parts.size(), 3u);
  ASSERT_TRUE(parts[0].ok()) << parts[0].status();
  EXPECT_EQ(*parts[0], 300u);
  EXPECT_EQ(std::memcmp(part, value.data() + 100, 300), 0);
  EXPECT_EQ(parts[1].status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(parts[2].status().code(), StatusCode::kNotFound);

  // Into memory the caller hands out once the size is known.
  std::vector<std::byte> allocated;
  const std::vector<std::string> z = {"conf/z", "conf/none"};
  auto read = client().BatchGetAllocated(z, [&](size_t, uint64_t n) -> Result<void*> {
    allocated.resize(n);
    return static_cast<void*>(allocated.data());
  });
  ASSERT_TRUE(read[0].ok()) << read[0].status();
  EXPECT_EQ(*read[0], kValue);
  EXPECT_EQ(allocated, value);
  EXPECT_EQ(read[1].status().code(), StatusCode::kNotFound);
}

TEST_P(StoreClientConformanceTest, RemovalsAnswerPerKey) {
  const auto v = Bytes(1000, 5);
  for (const char* key : {"conf/r1", "conf/r2", "conf/r3"}) ASSERT_TRUE(client().Put(key, v).ok());
  EXPECT_TRUE(client().Remove("conf/r1").ok());
  EXPECT_EQ(client().Remove("conf/r1").code(), StatusCode::kNotFound);
  EXPECT_EQ(client().Get("conf/r1").status().code(), StatusCode::kNotFound);
  const std::vector<std::string> keys = {"conf/r2", "conf/missing"};
  auto removed = client().BatchRemove(keys);
  ASSERT_EQ(removed.size(), 2u);
  EXPECT_TRUE(removed[0].ok()) << removed[0];
  EXPECT_EQ(removed[1].code(), StatusCode::kNotFound);
  RemoveScope elsewhere;
  elsewhere.segment = "conf-no-such-segment";
  const std::vector<std::string> r3 = {"conf/r3"};
  EXPECT_EQ(client().BatchRemoveReplicas(r3, elsewhere)[0].code(), StatusCode::kNotFound);
  EXPECT_TRUE(*client().Exist("conf/r3"));
  auto all = client().RemoveAll();
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(*all, 1u);
  EXPECT_FALSE(*client().Exist("conf/r3"));
}

}  // namespace larder::testutil
