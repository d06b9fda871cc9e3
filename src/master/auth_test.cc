// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The control plane's authentication and authorization, against a real MasterServer over gRPC:
// every attack of docs/security.md that a network peer without the token can try, each shown to
// fail and to leave the victims' metadata as it was. The edge validation of requests is in
// edge_test.cc.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <nlohmann/json.hpp>
#include <string>

#include "client/master_client.h"
#include "common/control_auth.h"
#include "common/engine_key.h"
#include "common/proto_mac.h"
#include "common/test_certs.h"
#include "larder/store_client.h"
#include "master.grpc.pb.h"
#include "master/master_server.h"
#include "master/own_descriptor.h"
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

constexpr char kToken[] = "cluster-token-0123456789abcdef";
constexpr char kAdminToken[] = "admin-token-0123456789abcdef";

TEST(MasterAuthTest, CallsWithoutTheTokenAreUnauthenticatedAndChangeNothing) {
  auto server = StartMaster(kToken);
  ASSERT_NE(server, nullptr);
  MasterClient victim = Client(*server, "victim", kToken);
  MountAndPut(victim, "victim", "victim-seg", Keys("page/", 83));
  const MasterStats before = server->state().Stats();

  auto stub = RawStub(*server);
  auto expect_unauthenticated = [](const grpc::Status& status, const char* what) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << what << ": " << status.error_message();
  };
  {
    grpc::ClientContext context;
    proto::StatsRequest request;
    proto::StatsReply reply;
    expect_unauthenticated(stub->GetStats(&context, request, &reply), "GetStats");
    EXPECT_EQ(reply.objects(), 0u);
  }
  {
    grpc::ClientContext context;
    proto::ListSegmentsRequest request;
    proto::ListSegmentsReply reply;
    expect_unauthenticated(stub->ListSegments(&context, request, &reply), "ListSegments");
    EXPECT_EQ(reply.segments_size(), 0);  // no client id, endpoint or socket name leaks
  }
  {
    // Self-registration with a 1 PiB segment pointing at a rogue data server.
    grpc::ClientContext context;
    proto::MountSegmentsRequest request;
    proto::MountSegmentsReply reply;
    request.set_client_id("rogue");
    proto::SegmentInfo* info = request.add_segments();
    info->set_name("rogue-seg");
    info->set_size(1ULL << 50);
    info->mutable_segment_descriptor()->set_address("10.9.9.9:1");
    expect_unauthenticated(stub->MountSegments(&context, request, &reply), "MountSegments");
  }
  {
    grpc::ClientContext context;
    proto::RemoveAllRequest request;
    proto::RemoveAllReply reply;
    request.set_client_id("rogue");
    expect_unauthenticated(stub->RemoveAll(&context, request, &reply), "RemoveAll");
  }
  {
    grpc::ClientContext context;
    proto::RemoveByRegexRequest request;
    proto::RemoveAllReply reply;
    request.set_client_id("victim");
    request.set_pattern(".*");
    request.set_force(true);
    expect_unauthenticated(stub->RemoveByRegex(&context, request, &reply), "RemoveByRegex");
    EXPECT_EQ(reply.removed(), 0u);
  }
  {
    // Unmounting the victim's segment by naming its client id.
    grpc::ClientContext context;
    proto::UnmountSegmentsRequest request;
    proto::UnmountSegmentsReply reply;
    request.set_client_id("victim");
    request.add_segment_id(1);
    request.set_unregister_client(true);
    expect_unauthenticated(stub->UnmountSegments(&context, request, &reply), "UnmountSegments");
  }
  {
    grpc::ClientContext context;
    proto::HeartbeatRequest request;
    proto::HeartbeatReply reply;
    request.set_client_id("victim");
    expect_unauthenticated(stub->Heartbeat(&context, request, &reply), "Heartbeat");
  }
  {
    // Planting keys for the victim's next puts.
    grpc::ClientContext context;
    proto::BatchPutStartRequest request;
    proto::BatchPutStartReply reply;
    request.set_client_id("victim");
    request.add_items()->set_key("page/planted");
    request.mutable_items(0)->set_size(4096);
    expect_unauthenticated(stub->BatchPutStart(&context, request, &reply), "BatchPutStart");
  }
  {
    // A made-up proof.
    grpc::ClientContext context;
    context.AddMetadata(control_auth::kMetadataKey,
                        control_auth::EncodeMetadata(1, 1, control_auth::Digest{}));
    proto::StatsRequest request;
    proto::StatsReply reply;
    expect_unauthenticated(stub->GetStats(&context, request, &reply), "forged proof");
  }
  const MasterStats after = server->state().Stats();
  EXPECT_EQ(after.objects, before.objects);
  EXPECT_EQ(after.objects, 83u);
  EXPECT_EQ(after.segments, before.segments);
  EXPECT_EQ(after.clients, before.clients);
  EXPECT_EQ(after.bytes_capacity, before.bytes_capacity);
}

TEST(MasterAuthTest, AWrongTokenOpensNoSession) {
  auto server = StartMaster(kToken);
  ASSERT_NE(server, nullptr);
  MasterClient intruder = Client(*server, "intruder", "not-the-cluster-token");
  proto::StatsRequest request;
  proto::StatsReply reply;
  Status status = intruder.Call("GetStats", &Stub::GetStats, request, &reply);
  EXPECT_EQ(status.code(), StatusCode::kUnauthenticated) << status;
  MasterClient none = Client(*server, "none", "");
  status = none.Call("GetStats", &Stub::GetStats, request, &reply);
  EXPECT_EQ(status.code(), StatusCode::kUnauthenticated) << status;
  EXPECT_NE(status.message().find("LARDER_AUTH_TOKEN"), std::string::npos) << status;
  EXPECT_EQ(server->state().Stats().clients, 0u);
}

TEST(MasterAuthTest, ASessionActsForItsOwnClientOnly) {
  auto server = StartMaster(kToken);
  ASSERT_NE(server, nullptr);
  MasterClient victim = Client(*server, "victim", kToken);
  MountAndPut(victim, "victim", "victim-seg", Keys("page/", 107));
  // A token holder opens its own session, then acts in the victim's name.
  MasterClient other = Client(*server, "other", kToken);
  proto::UnmountSegmentsRequest unmount;
  proto::UnmountSegmentsReply unmounted;
  unmount.set_client_id("victim");
  unmount.add_segment_id(server->state().ListSegments({})[0].segment_id);
  unmount.set_unregister_client(true);
  Status status = other.Call("UnmountSegments", &Stub::UnmountSegments, unmount, &unmounted);
  EXPECT_EQ(status.code(), StatusCode::kPermissionDenied) << status;
  proto::HeartbeatRequest beat;
  proto::HeartbeatReply beat_reply;
  beat.set_client_id("victim");
  status = other.Call("Heartbeat", &Stub::Heartbeat, beat, &beat_reply);
  EXPECT_EQ(status.code(), StatusCode::kPermissionDenied) << status;
  proto::BatchKeysRequest remove;
  proto::BatchStatusReply removed;
  remove.set_client_id("victim");
  remove.add_keys("page/1");
  status = other.Call("BatchRemove", &Stub::BatchRemove, remove, &removed);
  EXPECT_EQ(status.code(), StatusCode::kPermissionDenied) << status;
  // Nor can it take the victim's client id over with a session of its own.
  MasterClient impostor = Client(*server, "victim", kToken);
  proto::StatsRequest stats;
  proto::StatsReply stats_reply;
  status = impostor.Call("GetStats", &Stub::GetStats, stats, &stats_reply);
  EXPECT_EQ(status.code(), StatusCode::kPermissionDenied) << status;

  EXPECT_EQ(server->state().Stats().objects, 107u);
  EXPECT_EQ(server->state().Stats().segments, 1u);
  // The victim's own session still works.
  status = victim.Call("Heartbeat", &Stub::Heartbeat, beat, &beat_reply);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_FALSE(beat_reply.remount_required());
}

// A heartbeat's gauges become metric names (larder_client_<name>): only names of [a-z0-9_], each
// once, at most kMaxTransportGauges of them, are kept.
TEST(MasterAuthTest, AHeartbeatsGaugesAreKeptOnlyWhenTheyAreNames) {
  auto server = StartMaster(kToken);
  ASSERT_NE(server, nullptr);
  MasterClient client = Client(*server, "client", kToken);
  MountAndPut(client, "client", "client-seg", Keys("page/", 1));
  proto::HeartbeatRequest beat;
  proto::HeartbeatReply beat_reply;
  beat.set_client_id("client");
  auto add = [&](const std::string& transport, const std::string& name, uint64_t value) {
    proto::TransportGauge* gauge = beat.add_gauges();
    gauge->set_transport(transport);
    gauge->set_name(name);
    gauge->set_value(value);
  };
  add("shm", "mapped_segments", 3);
  add("shm", "mapped_segments", 4);                   // twice: the first counts
  add("shm", "bad{name=\"x\"} 1\nforged_metric", 5);  // would forge a series
  add("shm", "Upper", 6);
  add("shm", std::string(kMaxGaugeNameBytes + 1, 'a'), 7);
  add("shm\n", "transport_with_newline", 8);
  add("shm", "", 9);
  for (size_t i = 0; i < 2 * kMaxTransportGauges; ++i) add("device", "g" + std::to_string(i), i);
  Status status = client.Call("Heartbeat", &Stub::Heartbeat, beat, &beat_reply);
  ASSERT_TRUE(status.ok()) << status;
  auto traffic = server->state().Traffic();
  ASSERT_EQ(traffic.size(), 1u);
  const ClientTraffic& report = traffic[0].second;
  ASSERT_EQ(report.gauges.size(), kMaxTransportGauges);
  EXPECT_EQ(report.gauges[0].name, "mapped_segments");
  EXPECT_EQ(report.gauges[0].transport, "shm");
  EXPECT_EQ(report.Gauge("mapped_segments"), 3u);
  EXPECT_EQ(report.gauges[1].name, "g0");
  EXPECT_EQ(report.gauges.back().name, "g" + std::to_string(kMaxTransportGauges - 2));
  for (const TransportGaugeReport& gauge : report.gauges) {
    EXPECT_EQ(gauge.name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_"),
              std::string::npos)
        << gauge.name;
  }
}

// A token holder reads the victim's descriptor and mounts it as a segment of its own: every put
// placed there would land in the victim's memory. Refused, as are descriptors that are not one.
TEST(MasterAuthTest, AClientMountsOnlyItsOwnSegments) {
  auto server = StartMaster(kToken);
  ASSERT_NE(server, nullptr);
  MasterClient victim = Client(*server, "victim", kToken);
  MountAndPut(victim, "victim", "victim-seg", Keys("page/", 10));
  MasterClient rogue = Client(*server, "rogue", kToken);
  proto::ListSegmentsRequest list;
  proto::ListSegmentsReply listed;
  ASSERT_TRUE(rogue.Call("ListSegments", &Stub::ListSegments, list, &listed).ok());
  ASSERT_EQ(listed.segments_size(), 1);
  const proto::SegmentInfo& stolen = listed.segments(0);
  auto mount = [&](const std::string& name, uint64_t size,
                   const proto::SegmentDescriptor& descriptor) {
    return Mount(rogue, "rogue", name, 0x100000, size, descriptor);
  };
  // The victim's descriptor, under a new name and under its own.
  Status status = mount("alias", stolen.size(), stolen.segment_descriptor());
  EXPECT_EQ(status.code(), StatusCode::kPermissionDenied) << status;
  EXPECT_NE(status.message().find("a client mounts only its own segments"), std::string::npos)
      << status;
  status = mount("victim-seg", stolen.size(), stolen.segment_descriptor());
  EXPECT_EQ(status.code(), StatusCode::kPermissionDenied) << status;
  // Not a descriptor at all, or one of another segment, size or host.
  std::vector<proto::SegmentDescriptor> junk(
      6, Proto(OwnDescriptor("rogue", "host", "junk", 1 << 20)));
  junk[0].Clear();  // says nothing (not even a memory kind)
  junk[1].set_memory_kind("bogus");
  junk[2].set_page_size(3000);
  for (int i = 0; i <= static_cast<int>(SegmentDescriptor::kMaxTransports); ++i) {
    (*junk[3].mutable_transports())["t" + std::to_string(i)] = "x";
  }
  (*junk[4].mutable_transports())[""] = "x";
  (*junk[5].mutable_transports())["tcp"] = std::string(SegmentDescriptor::kMaxBlobBytes + 1, 'x');
  for (const proto::SegmentDescriptor& descriptor : junk) {
    status = mount("junk", 1 << 20, descriptor);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument)
        << descriptor.ShortDebugString().substr(0, 200) << ": " << status;
  }
  status = mount("mine", 1ull << 45, Proto(OwnDescriptor("rogue", "host", "mine", 1 << 20)));
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status;
  status = mount("mine", 1 << 20, Proto(OwnDescriptor("rogue", "host", "other", 1 << 20)));
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status;
  status = mount("mine", 1 << 20, Proto(OwnDescriptor("rogue", "elsewhere", "mine", 1 << 20)));
  EXPECT_EQ(status.code(), StatusCode::kPermissionDenied) << status;
  EXPECT_EQ(server->state().Stats().segments, 1u);
  // Puts go to the victim's segment only; its objects are all there.
  EXPECT_EQ(server->state().Stats().objects, 10u);
  // Its own descriptor mounts.
  status = mount("mine", 1 << 20, Proto(OwnDescriptor("rogue", "host", "mine", 1 << 20)));
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(server->state().Stats().segments, 2u);
}

// What the operator's routes and Mooncake's show of a segment (its page size, its engine's address)
// is what the descriptor the master checked says.
TEST(MasterAuthTest, AMountsPageSizeAndAddressComeFromItsDescriptor) {
  auto server = StartMaster(kToken);
  ASSERT_NE(server, nullptr);
  MasterClient client = Client(*server, "client", kToken);
  SegmentDescriptor descriptor;
  descriptor.name = "huge";
  descriptor.engine_id = "client";
  descriptor.host_id = "host";
  descriptor.address = "10.1.2.3:4567";
  descriptor.size = 4 << 20;
  descriptor.page_size = 2 << 20;
  Status mounted =
      Mount(client, "client", descriptor.name, 0x200000, descriptor.size, Proto(descriptor));
  ASSERT_TRUE(mounted.ok()) << mounted;
  std::vector<SegmentView> segments = server->state().ListSegments({});
  ASSERT_EQ(segments.size(), 1u);
  EXPECT_EQ(segments[0].descriptor.page_size, uint64_t{2} << 20);
  EXPECT_EQ(segments[0].descriptor.address, "10.1.2.3:4567");
}

TEST(MasterAuthTest, RemoveAllNeedsTheAdminToken) {
  auto server = StartMaster(kToken, kAdminToken);
  ASSERT_NE(server, nullptr);
  MasterClient writer = Client(*server, "writer", kToken);
  MountAndPut(writer, "writer", "writer-seg", Keys("k", 20));
  proto::RemoveAllRequest request;
  proto::RemoveAllReply reply;
  request.set_client_id("writer");
  Status status = writer.Call("RemoveAll", &Stub::RemoveAll, request, &reply);
  EXPECT_EQ(status.code(), StatusCode::kPermissionDenied) << status;
  EXPECT_NE(status.message().find("LARDER_ADMIN_TOKEN"), std::string::npos) << status;
  EXPECT_EQ(server->state().Stats().objects, 20u);

  MasterClient wrong_admin = Client(*server, "op1", kToken, "wrong-admin-token");
  request.set_client_id("op1");
  status = wrong_admin.Call("RemoveAll", &Stub::RemoveAll, request, &reply);
  EXPECT_EQ(status.code(), StatusCode::kUnauthenticated) << status;
  EXPECT_EQ(server->state().Stats().objects, 20u);

  // An operator session needs a mounted client as any RemoveAll caller does.
  MasterClient admin = Client(*server, "writer-admin", kToken, kAdminToken);
  proto::MountSegmentsRequest mount;
  proto::MountSegmentsReply mounted;
  mount.set_client_id("writer-admin");
  ASSERT_TRUE(admin.Call("MountSegments", &Stub::MountSegments, mount, &mounted).ok());
  request.set_client_id("writer-admin");
  status = admin.Call("RemoveAll", &Stub::RemoveAll, request, &reply);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(reply.removed(), 20u);
}

TEST(MasterAuthTest, RemoveByRegexNeedsASessionOfItsOwnClientOnly) {
  auto server = StartMaster(kToken, kAdminToken);
  ASSERT_NE(server, nullptr);
  MasterClient writer = Client(*server, "writer", kToken);
  MountAndPut(writer, "writer", "writer-seg", Keys("k", 20));
  proto::RemoveByRegexRequest request;
  proto::RemoveAllReply reply;
  // In another client's name: refused.
  request.set_client_id("victim");
  request.set_pattern("k1.*");
  Status status = writer.Call("RemoveByRegex", &Stub::RemoveByRegex, request, &reply);
  EXPECT_EQ(status.code(), StatusCode::kPermissionDenied) << status;
  EXPECT_EQ(server->state().Stats().objects, 20u);
  // In its own: no operator session needed, unlike RemoveAll (with a tenant or not).
  request.set_client_id("writer");
  status = writer.Call("RemoveByRegex", &Stub::RemoveByRegex, request, &reply);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(reply.removed(), 11u);  // k1 and k10..k19
  proto::RemoveAllRequest all;
  proto::RemoveAllReply all_reply;
  all.set_client_id("writer");
  all.set_tenant("t");
  status = writer.Call("RemoveAll", &Stub::RemoveAll, all, &all_reply);
  EXPECT_EQ(status.code(), StatusCode::kPermissionDenied) << status;
  EXPECT_EQ(server->state().Stats().objects, 9u);
}

// Opens a session by hand, as control_auth.h describes, and returns its id and key.
std::pair<uint64_t, std::string> OpenSessionByHand(Stub& stub, const std::string& client_id) {
  proto::ChallengeReply challenge;
  {
    grpc::ClientContext context;
    EXPECT_TRUE(stub.Challenge(&context, proto::ChallengeRequest(), &challenge).ok());
  }
  std::string client_nonce(32, 'n');
  proto::OpenSessionRequest open;
  open.set_client_id(client_id);
  open.set_client_nonce(client_nonce);
  open.set_server_nonce(challenge.server_nonce());
  auto proof = control_auth::ClientProof(kToken, client_id, client_nonce, challenge.server_nonce());
  open.set_proof(proof.data(), proof.size());
  proto::OpenSessionReply opened;
  grpc::ClientContext context;
  EXPECT_TRUE(stub.OpenSession(&context, open, &opened).ok());
  // The challenge is spent: the same proof opens nothing a second time.
  grpc::ClientContext again;
  proto::OpenSessionReply reopened;
  EXPECT_EQ(stub.OpenSession(&again, open, &reopened).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  return {opened.session_id(),
          control_auth::SessionKey(kToken, client_id, client_nonce, challenge.server_nonce(),
                                   opened.session_id())};
}

// A token holder cannot act for an engine that is away (a client not yet back after a master
// restart): an engine's id ends with its key's fingerprint, and a session for such an id opens only
// with that key's signature. Ids of other forms claim no engine.
TEST(MasterAuthTest, AnEngineIdOpensASessionOnlyWithThatEnginesKey) {
  auto server = StartMaster(kToken);
  ASSERT_NE(server, nullptr);
  auto stub = RawStub(*server);
  auto victim = EngineKey::Generate();
  auto attacker = EngineKey::Generate();
  const std::string victim_id = "host-v/4242/" + victim->fingerprint();
  auto open = [&](const std::string& client_id, const EngineKey* key, bool sign_other = false) {
    proto::ChallengeReply challenge;
    {
      grpc::ClientContext context;
      EXPECT_TRUE(stub->Challenge(&context, proto::ChallengeRequest(), &challenge).ok());
    }
    const std::string client_nonce(32, 'n');
    proto::OpenSessionRequest request;
    request.set_client_id(client_id);
    request.set_client_nonce(client_nonce);
    request.set_server_nonce(challenge.server_nonce());
    auto proof =
        control_auth::ClientProof(kToken, client_id, client_nonce, challenge.server_nonce());
    request.set_proof(proof.data(), proof.size());
    if (key != nullptr) {
      request.set_identity_key(key->public_key());
      const std::string message = control_auth::IdentityMessage(
          sign_other ? client_id + "x" : client_id, client_nonce, challenge.server_nonce());
      request.set_identity_signature(key->Sign(message));
    }
    grpc::ClientContext context;
    proto::OpenSessionReply opened;
    return stub->OpenSession(&context, request, &opened);
  };
  // Without a key, with another engine's key, or with a signature of something else: refused.
  grpc::Status none = open(victim_id, nullptr);
  EXPECT_EQ(none.error_code(), grpc::StatusCode::PERMISSION_DENIED) << none.error_message();
  EXPECT_NE(none.error_message().find("its own engine's id"), std::string::npos)
      << none.error_message();
  EXPECT_EQ(open(victim_id, attacker.get()).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(open(victim_id, victim.get(), /*sign_other=*/true).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // The engine itself opens it; an id of another form needs no key.
  grpc::Status own = open(victim_id, victim.get());
  EXPECT_TRUE(own.ok()) << own.error_message();
  EXPECT_TRUE(open("tool/7", nullptr).ok());
  // A real store client proves its engine's id.
  StoreClientOptions options;
  options.master_address = server->address();
  options.auth_token = kToken;
  auto store = StoreClient::Create(options);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_FALSE(ClaimedFingerprint((*store)->client_id()).empty()) << (*store)->client_id();
  const std::string value = "v";
  EXPECT_TRUE((*store)->Put("k", std::as_bytes(std::span(value))).ok());
}

TEST(MasterAuthTest, ACapturedCallCannotBeReplayedOrAltered) {
  auto server = StartMaster(kToken);
  ASSERT_NE(server, nullptr);
  auto stub = RawStub(*server);
  auto [session, key] = OpenSessionByHand(*stub, "c1");
  proto::MountSegmentsRequest mount;
  mount.set_client_id("c1");
  const std::string metadata = control_auth::EncodeMetadata(
      session, 7,
      control_auth::CallMac(key, "MountSegments", 7,
                            control_auth::BodyHash(SerializeForMac(mount))));
  auto call = [&](const proto::MountSegmentsRequest& request) {
    grpc::ClientContext context;
    context.AddMetadata(control_auth::kMetadataKey, metadata);
    proto::MountSegmentsReply reply;
    return stub->MountSegments(&context, request, &reply);
  };
  EXPECT_TRUE(call(mount).ok());
  EXPECT_EQ(call(mount).error_code(), grpc::StatusCode::UNAUTHENTICATED);  // replayed
  proto::MountSegmentsRequest altered = mount;
  altered.set_host_id("elsewhere");
  EXPECT_EQ(call(altered).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // The proof names its method: the same mac does not pass for another call.
  grpc::ClientContext context;
  context.AddMetadata(control_auth::kMetadataKey, metadata);
  proto::UnmountSegmentsRequest unmount;
  unmount.set_client_id("c1");
  proto::UnmountSegmentsReply unmounted;
  EXPECT_EQ(stub->UnmountSegments(&context, unmount, &unmounted).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(server->state().Stats().clients, 1u);
}

// A get's proof covers the bytes the client signed and sent (serialized once): a captured get is
// no more reusable than any other call.
TEST(MasterAuthTest, ACapturedGetCannotBeReplayedOrAltered) {
  auto server = StartMaster(kToken);
  ASSERT_NE(server, nullptr);
  auto stub = RawStub(*server);
  const auto opened = OpenSessionByHand(*stub, "c1");
  const uint64_t session = opened.first;
  const std::string key = opened.second;
  proto::BatchKeysRequest get;
  get.set_client_id("c1");
  get.add_keys("page/1");
  auto call = [&](const proto::BatchKeysRequest& request, uint64_t sequence,
                  const proto::BatchKeysRequest& signed_request) {
    grpc::ClientContext context;
    context.AddMetadata(
        control_auth::kMetadataKey,
        control_auth::EncodeMetadata(
            session, sequence,
            control_auth::CallMac(key, "BatchGetReplicas", sequence,
                                  control_auth::BodyHash(SerializeForMac(signed_request)))));
    proto::BatchGetReplicasReply reply;
    return stub->BatchGetReplicas(&context, request, &reply);
  };
  // No such key, but a call that passed its check: the reply says so per key.
  {
    // The client registers (a mount of no segments).
    proto::MountSegmentsRequest mount;
    mount.set_client_id("c1");
    grpc::ClientContext context;
    context.AddMetadata(control_auth::kMetadataKey,
                        control_auth::EncodeMetadata(
                            session, 1,
                            control_auth::CallMac(key, "MountSegments", 1,
                                                  control_auth::BodyHash(SerializeForMac(mount)))));
    proto::MountSegmentsReply reply;
    ASSERT_TRUE(stub->MountSegments(&context, mount, &reply).ok());
  }
  const grpc::Status first = call(get, 3, get);
  EXPECT_TRUE(first.ok()) << first.error_code() << " " << first.error_message();
  EXPECT_EQ(call(get, 3, get).error_code(), grpc::StatusCode::UNAUTHENTICATED);  // replayed
  proto::BatchKeysRequest altered = get;
  altered.set_keys(0, "page/2");
  EXPECT_EQ(call(altered, 4, get).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  proto::BatchKeysRequest other_client = get;
  other_client.set_client_id("c2");
  EXPECT_EQ(call(other_client, 5, other_client).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // Bytes that are no request at all are refused, and the master serves on.
  grpc::GenericStub generic(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  const std::string junk = "\xff\xff\xff\xff";
  grpc::Slice slice(junk);
  grpc::ByteBuffer request(&slice, 1), response;
  std::promise<grpc::Status> done;
  generic.UnaryCall(&context, "/larder.proto.Master/BatchGetReplicas", grpc::StubOptions(),
                    &request, &response, [&done](grpc::Status status) { done.set_value(status); });
  EXPECT_FALSE(done.get_future().get().ok());
  EXPECT_TRUE(call(get, 6, get).ok());
}

// The proof as current clients send it: appended to the request's bytes (ChallengeReply's
// proof_in_body), checked over exactly the bytes before it, before any of them is parsed.
TEST(MasterAuthTest, AProofAfterTheRequestCoversTheBytesBeforeIt) {
  auto server = StartMaster(kToken);
  ASSERT_NE(server, nullptr);
  auto stub = RawStub(*server);
  {
    grpc::ClientContext context;
    proto::ChallengeReply challenge;
    ASSERT_TRUE(stub->Challenge(&context, proto::ChallengeRequest(), &challenge).ok());
    EXPECT_TRUE(challenge.proof_in_body());
  }
  const auto [session, key] = OpenSessionByHand(*stub, "c1");
  grpc::GenericStub generic(
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  // Sends `bytes` as the request of `method`; the reply's bytes come back in `reply`.
  auto send = [&](const std::string& method, const std::string& bytes,
                  std::string* reply = nullptr) {
    grpc::ClientContext context;
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), response;
    std::promise<grpc::Status> done;
    generic.UnaryCall(&context, "/larder.proto.Master/" + method, grpc::StubOptions(), &request,
                      &response, [&done](grpc::Status status) { done.set_value(status); });
    grpc::Status status = done.get_future().get();
    if (status.ok() && reply != nullptr) {
      std::vector<grpc::Slice> slices;
      EXPECT_TRUE(response.Dump(&slices).ok());
      reply->clear();
      for (const grpc::Slice& piece : slices) {
        reply->append(reinterpret_cast<const char*>(piece.begin()), piece.size());
      }
    }
    return status;
  };
  // `request` followed by the proof of `signed_bytes` (by default, `request` itself).
  auto proven = [&, session = session, key = key](const std::string& method,
                                                  const std::string& request, uint64_t sequence,
                                                  const std::string* signed_bytes = nullptr) {
    std::string bytes = request;
    bytes.resize(request.size() + control_auth::kTrailerBytes);
    control_auth::EncodeTrailer(
        session, sequence,
        control_auth::CallMac(key, method, sequence,
                              control_auth::BodyHash(signed_bytes ? *signed_bytes : request)),
        reinterpret_cast<uint8_t*>(bytes.data() + request.size()));
    return bytes;
  };
  proto::MountSegmentsRequest mount;
  mount.set_client_id("c1");
  ASSERT_TRUE(send("MountSegments", proven("MountSegments", mount.SerializeAsString(), 1)).ok());
  proto::BatchKeysRequest get;
  get.set_client_id("c1");
  get.add_keys("page/1");
  const std::string get_bytes = get.SerializeAsString();
  const std::string first = proven("BatchGetReplicas", get_bytes, 2);
  std::string reply_bytes;
  const grpc::Status ok = send("BatchGetReplicas", first, &reply_bytes);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  proto::BatchGetReplicasReply reply;
  ASSERT_TRUE(reply.ParseFromString(reply_bytes));
  ASSERT_EQ(reply.errors_size(), 1);  // no such key, answered per key
  EXPECT_EQ(reply.errors(0).status().code(), static_cast<int>(StatusCode::kNotFound));
  // The same bytes again: a replay.
  EXPECT_EQ(send("BatchGetReplicas", first).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // Another key under the first call's proof.
  proto::BatchKeysRequest altered = get;
  altered.set_keys(0, "page/2");
  EXPECT_EQ(send("BatchGetReplicas",
                 proven("BatchGetReplicas", altered.SerializeAsString(), 3, &get_bytes))
                .error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // Bytes after the proof: it is no longer at the end, and the call has none.
  EXPECT_EQ(
      send("BatchGetReplicas", proven("BatchGetReplicas", get_bytes, 4) + get_bytes).error_code(),
      grpc::StatusCode::UNAUTHENTICATED);
  // A proof for another method.
  EXPECT_EQ(send("BatchRemove", proven("BatchGetReplicas", get_bytes, 5)).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // No proof at all.
  const grpc::Status bare = send("BatchGetReplicas", get_bytes);
  EXPECT_EQ(bare.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(bare.error_message().find("requires the cluster token"), std::string::npos);
  // A proven call for another client.
  proto::BatchKeysRequest other = get;
  other.set_client_id("c2");
  EXPECT_EQ(send("BatchGetReplicas", proven("BatchGetReplicas", other.SerializeAsString(), 6))
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // Proven bytes that are no request: refused as such, and the master serves on.
  const grpc::Status junk = send("BatchGetReplicas", proven("BatchGetReplicas", "\xff\xff", 7));
  EXPECT_EQ(junk.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << junk.error_message();
  EXPECT_TRUE(send("BatchGetReplicas", proven("BatchGetReplicas", get_bytes, 8)).ok());
  // The proof's field is one an older master skips: the request parses as it was.
  proto::BatchKeysRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(first));
  EXPECT_EQ(parsed.keys(0), "page/1");
  EXPECT_EQ(parsed.client_id(), "c1");
}

// A client of a master that does not offer the proof in the request's bytes (one of an older
// version) sends it in metadata.
TEST(MasterAuthTest, AClientSendsTheProofInMetadataToAMasterThatOffersNoOther) {
  AuthOptions auth;
  auth.cluster_token = kToken;
  auth.offer_proof_in_body = false;
  auto started = StartMaster(auth);
  ASSERT_NE(started, nullptr);
  MasterServer& server = *started;
  auto stub = RawStub(server);
  {
    grpc::ClientContext context;
    proto::ChallengeReply challenge;
    ASSERT_TRUE(stub->Challenge(&context, proto::ChallengeRequest(), &challenge).ok());
    EXPECT_FALSE(challenge.proof_in_body());
  }
  // Such a master takes no proof after the bytes: a call that carries one has none for it.
  const auto [session, key] = OpenSessionByHand(*stub, "hand");
  proto::StatsRequest stats;
  std::string bytes = stats.SerializeAsString();
  const size_t size = bytes.size();
  bytes.resize(size + control_auth::kTrailerBytes);
  control_auth::EncodeTrailer(
      session, 1,
      control_auth::CallMac(key, "GetStats", 1,
                            control_auth::BodyHash(std::string_view(bytes.data(), size))),
      reinterpret_cast<uint8_t*>(bytes.data() + size));
  grpc::GenericStub generic(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  std::promise<grpc::Status> done;
  generic.UnaryCall(&context, "/larder.proto.Master/GetStats", grpc::StubOptions(), &request,
                    &response, [&done](grpc::Status status) { done.set_value(status); });
  EXPECT_EQ(done.get_future().get().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // The client's calls pass.
  MasterClient client = Client(server, "c1", kToken);
  proto::StatsReply reply;
  Status got = client.Call("GetStats", &Stub::GetStats, stats, &reply);
  EXPECT_TRUE(got.ok()) << got;
  const Status mounted = Mount(client, "c1", "seg", 0x100000, 1 << 20,
                               Proto(OwnDescriptor("c1", "host", "seg", 1 << 20)));
  EXPECT_TRUE(mounted.ok()) << mounted;
  got = client.Call("GetStats", &Stub::GetStats, stats, &reply);
  EXPECT_TRUE(got.ok()) << got;
  EXPECT_EQ(reply.segments(), 1u);
}

TEST(MasterAuthTest, ATokenHoldingClientRefusesAMasterWithoutTheToken) {
  auto server = StartMaster("");
  ASSERT_NE(server, nullptr);
  MasterClient careful = Client(*server, "careful", kToken);
  proto::StatsRequest request;
  proto::StatsReply reply;
  Status status = careful.Call("GetStats", &Stub::GetStats, request, &reply);
  EXPECT_EQ(status.code(), StatusCode::kPermissionDenied) << status;
  EXPECT_NE(status.message().find("does not prove the cluster token"), std::string::npos);
}

TEST(MasterAuthTest, ASessionLostWithARestartIsOpenedAgain) {
  auto first = StartMaster(kToken);
  ASSERT_NE(first, nullptr);
  const uint16_t port = first->port();
  MasterClient client = Client(*first, "c1", kToken);
  proto::StatsRequest request;
  proto::StatsReply reply;
  ASSERT_TRUE(client.Call("GetStats", &Stub::GetStats, request, &reply).ok());
  first->Shutdown();
  first.reset();
  MasterServerOptions options;
  options.listen_host = "127.0.0.1";
  options.port = port;
  options.http_port = -1;
  options.auth.cluster_token = kToken;
  auto second = MasterServer::Start(options);
  ASSERT_TRUE(second.ok()) << second.status();
  // The first call on the new master meets an unknown session; the client opens a new one.
  Status status;
  for (int attempt = 0; attempt < 50; ++attempt) {
    status = client.Call("GetStats", &Stub::GetStats, request, &reply);
    if (status.code() != StatusCode::kUnavailable) break;  // reconnecting
  }
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(reply.master_incarnation(), (*second)->state().incarnation());
}

TEST(MasterAuthTest, WithoutATokenTheMasterServesLoopbackOnly) {
  MasterServerOptions options;
  options.port = 0;
  options.http_port = -1;
  auto local = MasterServer::Start(options);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ((*local)->listen_host(), "127.0.0.1");
  options.listen_host = "0.0.0.0";
  auto exposed = MasterServer::Start(options);
  ASSERT_FALSE(exposed.ok());
  EXPECT_EQ(exposed.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(exposed.status().message().find("--insecure"), std::string::npos);
  options.insecure = true;
  auto insecure = MasterServer::Start(options);
  ASSERT_TRUE(insecure.ok()) << insecure.status();
  options.insecure = false;
  options.listen_host = "";
  options.auth.cluster_token = kToken;
  auto secured = MasterServer::Start(options);
  ASSERT_TRUE(secured.ok()) << secured.status();
  EXPECT_EQ((*secured)->listen_host(), "0.0.0.0");
  options.auth.cluster_token = "";
  options.auth.admin_token = kAdminToken;
  EXPECT_EQ(MasterServer::Start(options).status().code(), StatusCode::kInvalidArgument);
}

TEST(MasterAuthTest, AdminHttpRoutesNeedTheAdminTokenAndMetricsNameNoKeys) {
  auto server = StartMaster(kToken, kAdminToken, /*http_port=*/0);
  ASSERT_NE(server, nullptr);
  MasterClient writer = Client(*server, "writer", kToken);
  MountAndPut(writer, "writer", "writer-seg", {"secret-prompt-key"});
  httplib::Client http("127.0.0.1", server->http_port());
  for (const char* path :
       {"/keys", "/segments", "/api/segments", "/api/clients", "/get_all_keys", "/get_all_segments",
        "/query_key?key=secret-prompt-key", "/batch_query_keys?keys=secret-prompt-key",
        "/query_segment?segment=writer-seg"}) {
    auto anonymous = http.Get(path);
    ASSERT_TRUE(anonymous);
    EXPECT_EQ(anonymous->status, 401) << path;
    EXPECT_EQ(anonymous->body.find("secret-prompt-key"), std::string::npos);
    auto wrong = http.Get(path, {{"Authorization", "Bearer nope"}});
    ASSERT_TRUE(wrong);
    EXPECT_EQ(wrong->status, 403) << path;
    auto cluster_token = http.Get(path, {{"Authorization", std::string("Bearer ") + kToken}});
    ASSERT_TRUE(cluster_token);
    EXPECT_EQ(cluster_token->status, 403) << path;  // the cluster token is not the admin's
    auto admin = http.Get(path, {{"Authorization", std::string("Bearer ") + kAdminToken}});
    ASSERT_TRUE(admin);
    EXPECT_EQ(admin->status, 200) << path;
  }
  for (const char* path : {"/keys", "/get_all_keys", "/batch_query_keys?keys=secret-prompt-key"}) {
    auto keys = http.Get(path, {{"Authorization", std::string("Bearer ") + kAdminToken}});
    ASSERT_TRUE(keys);
    EXPECT_NE(keys->body.find("secret-prompt-key"), std::string::npos) << path;
  }
  // Removal by prefix: the admin token, and a JSON body.
  const std::string body = R"({"prefix": "secret-"})";
  auto anonymous_remove = http.Post("/api/remove", body, "application/json");
  ASSERT_TRUE(anonymous_remove);
  EXPECT_EQ(anonymous_remove->status, 401);
  auto cluster_remove =
      http.Post("/api/remove", {{"Authorization", std::string("Bearer ") + kToken}}, body,
                "application/json");
  ASSERT_TRUE(cluster_remove);
  EXPECT_EQ(cluster_remove->status, 403);
  const httplib::Headers admin = {{"Authorization", std::string("Bearer ") + kAdminToken}};
  auto form =
      http.Post("/api/remove", admin, "prefix=secret-", "application/x-www-form-urlencoded");
  ASSERT_TRUE(form);
  EXPECT_EQ(form->status, 415);  // what a cross-site form could send
  for (const char* bad : {"[]", R"({"prefix": 1})", R"({"prefix": "a", "force": "yes"})", "{"}) {
    auto refused = http.Post("/api/remove", admin, bad, "application/json");
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->status, 400) << bad;
  }
  auto kept = http.Get("/keys", admin);
  ASSERT_TRUE(kept);
  EXPECT_NE(kept->body.find("secret-prompt-key"), std::string::npos);
  auto removed = http.Post("/api/remove", admin, body, "application/json");
  ASSERT_TRUE(removed);
  ASSERT_EQ(removed->status, 200) << removed->body;
  EXPECT_EQ(nlohmann::json::parse(removed->body)["removed"], 1);
  auto gone = http.Get("/keys", admin);
  ASSERT_TRUE(gone);
  EXPECT_EQ(gone->body.find("secret-prompt-key"), std::string::npos);
  // The drain routes: the admin token too, JSON bodies, and clear refusals.
  const std::string drain = R"({"segment": "no-such-segment"})";
  auto anonymous_drain = http.Post("/api/drain", drain, "application/json");
  ASSERT_TRUE(anonymous_drain);
  EXPECT_EQ(anonymous_drain->status, 401);
  auto cluster_drain = http.Post("/api/drain", {{"Authorization", std::string("Bearer ") + kToken}},
                                 drain, "application/json");
  ASSERT_TRUE(cluster_drain);
  EXPECT_EQ(cluster_drain->status, 403);
  auto drain_form =
      http.Post("/api/drain", admin, "segment=x", "application/x-www-form-urlencoded");
  ASSERT_TRUE(drain_form);
  EXPECT_EQ(drain_form->status, 415);
  auto unknown = http.Post("/api/drain", admin, drain, "application/json");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404) << unknown->body;
  for (const char* bad : {R"({"segment": 5})", R"({"segment": "s", "draining": "no"})", "{}"}) {
    auto refused = http.Post("/api/drain", admin, bad, "application/json");
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->status, 400) << bad;
  }
  auto both =
      http.Post("/api/remove", admin, R"({"prefix": "a", "segment": "b"})", "application/json");
  ASSERT_TRUE(both);
  EXPECT_EQ(both->status, 400);
  auto unknown_segment =
      http.Post("/api/remove", admin, R"({"segment": "no-such-segment"})", "application/json");
  ASSERT_TRUE(unknown_segment);
  EXPECT_EQ(unknown_segment->status, 404);
  auto anonymous_listing = http.Get("/api/segment_objects?segment=no-such-segment");
  ASSERT_TRUE(anonymous_listing);
  EXPECT_EQ(anonymous_listing->status, 401);
  auto unknown_listing = http.Get("/api/segment_objects?segment=no-such-segment", admin);
  ASSERT_TRUE(unknown_listing);
  EXPECT_EQ(unknown_listing->status, 404);
  for (const char* limit : {"0", "x", "2000000", "-1"}) {
    auto refused =
        http.Get(std::string("/api/segment_objects?segment=no-such-segment&limit=") + limit, admin);
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->status, 400) << limit;
  }
  for (const char* path : {"/", "/api/summary", "/api/history", "/health", "/metrics"}) {
    auto open = http.Get(path);
    ASSERT_TRUE(open);
    EXPECT_EQ(open->status, 200) << path;
    EXPECT_EQ(open->body.find("secret-prompt-key"), std::string::npos) << path;
  }
}

TEST(MasterAuthTest, GrpcOverTlsWithTheClusterCa) {
  const std::string dir = ::testing::TempDir() + "/larder-auth-tls";
  auto certs = larder::testing::WriteTestCertificates(dir);
  ASSERT_TRUE(certs.ok()) << certs.status();
  MasterServerOptions options;
  options.listen_host = "127.0.0.1";
  options.port = 0;
  options.http_port = -1;
  options.auth.cluster_token = kToken;
  options.tls_cert_file = certs->cert_file;
  options.tls_key_file = certs->key_file;
  auto server = MasterServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = "127.0.0.1:" + std::to_string((*server)->port());  // an IP SAN
  proto::StatsRequest request;
  proto::StatsReply reply;
  MasterClientOptions good;
  good.address = address;
  good.timeout = std::chrono::seconds(5);
  good.client_id = "tls-client";
  good.auth_token = kToken;
  good.tls_ca_file = certs->ca_file;
  Status status = MasterClient(good).Call("GetStats", &Stub::GetStats, request, &reply);
  EXPECT_TRUE(status.ok()) << status;
  MasterClientOptions other_ca = good;
  other_ca.client_id = "tls-client-2";
  other_ca.tls_ca_file = certs->other_ca_file;
  other_ca.timeout = std::chrono::seconds(2);
  status = MasterClient(other_ca).Call("GetStats", &Stub::GetStats, request, &reply);
  EXPECT_FALSE(status.ok());
  MasterClientOptions plaintext = good;
  plaintext.client_id = "tls-client-3";
  plaintext.tls_ca_file = "";
  plaintext.timeout = std::chrono::seconds(2);
  status = MasterClient(plaintext).Call("GetStats", &Stub::GetStats, request, &reply);
  EXPECT_FALSE(status.ok());
  MasterClientOptions missing_ca = good;
  missing_ca.tls_ca_file = dir + "/no-such-ca.pem";
  status = MasterClient(missing_ca).Call("GetStats", &Stub::GetStats, request, &reply);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status;
}

}  // namespace
}  // namespace larder::master
