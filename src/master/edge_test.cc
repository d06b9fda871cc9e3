// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Validation at the master's edge, against a real MasterServer over gRPC: oversize keys and
// batches, keys as bytes, the fields a put carries, bulk removals' arguments, segment sizes.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "common/limits.h"
#include "master/rpc_test_support.h"

namespace larder::master {
namespace {

using rpc_test::Client;
using rpc_test::Keys;
using rpc_test::MasterClient;
using rpc_test::MasterClientOptions;
using rpc_test::Mount;
using rpc_test::MountAndPut;
using rpc_test::Proto;
using rpc_test::RawStub;
using rpc_test::StartMaster;
using rpc_test::Stub;

class MasterEdgeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = StartMaster("");
    ASSERT_NE(server_, nullptr);
    rpc_ = std::make_unique<MasterClient>(server_->address(), std::chrono::seconds(30));
    MountAndPut(*rpc_, "c", "seg", {"small"});
  }
  std::unique_ptr<MasterServer> server_;
  std::unique_ptr<MasterClient> rpc_;
};

TEST_F(MasterEdgeTest, OversizeKeysAreRefusedOnEveryCallAndQuotedShort) {
  const std::string huge(1 << 20, 'k');
  proto::BatchKeysRequest request;
  request.set_client_id("c");
  for (int i = 0; i < 20; ++i) request.add_keys(huge);
  size_t total_reply_bytes = 0;
  auto check_errors = [&](const auto& errors, const char* what) {
    ASSERT_EQ(errors.size(), 20) << what;
    for (const proto::KeyError& error : errors) {
      EXPECT_EQ(error.status().code(), static_cast<int>(StatusCode::kInvalidArgument)) << what;
      EXPECT_LT(error.status().message().size(), 200u) << what;
      EXPECT_NE(error.status().message().find("1048576 bytes"), std::string::npos)
          << error.status().message();
    }
  };
  proto::BatchGetReplicasReply got;
  ASSERT_TRUE(rpc_->Call("BatchGetReplicas", &Stub::BatchGetReplicas, request, &got).ok());
  check_errors(got.errors(), "get");
  total_reply_bytes += got.ByteSizeLong();
  proto::BatchStatusReply status_reply;
  ASSERT_TRUE(rpc_->Call("BatchRemove", &Stub::BatchRemove, request, &status_reply).ok());
  check_errors(status_reply.errors(), "remove");
  total_reply_bytes += status_reply.ByteSizeLong();
  ASSERT_TRUE(rpc_->Call("BatchPutEnd", &Stub::BatchPutEnd, request, &status_reply).ok());
  ASSERT_TRUE(rpc_->Call("BatchPutRevoke", &Stub::BatchPutRevoke, request, &status_reply).ok());
  proto::BatchExistReply exists;
  ASSERT_TRUE(rpc_->Call("BatchExist", &Stub::BatchExist, request, &exists).ok());
  ASSERT_EQ(exists.exists_size(), 20);
  for (bool e : exists.exists()) EXPECT_FALSE(e);
  check_errors(exists.errors(), "exist");  // an error, not an absent key
  total_reply_bytes += exists.ByteSizeLong();
  EXPECT_LT(total_reply_bytes, 16u * 1024);  // 20 MiB of keys asked, a few KiB answered
  EXPECT_EQ(server_->state().Stats().objects, 1u);
}

// A holder's report of a disk copy that no disk could hold (empty, or past the largest region) is
// refused whole, and nothing of it is recorded: the size would answer Exist and GetSize.
TEST_F(MasterEdgeTest, DiskCopiesOfImpossibleSizesAreRefused) {
  proto::DiskHolder holder;
  holder.set_identity("0123456789abcdef0123456789abcdef");
  holder.set_capacity_bytes(1ull << 30);
  proto::DiskPollRequest poll;
  poll.set_client_id("c");
  *poll.mutable_holder() = holder;
  proto::DiskPollReply polled;
  ASSERT_TRUE(rpc_->Call("DiskPoll", &Stub::DiskPoll, poll, &polled).ok());
  ASSERT_TRUE(polled.announce());
  for (uint64_t size : {uint64_t{0}, kMaxDiskRegionBytes + 1, ~uint64_t{0}}) {
    proto::DiskReportRequest report;
    report.set_client_id("c");
    *report.mutable_holder() = holder;
    report.set_announce(true);
    proto::DiskCopy* copy = report.add_stored();
    copy->set_key("on-disk");
    copy->set_size(size);
    proto::DiskReportReply reply;
    Status status = rpc_->Call("DiskReport", &Stub::DiskReport, report, &reply);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << size << ": " << status;
  }
  EXPECT_FALSE(server_->state().disk().Has("on-disk"));
  proto::DiskReportRequest report;
  report.set_client_id("c");
  *report.mutable_holder() = holder;
  report.set_announce(true);
  proto::DiskCopy* copy = report.add_stored();
  copy->set_key("on-disk");
  copy->set_size(4096);
  proto::DiskReportReply reply;
  ASSERT_TRUE(rpc_->Call("DiskReport", &Stub::DiskReport, report, &reply).ok());
  EXPECT_TRUE(server_->state().disk().Has("on-disk"));
}

TEST_F(MasterEdgeTest, KeysAreBytes) {
  const std::string binary("\xff\xfe\x00\x01page", 8);
  proto::BatchPutStartRequest start;
  proto::BatchPutStartReply started;
  start.set_client_id("c");
  proto::PutItem* item = start.add_items();
  item->set_key(binary);
  item->set_size(64);
  ASSERT_TRUE(rpc_->Call("BatchPutStart", &Stub::BatchPutStart, start, &started).ok());
  ASSERT_EQ(started.results(0).status().code(), 0) << started.results(0).status().message();
  proto::BatchKeysRequest end;
  proto::BatchStatusReply ended;
  end.set_client_id("c");
  end.add_keys(binary);
  ASSERT_TRUE(rpc_->Call("BatchPutEnd", &Stub::BatchPutEnd, end, &ended).ok());
  EXPECT_EQ(ended.errors_size(), 0);
  proto::BatchGetReplicasReply got;
  ASSERT_TRUE(rpc_->Call("BatchGetReplicas", &Stub::BatchGetReplicas, end, &got).ok());
  EXPECT_EQ(got.errors_size(), 0);
  EXPECT_EQ(got.size(0), 64u);
  // An error about such a key quotes it escaped, so the reply stays valid text.
  proto::BatchKeysRequest missing;
  missing.set_client_id("c");
  missing.add_keys(std::string("\xc3\x28missing", 9));
  ASSERT_TRUE(rpc_->Call("BatchGetReplicas", &Stub::BatchGetReplicas, missing, &got).ok());
  ASSERT_EQ(got.errors_size(), 1);
  EXPECT_EQ(got.errors(0).status().code(), static_cast<int>(StatusCode::kNotFound));
  EXPECT_NE(got.errors(0).status().message().find("'\\xc3(missing'"), std::string::npos)
      << got.errors(0).status().message();
}

TEST_F(MasterEdgeTest, SoftPinUpsertAndForceFieldsReachTheMaster) {
  auto start_one = [&](const std::string& key, uint64_t size,
                       const std::function<void(proto::BatchPutStartRequest&)>& set) {
    proto::BatchPutStartRequest start;
    proto::BatchPutStartReply started;
    start.set_client_id("c");
    proto::PutItem* item = start.add_items();
    item->set_key(key);
    item->set_size(size);
    set(start);
    EXPECT_TRUE(rpc_->Call("BatchPutStart", &Stub::BatchPutStart, start, &started).ok());
    return started.results_size() == 1 ? started.results(0) : proto::PutStartResult();
  };
  auto end_one = [&](const std::string& key) {
    proto::BatchKeysRequest end;
    proto::BatchStatusReply ended;
    end.set_client_id("c");
    end.add_keys(key);
    EXPECT_TRUE(rpc_->Call("BatchPutEnd", &Stub::BatchPutEnd, end, &ended).ok());
    EXPECT_EQ(ended.errors_size(), 0);
  };
  const int invalid = static_cast<int>(StatusCode::kInvalidArgument);
  EXPECT_EQ(start_one("x", 64, [](auto& r) { r.set_soft_pin_action(proto::SoftPinAction(99)); })
                .status()
                .code(),
            invalid);
  EXPECT_EQ(start_one("x", 64,
                      [](auto& r) {
                        r.set_soft_pin_action(proto::SOFT_PIN_ENABLE);
                        r.set_soft_pin_ttl_ms(UINT64_MAX);
                      })
                .status()
                .code(),
            invalid);
  EXPECT_EQ(start_one("x", 64, [](auto& r) { r.set_soft_pin_ttl_ms(1000); }).status().code(),
            invalid);  // with PRESERVE
  proto::PutStartResult pinned =
      start_one("soft", 64, [](auto& r) { r.set_soft_pin_action(proto::SOFT_PIN_ENABLE); });
  ASSERT_EQ(pinned.status().code(), 0) << pinned.status().message();
  end_one("soft");
  EXPECT_EQ(server_->state().Stats().soft_pinned_objects, 1u);
  // An upsert replaces "small" (4096 bytes) with 128 bytes.
  proto::PutStartResult replaced = start_one("small", 128, [](auto& r) { r.set_upsert(true); });
  ASSERT_EQ(replaced.status().code(), 0) << replaced.status().message();
  EXPECT_FALSE(replaced.already_exists());
  end_one("small");
  proto::BatchKeysRequest get;
  proto::BatchGetReplicasReply got;
  get.set_client_id("c");
  get.add_keys("small");
  ASSERT_TRUE(rpc_->Call("BatchGetReplicas", &Stub::BatchGetReplicas, get, &got).ok());
  ASSERT_EQ(got.size_size(), 1);
  EXPECT_EQ(got.size(0), 128u);
  // Leased by that get: removed only with force.
  proto::BatchStatusReply removed;
  ASSERT_TRUE(rpc_->Call("BatchRemove", &Stub::BatchRemove, get, &removed).ok());
  ASSERT_EQ(removed.errors_size(), 1);
  EXPECT_EQ(removed.errors(0).status().code(), static_cast<int>(StatusCode::kUnavailable));
  get.set_force(true);
  ASSERT_TRUE(rpc_->Call("BatchRemove", &Stub::BatchRemove, get, &removed).ok());
  EXPECT_EQ(removed.errors_size(), 0);
  EXPECT_EQ(server_->state().Stats().objects, 1u);
}

TEST_F(MasterEdgeTest, BulkRemovalsActInTheirTenantAndCheckTheirArguments) {
  using namespace std::string_view_literals;
  for (std::string_view key : {"\0t\0a"sv, "\0t\0b"sv, "\0u\0a"sv}) {
    PutStartItem item{key, 4096};
    ASSERT_TRUE(server_->state().BatchPutStart("c", std::span(&item, 1), {}).ok());
    ASSERT_TRUE(server_->state().BatchPutEnd("c", std::span(&key, 1)).ok());
  }
  proto::RemoveByRegexRequest regex;
  proto::RemoveAllReply reply;
  regex.set_client_id("c");
  regex.set_tenant("t");
  regex.set_pattern("a|small");
  ASSERT_TRUE(rpc_->Call("RemoveByRegex", &Stub::RemoveByRegex, regex, &reply).ok());
  EXPECT_EQ(reply.removed(), 1u);
  regex.set_pattern("(");
  Status status = rpc_->Call("RemoveByRegex", &Stub::RemoveByRegex, regex, &reply);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("missing )"), std::string::npos) << status;
  regex.set_pattern(".*");
  regex.set_tenant(std::string(129, 't'));
  status = rpc_->Call("RemoveByRegex", &Stub::RemoveByRegex, regex, &reply);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status;
  proto::RemoveAllRequest all;
  all.set_client_id("c");
  all.set_tenant("u");
  ASSERT_TRUE(rpc_->Call("RemoveAll", &Stub::RemoveAll, all, &reply).ok());
  EXPECT_EQ(reply.removed(), 1u);
  EXPECT_EQ(server_->state().Stats().objects, 2u);  // "small" and "\0t\0b"
}

TEST_F(MasterEdgeTest, SegmentSizesCannotWrapTheCapacity) {
  const uint64_t capacity = server_->state().Stats().bytes_capacity;
  proto::MountSegmentsRequest mount;
  proto::MountSegmentsReply mounted;
  mount.set_client_id("c2");
  for (int i = 0; i < 2; ++i) {
    proto::SegmentInfo* info = mount.add_segments();
    info->set_name("giant-" + std::to_string(i));
    info->set_base(static_cast<uint64_t>(i) << 63);
    info->set_size(1ULL << 63);
    SetOwnDescriptor(info, "c2", "", info->name(), info->size());
  }
  ASSERT_TRUE(rpc_->Call("MountSegments", &Stub::MountSegments, mount, &mounted).ok());
  ASSERT_EQ(mounted.status_size(), 2);
  for (const proto::ItemStatus& status : mounted.status()) {
    EXPECT_EQ(status.code(), static_cast<int>(StatusCode::kInvalidArgument)) << status.message();
  }
  EXPECT_EQ(server_->state().Stats().bytes_capacity, capacity);
  // Too many segments in one mount, an oversize descriptor: refused before any is mounted.
  proto::MountSegmentsRequest many;
  many.set_client_id("c3");
  for (int i = 0; i < 65; ++i) {
    proto::SegmentInfo* info = many.add_segments();
    info->set_name("s" + std::to_string(i));
    info->set_base(static_cast<uint64_t>(i) << 30);
    info->set_size(1 << 20);
  }
  EXPECT_EQ(rpc_->Call("MountSegments", &Stub::MountSegments, many, &mounted).code(),
            StatusCode::kInvalidArgument);
  proto::MountSegmentsRequest fat;
  fat.set_client_id("c3");
  proto::SegmentInfo* info = fat.add_segments();
  info->set_name("fat");
  info->set_size(1 << 20);
  (*info->mutable_segment_descriptor()->mutable_transports())["tcp"] = std::string(100 * 1024, ' ');
  ASSERT_TRUE(rpc_->Call("MountSegments", &Stub::MountSegments, fat, &mounted).ok());
  EXPECT_EQ(mounted.status(0).code(), static_cast<int>(StatusCode::kInvalidArgument));
  EXPECT_EQ(server_->state().Stats().segments, 1u);
}

TEST_F(MasterEdgeTest, AnOversizeBatchIsRefusedBeforeAnythingIsAllocated) {
  proto::BatchPutStartRequest start;
  proto::BatchPutStartReply started;
  start.set_client_id("c");
  for (int i = 0; i < 100000; ++i) {
    proto::PutItem* item = start.add_items();
    item->set_key("b" + std::to_string(i));
    item->set_size(64);
  }
  Status status = rpc_->Call("BatchPutStart", &Stub::BatchPutStart, start, &started);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(started.results_size(), 0);
  const MasterStats stats = server_->state().Stats();
  EXPECT_EQ(stats.objects, 1u);
  EXPECT_EQ(stats.bytes_used, 4096u);
  proto::BatchKeysRequest keys;
  keys.set_client_id("c");
  for (int i = 0; i < 100000; ++i) keys.add_keys("b" + std::to_string(i));
  proto::BatchGetReplicasReply got;
  status = rpc_->Call("BatchGetReplicas", &Stub::BatchGetReplicas, keys, &got);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(server_->state().Stats().leases_active, 0u);
}

}  // namespace
}  // namespace larder::master
