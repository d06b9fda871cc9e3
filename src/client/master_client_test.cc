// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Decoding the master's columnar replies: what a client does with a reply that does not fit the
// request it sent.
#include "client/master_client.h"

#include <gtest/gtest.h>

namespace larder::client {
namespace {

void AddError(proto::BatchStatusReply* reply, uint32_t index, int code, const std::string& text) {
  proto::KeyError* error = reply->add_errors();
  error->set_index(index);
  error->mutable_status()->set_code(code);
  error->mutable_status()->set_message(text);
}

TEST(ItemStatusesTest, ItemsNotListedSucceeded) {
  proto::BatchStatusReply reply;
  AddError(&reply, 1, static_cast<int>(StatusCode::kNotFound), "key 'b' not found");
  AddError(&reply, 3, static_cast<int>(StatusCode::kUnavailable), "leased");
  std::vector<Status> statuses = ItemStatuses(4, reply.errors());
  ASSERT_EQ(statuses.size(), 4u);
  EXPECT_TRUE(statuses[0].ok());
  EXPECT_EQ(statuses[1].code(), StatusCode::kNotFound);
  EXPECT_EQ(statuses[1].message(), "key 'b' not found");
  EXPECT_TRUE(statuses[2].ok());
  EXPECT_EQ(statuses[3].code(), StatusCode::kUnavailable);
  EXPECT_EQ(ItemStatuses(0, {}).size(), 0u);
}

TEST(ItemStatusesTest, AnErrorOutsideTheBatchOrWithCodeZeroFailsEveryItem) {
  for (auto [index, code] : {std::pair{4u, 5}, std::pair{0u, 0}, std::pair{1000000u, 14}}) {
    proto::BatchStatusReply reply;
    AddError(&reply, index, code, "x");
    std::vector<Status> statuses = ItemStatuses(4, reply.errors());
    ASSERT_EQ(statuses.size(), 4u);
    for (const Status& status : statuses) {
      EXPECT_EQ(status.code(), StatusCode::kInternal) << index << " " << code;
      EXPECT_NE(status.message().find("malformed"), std::string::npos) << status;
    }
  }
}

TEST(ItemStatusesTest, UnknownCodesBecomeUnknown) {
  proto::BatchStatusReply reply;
  AddError(&reply, 0, 99, "from the future");
  AddError(&reply, 1, -3, "negative");
  std::vector<Status> statuses = ItemStatuses(2, reply.errors());
  EXPECT_EQ(statuses[0].code(), StatusCode::kUnknown);
  EXPECT_EQ(statuses[1].code(), StatusCode::kUnknown);
}

proto::BatchGetReplicasReply TwoKeys() {
  // key 0: one replica; key 1: two replicas.
  proto::BatchGetReplicasReply reply;
  reply.add_size(4096);
  reply.add_size(65536);
  reply.add_replica_count(1);
  reply.add_replica_count(2);
  for (uint64_t segment : {7, 8, 9}) {
    reply.add_segment_id(segment);
    reply.add_offset(segment * 4096);
  }
  return reply;
}

TEST(CheckReplicaColumnsTest, AcceptsAReplyThatMatchesTheRequest) {
  EXPECT_TRUE(CheckReplicaColumns(TwoKeys(), 2).ok());
  EXPECT_TRUE(CheckReplicaColumns(proto::BatchGetReplicasReply(), 0).ok());
}

TEST(CheckReplicaColumnsTest, RejectsEveryMismatch) {
  EXPECT_EQ(CheckReplicaColumns(TwoKeys(), 3).code(), StatusCode::kInternal);  // fewer keys
  EXPECT_EQ(CheckReplicaColumns(TwoKeys(), 1).code(), StatusCode::kInternal);  // more keys
  auto missing_offset = TwoKeys();
  missing_offset.mutable_offset()->RemoveLast();
  EXPECT_EQ(CheckReplicaColumns(missing_offset, 2).code(), StatusCode::kInternal);
  auto extra_segment = TwoKeys();
  extra_segment.add_segment_id(10);
  EXPECT_EQ(CheckReplicaColumns(extra_segment, 2).code(), StatusCode::kInternal);
  auto wrong_count = TwoKeys();
  wrong_count.set_replica_count(1, 5);
  Status status = CheckReplicaColumns(wrong_count, 2);
  EXPECT_EQ(status.code(), StatusCode::kInternal);
  EXPECT_NE(status.message().find("6 replicas"), std::string::npos) << status;
  auto no_sizes = TwoKeys();
  no_sizes.clear_size();
  EXPECT_EQ(CheckReplicaColumns(no_sizes, 2).code(), StatusCode::kInternal);
}

TEST(CheckPutStartReplyTest, RequiresOneResultPerKey) {
  proto::BatchPutStartReply reply;
  EXPECT_TRUE(CheckPutStartReply(reply, 0).ok());
  reply.add_results()->add_replicas()->set_segment_id(7);
  reply.add_results()->set_already_exists(true);
  EXPECT_TRUE(CheckPutStartReply(reply, 2).ok());
  Status fewer = CheckPutStartReply(reply, 3);  // a short reply must not be read past its end
  EXPECT_EQ(fewer.code(), StatusCode::kInternal);
  EXPECT_NE(fewer.message().find("2 results for 3 keys"), std::string::npos) << fewer;
  EXPECT_EQ(CheckPutStartReply(reply, 1).code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace larder::client
