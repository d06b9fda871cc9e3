// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The ucx transport through the engine: two engines in this process with protocol "ucx" (UCX over
// its tcp transport on a machine without RDMA), reads and writes small and large, deadlines,
// hostile blobs, unregistered segments, a peer that goes away mid-batch, and what "auto" picks.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "larder/transfer_engine.h"
#include "transfer/testing/engine_fixture.h"
#include "transfer/testing/test_util.h"
#include "transfer/ucx/ucx_blob.h"

namespace larder {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testutil::FillPattern;

// UCX publishes an address for every network interface it sees when a worker starts. Other tests
// of the suite create and delete veth interfaces (network namespaces) meanwhile, so an address
// published a moment ago may be gone when the peer dials it: these tests keep UCX's network lanes
// on loopback, as an operator keeps them on the NICs meant for data (UCX_NET_DEVICES), unless the
// environment already chooses. Processes spawned by the tests inherit it.
const bool kUcxOnLoopback = [] { return setenv("UCX_NET_DEVICES", "lo", /*overwrite=*/0) == 0; }();

const RouteKind kUcx("ucx");
constexpr uint64_t kSegmentBytes = 128ull << 20;

std::unique_ptr<TransferEngine> CreateEngine(const std::string& protocol,
                                             const std::string& host_id = "",
                                             const std::string& auth_token = "") {
  TransferEngineOptions options;
  options.protocol = protocol;
  options.host_id = host_id;
  options.auth_token = auth_token;
  auto engine = TransferEngine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(engine).value() : nullptr;
}

// An engine exporting one patterned segment "kv" whose memory the test inspects directly.
struct Owner {
  std::unique_ptr<TransferEngine> engine;
  std::shared_ptr<MemoryRegion> memory;
  SegmentId id = 0;
  uint8_t* bytes() const { return static_cast<uint8_t*>(memory->data()); }
};

Owner StartOwner(const std::string& protocol, uint64_t size = kSegmentBytes, uint64_t seed = 1,
                 const std::string& host_id = "") {
  Owner owner;
  owner.engine = CreateEngine(protocol, host_id);
  if (!owner.engine) return owner;
  auto memory = owner.engine->AllocateSegmentMemory(size);
  EXPECT_TRUE(memory.ok()) << memory.status();
  if (!memory.ok()) return owner;
  owner.memory = std::move(memory).value();
  FillPattern(owner.memory->data(), size, seed);
  auto id = owner.engine->RegisterSegment("kv", owner.memory);
  EXPECT_TRUE(id.ok()) << id.status();
  owner.id = id.value_or(0);
  return owner;
}

Status Transfer(TransferEngine& engine, TransferOp op, void* local, SegmentHandle handle,
                uint64_t offset, uint64_t length, milliseconds timeout = seconds(20),
                RouteKind* route = nullptr) {
  TransferRequest request{op, local, handle, offset, length};
  auto results = engine.TransferSync({&request, 1}, timeout);
  if (!results.ok()) return results.status();
  if (route != nullptr) *route = (*results)[0].route;
  if ((*results)[0].status.ok() && (*results)[0].bytes != length) {
    return DataLossError("moved " + std::to_string((*results)[0].bytes) + " bytes");
  }
  return (*results)[0].status;
}

class UcxTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    owner_ = StartOwner("ucx");
    initiator_ = CreateEngine("ucx");
    ASSERT_TRUE(owner_.engine && owner_.memory && initiator_);
    auto handle = initiator_->OpenSegment(owner_.engine->address(), "kv");
    ASSERT_TRUE(handle.ok()) << handle.status();
    handle_ = *handle;
  }

  Owner owner_;
  std::unique_ptr<TransferEngine> initiator_;
  SegmentHandle handle_ = 0;
};

TEST_F(UcxTransportTest, RouteIsUcx) {
  EXPECT_EQ(initiator_->SegmentRoute(handle_).value(), kUcx);
  auto info = initiator_->SegmentInfo(handle_);
  ASSERT_TRUE(info.ok());
  EXPECT_NE(info->TransportBlob("ucx"), nullptr);
}

TEST_F(UcxTransportTest, SmallReadAndWrite) {
  std::vector<uint8_t> buf(4096);
  RouteKind route;
  ASSERT_TRUE(Transfer(*initiator_, TransferOp::kRead, buf.data(), handle_, 12345, buf.size(),
                       seconds(20), &route)
                  .ok());
  EXPECT_EQ(route, kUcx);
  EXPECT_EQ(std::memcmp(buf.data(), owner_.bytes() + 12345, buf.size()), 0);
  FillPattern(buf.data(), buf.size(), 99);
  ASSERT_TRUE(Transfer(*initiator_, TransferOp::kWrite, buf.data(), handle_, 777, 100).ok());
  EXPECT_EQ(std::memcmp(buf.data(), owner_.bytes() + 777, 100), 0);
}

TEST_F(UcxTransportTest, LargeMultiSliceReadAndWrite) {
  const uint64_t kLength = 64ull << 20;  // 16 slices of the default 4 MiB
  std::vector<uint8_t> buf(kLength);
  ASSERT_TRUE(Transfer(*initiator_, TransferOp::kRead, buf.data(), handle_, 4096, kLength).ok());
  EXPECT_EQ(std::memcmp(buf.data(), owner_.bytes() + 4096, kLength), 0);
  FillPattern(buf.data(), kLength, 7);
  ASSERT_TRUE(
      Transfer(*initiator_, TransferOp::kWrite, buf.data(), handle_, 32ull << 20, kLength).ok());
  EXPECT_EQ(std::memcmp(buf.data(), owner_.bytes() + (32ull << 20), kLength), 0);
}

TEST_F(UcxTransportTest, BatchOfManyRequestsAndRegisteredLocalMemory) {
  const uint64_t kBlock = 256 * 1024;
  const size_t kRequests = 64;
  std::vector<uint8_t> buf(kBlock * kRequests);
  ASSERT_TRUE(initiator_->RegisterLocalMemory(buf.data(), buf.size()).ok());
  std::vector<TransferRequest> requests;
  for (size_t i = 0; i < kRequests; ++i) {
    requests.push_back(
        {TransferOp::kRead, buf.data() + i * kBlock, handle_, (kRequests - i) * kBlock, kBlock});
  }
  auto results = initiator_->TransferSync(requests, seconds(20));
  ASSERT_TRUE(results.ok()) << results.status();
  for (size_t i = 0; i < kRequests; ++i) {
    ASSERT_TRUE((*results)[i].status.ok()) << (*results)[i].status;
    ASSERT_EQ(
        std::memcmp(buf.data() + i * kBlock, owner_.bytes() + (kRequests - i) * kBlock, kBlock), 0)
        << "request " << i;
  }
  EXPECT_TRUE(initiator_->UnregisterLocalMemory(buf.data()).ok());
}

TEST_F(UcxTransportTest, OutOfRangeIsRefusedBeforeUcx) {
  std::vector<uint8_t> buf(8192);
  Status s = Transfer(*initiator_, TransferOp::kRead, buf.data(), handle_, kSegmentBytes - 4096,
                      buf.size());
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s;
}

TEST_F(UcxTransportTest, DeadlinesAreHonouredAndTheEngineRecovers) {
  const uint64_t kLength = 64ull << 20;
  std::vector<uint8_t> buf(kLength);
  auto started = std::chrono::steady_clock::now();
  Status s =
      Transfer(*initiator_, TransferOp::kRead, buf.data(), handle_, 0, kLength, milliseconds(1));
  EXPECT_LT(std::chrono::steady_clock::now() - started, seconds(5));
  // 64 MiB in 1 ms would be 64 GB/s: UCX over loopback tcp cannot, so the deadline passes.
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
  // The next transfer reconnects.
  std::vector<uint8_t> small(65536);
  ASSERT_TRUE(
      Transfer(*initiator_, TransferOp::kRead, small.data(), handle_, 8192, small.size()).ok());
  EXPECT_EQ(std::memcmp(small.data(), owner_.bytes() + 8192, small.size()), 0);
}

TEST_F(UcxTransportTest, UnregisteredSegmentIsNotTouched) {
  std::vector<uint8_t> buf(65536);
  ASSERT_TRUE(Transfer(*initiator_, TransferOp::kRead, buf.data(), handle_, 0, buf.size()).ok());
  ASSERT_TRUE(owner_.engine->UnregisterSegment(owner_.id).ok());
  std::vector<uint8_t> before(owner_.bytes(), owner_.bytes() + buf.size());
  FillPattern(buf.data(), buf.size(), 1234);
  Status wrote = Transfer(*initiator_, TransferOp::kWrite, buf.data(), handle_, 0, buf.size());
  EXPECT_EQ(wrote.code(), StatusCode::kNotFound) << wrote;
  EXPECT_EQ(std::memcmp(before.data(), owner_.bytes(), buf.size()), 0) << "bytes were written";
  Status read = Transfer(*initiator_, TransferOp::kRead, buf.data(), handle_, 0, buf.size());
  EXPECT_EQ(read.code(), StatusCode::kNotFound) << read;
  // A new open of the stale descriptor is refused by the owner.
  auto info = initiator_->SegmentInfo(handle_);
  ASSERT_TRUE(info.ok());
  auto stale = initiator_->OpenSegment(*info);
  EXPECT_FALSE(stale.ok());
}

TEST_F(UcxTransportTest, ClosedHandleDropsTheSegment) {
  ASSERT_TRUE(initiator_->CloseSegment(handle_).ok());
  auto again = initiator_->OpenSegment(owner_.engine->address(), "kv");
  ASSERT_TRUE(again.ok()) << again.status();
  std::vector<uint8_t> buf(4096);
  ASSERT_TRUE(Transfer(*initiator_, TransferOp::kRead, buf.data(), *again, 0, buf.size()).ok());
  EXPECT_EQ(std::memcmp(buf.data(), owner_.bytes(), buf.size()), 0);
}

TEST_F(UcxTransportTest, HostileBlobsAreRefusedWithoutACrash) {
  SegmentDescriptor good = owner_.engine->ListSegments().at(0);
  const std::string blob = *good.TransportBlob("ucx");
  std::vector<std::string> bad = {"",
                                  "x",
                                  std::string(39, '\0'),
                                  blob.substr(0, 40),
                                  blob.substr(0, blob.size() - 1),
                                  blob + "extra",
                                  std::string(64 * 1024, '\xff')};
  auto patched = [&](size_t at, std::string bytes) {
    std::string b = blob;
    b.replace(at, bytes.size(), bytes);
    return b;
  };
  bad.push_back(patched(0, "XXXX"));                               // magic
  bad.push_back(patched(4, "\x07"));                               // version
  bad.push_back(patched(5, "\x80"));                               // unknown flag
  bad.push_back(patched(8, std::string(8, '\x55')));               // another segment id
  bad.push_back(patched(16, std::string(8, '\0')));                // null base
  bad.push_back(patched(16, std::string(8, '\xff')));              // base + size overflows
  bad.push_back(patched(24, std::string(8, '\0')));                // size 0
  bad.push_back(patched(32, std::string("\xff\xff\xff\x7f", 4)));  // huge address length
  bad.push_back(patched(36, std::string("\0\0\0\0", 4)));          // empty rkey
  for (size_t i = 0; i < bad.size(); ++i) {
    SegmentDescriptor d = good;
    d.transports["ucx"] = bad[i];
    auto handle = initiator_->OpenSegment(d);
    ASSERT_FALSE(handle.ok()) << "blob " << i << " was accepted";
    EXPECT_EQ(handle.status().code(), StatusCode::kNotFound) << i << ": " << handle.status();
  }
  // A descriptor that claims more bytes than the blob covers is refused too.
  SegmentDescriptor larger = good;
  larger.size = good.size * 2;
  EXPECT_FALSE(initiator_->OpenSegment(larger).ok());
  // The engine still serves.
  std::vector<uint8_t> buf(4096);
  ASSERT_TRUE(Transfer(*initiator_, TransferOp::kRead, buf.data(), handle_, 0, buf.size()).ok());
  EXPECT_EQ(std::memcmp(buf.data(), owner_.bytes(), buf.size()), 0);
}

TEST_F(UcxTransportTest, GarbageWorkerAddressAndRkeyFailToOpen) {
  SegmentDescriptor good = owner_.engine->ListSegments().at(0);
  const std::string blob = *good.TransportBlob("ucx");
  auto parsed = transfer::ucx::ParseBlob(blob, good);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  // Well-formed framing around an rkey that is random bytes.
  transfer::ucx::UcxBlob garbage_rkey = *parsed;
  garbage_rkey.rkey = std::string(garbage_rkey.rkey.size(), '\0');
  FillPattern(garbage_rkey.rkey.data(), garbage_rkey.rkey.size(), 5);
  SegmentDescriptor d = good;
  d.transports["ucx"] = transfer::ucx::EncodeBlob(garbage_rkey);
  auto handle = initiator_->OpenSegment(d);
  if (handle.ok()) {
    // UCX may accept bytes it cannot check; the owner's attach check still holds.
    std::vector<uint8_t> buf(64);
    Status s =
        Transfer(*initiator_, TransferOp::kRead, buf.data(), *handle, 0, buf.size(), seconds(5));
    (void)s;
  }
  std::vector<uint8_t> buf(4096);
  EXPECT_TRUE(Transfer(*initiator_, TransferOp::kRead, buf.data(), handle_, 0, buf.size()).ok());
}

// With a cluster token, the owner proves in its attach reply which engine it is, and the initiator
// checks that against the descriptor: a token holder that publishes a descriptor of its own with
// another engine's ucx address and rkey (an alias of that engine's memory) leads no write there.
TEST(UcxAuthTest, AnAttachReachesOnlyTheEngineTheDescriptorNames) {
  const std::string token = "ucx-test-token";
  std::unique_ptr<TransferEngine> victim = CreateEngine("ucx", "", token);
  std::unique_ptr<TransferEngine> writer = CreateEngine("ucx", "", token);
  ASSERT_TRUE(victim && writer);
  auto memory = victim->AllocateSegmentMemory(1 << 20);
  ASSERT_TRUE(memory.ok()) << memory.status();
  std::memset((*memory)->data(), 0x11, (*memory)->size());
  ASSERT_TRUE(victim->RegisterSegment("kv", *memory).ok());
  SegmentDescriptor real = victim->ListSegments().at(0);

  // The honest descriptor works, and the route is ucx.
  auto handle = writer->OpenSegment(real);
  ASSERT_TRUE(handle.ok()) << handle.status();
  std::vector<uint8_t> buf(4096, 0x22);
  ASSERT_TRUE(Transfer(*writer, TransferOp::kWrite, buf.data(), *handle, 0, buf.size()).ok());
  EXPECT_EQ(static_cast<uint8_t*>((*memory)->data())[0], 0x22);

  // The alias: the attacker's engine id (and its own host and address), the victim's ucx blob.
  std::unique_ptr<TransferEngine> attacker = CreateEngine("ucx", "", token);
  ASSERT_TRUE(attacker);
  SegmentDescriptor alias = real;
  alias.engine_id = attacker->id();
  alias.address = attacker->address();
  alias.name = "alias";
  auto refused = writer->OpenSegment(alias);
  ASSERT_FALSE(refused.ok()) << "an alias of another engine's memory was opened";
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied) << refused.status();
  EXPECT_NE(refused.status().message().find("did not prove"), std::string::npos)
      << refused.status();
  EXPECT_EQ(static_cast<uint8_t*>((*memory)->data())[4096], 0x11) << "the victim's bytes";

  // An owner without the token cannot answer for one that has it.
  std::unique_ptr<TransferEngine> tokenless = CreateEngine("ucx");
  ASSERT_TRUE(tokenless);
  auto other = tokenless->AllocateSegmentMemory(1 << 20);
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(tokenless->RegisterSegment("kv", *other).ok());
  auto unproven = writer->OpenSegment(tokenless->ListSegments().at(0));
  ASSERT_FALSE(unproven.ok());
  EXPECT_EQ(unproven.status().code(), StatusCode::kPermissionDenied) << unproven.status();
  // The honest handle still works.
  ASSERT_TRUE(Transfer(*writer, TransferOp::kRead, buf.data(), *handle, 0, buf.size()).ok());
}

TEST(UcxPeerTest, DestroyedPeerFailsItsSlicesAndOthersKeepWorking) {
  Owner doomed = StartOwner("ucx", 256ull << 20, 3);
  Owner healthy = StartOwner("ucx", 16ull << 20, 4);
  auto initiator = CreateEngine("ucx");
  ASSERT_TRUE(doomed.engine && healthy.engine && initiator);
  auto doomed_handle = initiator->OpenSegment(doomed.engine->address(), "kv");
  auto healthy_handle = initiator->OpenSegment(healthy.engine->address(), "kv");
  ASSERT_TRUE(doomed_handle.ok() && healthy_handle.ok());
  const std::string doomed_id = doomed.engine->id();

  // 8 GiB to read, far more than can move before the owner goes; the requests share 256 MiB of
  // local buffer (their bytes are not checked).
  const uint64_t kBlock = 1 << 20;
  std::vector<uint8_t> buf(256 * kBlock);
  auto batch =
      initiator->Submit(testutil::ReadsFrom(buf.data(), *doomed_handle, 8192, kBlock), seconds(20));
  ASSERT_TRUE(batch.ok()) << batch.status();
  doomed.engine.reset();  // stops its worker mid-batch
  ASSERT_TRUE(initiator->Wait(*batch, seconds(30)).ok()) << "hung on a dead peer";
  auto results = initiator->Results(*batch);
  ASSERT_TRUE(results.ok());
  EXPECT_GT(testutil::CheckDeadPeerFailures(*results, {doomed_id}), 0u)
      << "every request finished before the peer went; nothing was proven";
  ASSERT_TRUE(initiator->Release(*batch).ok());

  std::vector<uint8_t> small(4096);
  Status again =
      Transfer(*initiator, TransferOp::kRead, small.data(), *doomed_handle, 0, 4096, seconds(5));
  EXPECT_EQ(again.code(), StatusCode::kUnavailable) << again;

  std::vector<uint8_t> good(2 << 20);
  ASSERT_TRUE(
      Transfer(*initiator, TransferOp::kRead, good.data(), *healthy_handle, 0, good.size()).ok());
  EXPECT_EQ(std::memcmp(good.data(), healthy.bytes(), good.size()), 0);
}

TEST(UcxRouteTest, AutoOnOneHostDoesNotPickUcx) {
  Owner same_host = StartOwner("auto", 1 << 20);
  Owner other_host = StartOwner("auto", 1 << 20, 2, "ucx-test-other-host");
  auto initiator = CreateEngine("auto");
  ASSERT_TRUE(same_host.engine && other_host.engine && initiator);
  auto near = initiator->OpenSegment(same_host.engine->address(), "kv");
  ASSERT_TRUE(near.ok()) << near.status();
  EXPECT_EQ(initiator->SegmentRoute(*near).value(), RouteKind::kSameHostShm);
  // Another host, but no RDMA lane on this machine: tcp, not ucx over tcp.
  auto far = initiator->OpenSegment(other_host.engine->address(), "kv");
  ASSERT_TRUE(far.ok()) << far.status();
  EXPECT_EQ(initiator->SegmentRoute(*far).value(), RouteKind::kTcp);
  std::vector<uint8_t> buf(4096);
  ASSERT_TRUE(Transfer(*initiator, TransferOp::kRead, buf.data(), *far, 0, buf.size()).ok());
  EXPECT_EQ(std::memcmp(buf.data(), other_host.bytes(), buf.size()), 0);
}

TEST(UcxRouteTest, NamedUcxReachesAnotherEngineOnThisHostAndItself) {
  Owner owner = StartOwner("ucx", 1 << 20);
  ASSERT_TRUE(owner.engine);
  auto own = owner.engine->OpenSegment(owner.engine->address(), "kv");
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(owner.engine->SegmentRoute(*own).value(), kUcx);
  std::vector<uint8_t> buf(4096);
  ASSERT_TRUE(Transfer(*owner.engine, TransferOp::kRead, buf.data(), *own, 4096, buf.size()).ok());
  EXPECT_EQ(std::memcmp(buf.data(), owner.bytes() + 4096, buf.size()), 0);
}

TEST(UcxBlobTest, RoundTripAndLimits) {
  SegmentDescriptor d;
  d.name = "kv";
  d.engine_id = "h/1/abc";
  d.segment_id = 7;
  d.size = 4096;
  transfer::ucx::UcxBlob blob;
  blob.rdma = true;
  blob.segment_id = 7;
  blob.remote_base = 0x10000;
  blob.size = 8192;
  blob.worker_address = "address";
  blob.rkey = "rkey";
  auto parsed = transfer::ucx::ParseBlob(transfer::ucx::EncodeBlob(blob), d);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->rdma);
  EXPECT_EQ(parsed->remote_base, 0x10000u);
  EXPECT_EQ(parsed->size, 8192u);
  EXPECT_EQ(parsed->worker_address, "address");
  EXPECT_EQ(parsed->rkey, "rkey");
  blob.rkey = std::string(transfer::ucx::kMaxRkeyBytes + 1, 'r');
  auto too_long = transfer::ucx::ParseBlob(transfer::ucx::EncodeBlob(blob), d);
  EXPECT_EQ(too_long.status().code(), StatusCode::kInvalidArgument);
  blob.rkey = "rkey";
  blob.size = 100;  // smaller than the descriptor says
  EXPECT_FALSE(transfer::ucx::ParseBlob(transfer::ucx::EncodeBlob(blob), d).ok());
}

}  // namespace
}  // namespace larder
