// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The service's side of catalogs: what a client sends (catalogs, pids, acks) and gets back
// (recovery counts, the holder of a name, changes, the rebuilding error, the counters).
#include <gtest/gtest.h>

#include <string>

#include "master/master_server.h"
#include "master/metrics_text.h"
#include "master/own_descriptor.h"
#include "master/service.h"

namespace larder::master {
namespace {

class CatalogServiceTest : public ::testing::Test {
 protected:
  CatalogServiceTest()
      : state_(MasterOptions{}),
        sessions_(AuthOptions{}),
        service_(NewMasterHandlers(&state_, &sessions_)) {}

  proto::MountSegmentsReply Mount(const std::string& client, uint32_t pid,
                                  const std::vector<std::pair<std::string, uint64_t>>& catalog,
                                  uint32_t take_over_pid = 0) {
    proto::MountSegmentsRequest request;
    request.set_client_id(client);
    request.set_host_id("host-1");
    request.set_pid(pid);
    request.set_take_over_pid(take_over_pid);
    proto::SegmentInfo* segment = request.add_segments();
    segment->set_name("seg");
    segment->set_base(0x100000);
    segment->set_size(1 << 20);
    SetOwnDescriptor(segment, client, "host-1", "seg", 1 << 20);
    segment->set_catalog_incarnation(12345);
    for (const auto& [key, offset] : catalog) {
      proto::CatalogEntry* entry = segment->add_catalog();
      entry->set_key(key);
      entry->set_offset(offset);
      entry->set_size(100);
      entry->set_last_access(7);
    }
    proto::MountSegmentsReply reply;
    grpc::ServerContext context;
    EXPECT_TRUE(service_->MountSegments(&context, &request, &reply).ok());
    return reply;
  }

  MasterState state_;
  SessionTable sessions_;
  std::unique_ptr<proto::Master::Service> service_;
};

TEST_F(CatalogServiceTest, MountRebuildsSyncReportsAndGetsRetry) {
  // One good entry, one unaligned.
  proto::MountSegmentsReply mounted = Mount("a", 41, {{"good", 0}, {"bad", 100}});
  ASSERT_EQ(mounted.status_size(), 1);
  EXPECT_EQ(mounted.status(0).code(), 0) << mounted.status(0).message();
  ASSERT_EQ(mounted.recovery_size(), 1);
  EXPECT_EQ(mounted.recovery(0).restored(), 1u);
  EXPECT_EQ(mounted.recovery(0).dropped(), 1u);
  ASSERT_EQ(mounted.holder_pid_size(), 1);
  EXPECT_EQ(mounted.holder_pid(0), 0u);
  EXPECT_EQ(mounted.master_incarnation(), state_.incarnation());
  const uint64_t segment = mounted.segment_id(0);

  // The owner learns that the bad entry is gone.
  proto::SyncCatalogRequest sync;
  sync.set_client_id("a");
  proto::CatalogAck* ack = sync.add_acks();
  ack->set_segment_id(segment);
  ack->set_seq(0);
  proto::SyncCatalogReply changes;
  grpc::ServerContext context;
  ASSERT_TRUE(service_->SyncCatalog(&context, &sync, &changes).ok());
  ASSERT_EQ(changes.segments_size(), 1);
  EXPECT_EQ(changes.segments(0).segment_id(), segment);
  EXPECT_FALSE(changes.segments(0).reset());
  EXPECT_FALSE(changes.segments(0).more());
  ASSERT_EQ(changes.segments(0).changes_size(), 1);
  const proto::CatalogChange& removal = changes.segments(0).changes(0);
  EXPECT_EQ(removal.kind(), proto::CatalogChange::REMOVE);
  EXPECT_EQ(removal.entry().key(), "bad");
  EXPECT_EQ(removal.entry().offset(), 100u);
  EXPECT_EQ(removal.seq(), 1u);
  EXPECT_EQ(changes.segments(0).last_seq(), 1u);
  // Asked for the whole catalog: a reset holding the kept entry, current to seq 1.
  ack->set_seq(1);
  ack->set_full(true);
  proto::SyncCatalogReply whole;
  ASSERT_TRUE(service_->SyncCatalog(&context, &sync, &whole).ok());
  ASSERT_EQ(whole.segments_size(), 1);
  EXPECT_TRUE(whole.segments(0).reset());
  ASSERT_EQ(whole.segments(0).changes_size(), 1);
  EXPECT_EQ(whole.segments(0).changes(0).kind(), proto::CatalogChange::ADD);
  EXPECT_EQ(whole.segments(0).changes(0).entry().key(), "good");
  EXPECT_EQ(whole.segments(0).last_seq(), whole.segments(0).changes(0).seq());
  EXPECT_EQ(changes.master_incarnation(), state_.incarnation());

  // Another process on the same host asking for the name hears who holds it...
  proto::MountSegmentsReply refused = Mount("a2", 42, {});
  EXPECT_EQ(refused.status(0).code(), static_cast<int>(StatusCode::kAlreadyExists));
  EXPECT_EQ(refused.holder_host_id(0), "host-1");
  EXPECT_EQ(refused.holder_pid(0), 41u);
  EXPECT_EQ(refused.segment_id(0), 0u);
  // ...and takes it over by naming that process.
  proto::MountSegmentsReply taken = Mount("a2", 42, {{"good", 0}}, 41);
  EXPECT_EQ(taken.status(0).code(), 0) << taken.status(0).message();
  EXPECT_EQ(taken.recovery(0).restored(), 1u);

  // A get of a key nobody brought yet: retry, while the master rebuilds.
  proto::BatchKeysRequest get;
  get.set_client_id("a2");
  get.add_keys("elsewhere");
  get.add_keys("good");
  proto::BatchGetReplicasReply got;
  ASSERT_TRUE(service_->BatchGetReplicas(&context, &get, &got).ok());
  ASSERT_EQ(got.errors_size(), 1);
  EXPECT_EQ(got.errors(0).index(), 0u);
  EXPECT_EQ(got.errors(0).status().code(), static_cast<int>(StatusCode::kUnavailable));
  EXPECT_TRUE(got.errors(0).status().message().starts_with(kRebuildingMessage));
  EXPECT_EQ(got.size(1), 100u);

  proto::StatsRequest stats_request;
  proto::StatsReply stats;
  ASSERT_TRUE(service_->GetStats(&context, &stats_request, &stats).ok());
  EXPECT_EQ(stats.recovered_objects(), 2u);
  EXPECT_EQ(stats.catalog_entries_dropped(), 1u);
  const std::string metrics = RenderMetrics(state_);
  EXPECT_NE(metrics.find("\nlarder_recovered_objects_total 2\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\nlarder_catalog_entries_dropped_total 1\n"), std::string::npos);
}

TEST_F(CatalogServiceTest, SyncIsRefusedToUnknownClientsAndBounded) {
  proto::SyncCatalogRequest sync;
  sync.set_client_id("ghost");
  proto::SyncCatalogReply reply;
  grpc::ServerContext context;
  EXPECT_EQ(service_->SyncCatalog(&context, &sync, &reply).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  Mount("a", 1, {});
  sync.set_client_id("a");
  for (size_t i = 0; i <= kMaxSegmentsPerMount; ++i) sync.add_acks()->set_segment_id(i);
  EXPECT_EQ(service_->SyncCatalog(&context, &sync, &reply).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// A client that asks for TOUCHes apart gets them as columns, filling the seqs the other changes
// leave out; one that does not gets them as changes, as before.
TEST_F(CatalogServiceTest, TouchesComeAsColumnsToClientsThatAskForThem) {
  const uint64_t segment = Mount("a", 1, {{"good", 0}}).segment_id(0);
  grpc::ServerContext context;
  // 10,000 gets of the key in one batch: a TOUCH at each epoch of 4096 ticks it enters.
  proto::BatchKeysRequest get;
  get.set_client_id("a");
  for (int i = 0; i < 10000; ++i) get.add_keys("good");
  proto::BatchGetReplicasReply got;
  ASSERT_TRUE(service_->BatchGetReplicas(&context, &get, &got).ok());
  proto::SyncCatalogRequest sync;
  sync.set_client_id("a");
  proto::CatalogAck* ack = sync.add_acks();
  ack->set_segment_id(segment);
  proto::SyncCatalogReply as_changes;
  ASSERT_TRUE(service_->SyncCatalog(&context, &sync, &as_changes).ok());
  ASSERT_EQ(as_changes.segments_size(), 1);
  const proto::SegmentCatalogChanges& old_form = as_changes.segments(0);
  ASSERT_EQ(old_form.changes_size(), 2);
  EXPECT_EQ(old_form.touch_offset_size(), 0);
  sync.set_touches_apart(true);
  proto::SyncCatalogReply as_columns;
  ASSERT_TRUE(service_->SyncCatalog(&context, &sync, &as_columns).ok());
  ASSERT_EQ(as_columns.segments_size(), 1);
  const proto::SegmentCatalogChanges& columns = as_columns.segments(0);
  EXPECT_EQ(columns.changes_size(), 0);
  ASSERT_EQ(columns.touch_offset_size(), 2);
  ASSERT_EQ(columns.touch_last_access_size(), 2);
  EXPECT_EQ(columns.last_seq(), old_form.last_seq());
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(old_form.changes(i).kind(), proto::CatalogChange::TOUCH);
    EXPECT_EQ(columns.touch_offset(i), old_form.changes(i).entry().offset());
    EXPECT_EQ(columns.touch_last_access(i), old_form.changes(i).entry().last_access());
    EXPECT_TRUE(old_form.changes(i).entry().key().empty()) << "a TOUCH names its offset only";
  }
}

}  // namespace
}  // namespace larder::master
