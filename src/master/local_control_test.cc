// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The master's local control socket (common/local_control.h): the clients on its host call
// there, with the same proofs and replies as over gRPC, and hostile frames there leave the
// master serving.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <optional>
#include <string>

#include "common/control_auth.h"
#include "common/env.h"
#include "common/local_control.h"
#include "common/net.h"
#include "master/rpc_test_support.h"

namespace larder::master {
namespace {

using rpc_test::Client;
using rpc_test::Keys;
using rpc_test::MountAndPut;
using rpc_test::RawStub;
using rpc_test::StartMaster;
using rpc_test::Stub;
using rpc_test::TestOptions;

constexpr char kToken[] = "local-socket-test-token";

AuthOptions WithToken() {
  AuthOptions auth;
  auth.cluster_token = kToken;
  return auth;
}

proto::ChallengeReply Challenge(const MasterServer& server) {
  proto::ChallengeReply reply;
  grpc::ClientContext context;
  grpc::Status status = RawStub(server)->Challenge(&context, proto::ChallengeRequest(), &reply);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return reply;
}

int MethodIndex(const char* name) {
  return proto::ChallengeRequest::descriptor()
      ->file()
      ->FindServiceByName("Master")
      ->FindMethodByName(name)
      ->index();
}

// A raw connection to the master's local socket: what any process on the host can send.
class RawLocal {
 public:
  explicit RawLocal(const std::string& name) {
    auto connected = UnixConnectAbstract(name, Deadline::max());
    EXPECT_TRUE(connected.ok()) << connected.status();
    if (connected.ok()) fd_ = std::move(connected).value();
    local_control::SetTimeouts(fd_.get(), std::chrono::seconds(10));
  }

  bool Send(uint32_t length, uint16_t method, uint8_t version, uint8_t flags,
            std::string_view bytes) {
    local_control::RequestHead head{length, method, version, flags};
    iovec pieces[2] = {{&head, sizeof(head)}, {const_cast<char*>(bytes.data()), bytes.size()}};
    return local_control::WriteAll(fd_.get(), pieces);
  }
  bool Send(int method, std::string_view bytes, uint8_t flags = 0) {
    return Send(static_cast<uint32_t>(bytes.size()), static_cast<uint16_t>(method),
                local_control::kVersion, flags, bytes);
  }

  // The reply's status (its body in *body), or nullopt when the master closed the connection.
  std::optional<grpc::Status> Receive(std::string* body = nullptr) {
    local_control::ReplyHead head;
    if (!local_control::ReadAll(fd_.get(), &head, sizeof(head))) return std::nullopt;
    std::string message, details, bytes;
    if (!local_control::ReadBody(fd_.get(), head.message_length, &message) ||
        !local_control::ReadBody(fd_.get(), head.details_length, &details) ||
        !local_control::ReadBody(fd_.get(), head.body_length, &bytes)) {
      return std::nullopt;
    }
    if (body != nullptr) *body = bytes;
    return grpc::Status(static_cast<grpc::StatusCode>(head.code), message, details);
  }

  // True once the master has closed the connection.
  bool Closed() {
    char byte;
    return recv(fd_.get(), &byte, 1, 0) == 0;
  }

 private:
  Fd fd_;
};

TEST(LocalControlTest, AClientOnTheMastersHostCallsThereWithItsProofs) {
  auto server = StartMaster(WithToken());
  ASSERT_NE(server, nullptr);
  proto::ChallengeReply challenge = Challenge(*server);
  ASSERT_FALSE(challenge.local_socket().empty());
  EXPECT_EQ(challenge.host_id(), DefaultHostId());

  auto client = Client(*server, "local-client", kToken);
  MountAndPut(client, "local-client", "local-seg", Keys("page/", 64));
  proto::BatchKeysRequest request;
  proto::BatchGetReplicasReply reply;
  request.set_client_id("local-client");
  for (const std::string& key : Keys("page/", 64)) request.add_keys(key);
  Status got = client.Call("BatchGetReplicas", &Stub::BatchGetReplicas, request, &reply);
  ASSERT_TRUE(got.ok()) << got;
  EXPECT_EQ(reply.size_size(), 64);
  EXPECT_EQ(reply.errors_size(), 0);
  // Mount, put start and end, and the get: all on the local socket.
  EXPECT_GE(server->local_control_calls(), 4u);

  // The same checks as over gRPC: a session acts for its own client only.
  auto other = Client(*server, "other-client", kToken);
  request.set_client_id("local-client");
  const uint64_t before = server->local_control_calls();
  Status denied = other.Call("BatchGetReplicas", &Stub::BatchGetReplicas, request, &reply);
  EXPECT_EQ(denied.code(), StatusCode::kPermissionDenied) << denied;
  EXPECT_GT(server->local_control_calls(), before);
}

TEST(LocalControlTest, AConnectionActsForTheSessionItsFirstProofBoundItTo) {
  auto server = StartMaster(WithToken());
  ASSERT_NE(server, nullptr);
  auto client = Client(*server, "bound-client", kToken);
  // The first call on the connection proves the session and binds the connection to it; the
  // calls after it carry no proof.
  MountAndPut(client, "bound-client", "bound-seg", Keys("page/", 8));
  // A bound connection still acts for its session's client only.
  proto::BatchKeysRequest remove;
  proto::BatchStatusReply removed;
  remove.set_client_id("another-client");
  remove.add_keys("page/1");
  Status denied = client.Call("BatchRemove", &Stub::BatchRemove, remove, &removed);
  EXPECT_EQ(denied.code(), StatusCode::kPermissionDenied) << denied;
  // The client leaves, which closes its session: the bound connection acts for nobody, and the
  // client's next call opens a new session and binds the connection to that one.
  proto::UnmountSegmentsRequest leave;
  proto::UnmountSegmentsReply left;
  leave.set_client_id("bound-client");
  leave.add_segment_id(server->state().ListSegments({})[0].segment_id);
  leave.set_unregister_client(true);
  ASSERT_TRUE(client.Call("UnmountSegments", &Stub::UnmountSegments, leave, &left).ok());
  const uint64_t before = server->local_control_calls();
  MountAndPut(client, "bound-client", "bound-seg-2", Keys("again/", 8));
  EXPECT_GE(server->local_control_calls(), before + 3);
}

TEST(LocalControlTest, AMasterWithoutItServesItsClientsOverGrpc) {
  MasterServerOptions options = TestOptions(WithToken());
  options.local_control_socket = false;
  auto server = StartMaster(options);
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(Challenge(*server).local_socket().empty());
  auto client = Client(*server, "grpc-client", kToken);
  MountAndPut(client, "grpc-client", "grpc-seg", Keys("page/", 8));
  EXPECT_EQ(server->local_control_calls(), 0u);
}

TEST(LocalControlTest, AMasterThatTakesNoProofAfterTheBytesNamesNoSocket) {
  // The socket takes proofs after the request's bytes only (as an older master, this one
  // takes them in metadata): its clients stay on gRPC.
  AuthOptions auth = WithToken();
  auth.offer_proof_in_body = false;
  auto server = StartMaster(auth);
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(Challenge(*server).local_socket().empty());
}

TEST(LocalControlTest, HostileFramesThereLeaveTheMasterServing) {
  auto server = StartMaster(WithToken());
  ASSERT_NE(server, nullptr);
  const std::string name = Challenge(*server).local_socket();
  ASSERT_FALSE(name.empty());
  const int get = MethodIndex("BatchGetReplicas");

  {
    // No proof: refused as over gRPC, and the connection serves on.
    RawLocal raw(name);
    proto::StatsRequest stats;
    ASSERT_TRUE(raw.Send(MethodIndex("GetStats"), stats.SerializeAsString()));
    auto status = raw.Receive();
    ASSERT_TRUE(status.has_value());
    EXPECT_EQ(status->error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_NE(status->error_message().find("LARDER_AUTH_TOKEN"), std::string::npos)
        << status->error_message();
    // A forged proof after the bytes.
    std::string forged = stats.SerializeAsString();
    forged.resize(forged.size() + control_auth::kTrailerBytes);
    control_auth::EncodeTrailer(
        1, 1, control_auth::Digest{},
        reinterpret_cast<uint8_t*>(forged.data()) + forged.size() - control_auth::kTrailerBytes);
    ASSERT_TRUE(raw.Send(get, forged, local_control::kProofAfterBytes));
    status = raw.Receive();
    ASSERT_TRUE(status.has_value());
    EXPECT_EQ(status->error_code(), grpc::StatusCode::UNAUTHENTICATED);
    // Flagged with a proof after the bytes, and none there.
    ASSERT_TRUE(raw.Send(get, stats.SerializeAsString(), local_control::kProofAfterBytes));
    status = raw.Receive();
    ASSERT_TRUE(status.has_value());
    EXPECT_EQ(status->error_code(), grpc::StatusCode::UNAUTHENTICATED);
    // And the refused proofs bound nothing: a call without one is still refused.
    ASSERT_TRUE(raw.Send(MethodIndex("GetStats"), stats.SerializeAsString()));
    status = raw.Receive();
    ASSERT_TRUE(status.has_value());
    EXPECT_EQ(status->error_code(), grpc::StatusCode::UNAUTHENTICATED);
    // No such method, and the calls that open a session (over gRPC only).
    for (int method : {999, MethodIndex("Challenge"), MethodIndex("OpenSession")}) {
      ASSERT_TRUE(raw.Send(method, ""));
      status = raw.Receive();
      ASSERT_TRUE(status.has_value());
      EXPECT_EQ(status->error_code(), grpc::StatusCode::UNIMPLEMENTED) << method;
    }
  }
  {
    // Another version of the frames: closed.
    RawLocal raw(name);
    ASSERT_TRUE(raw.Send(0, static_cast<uint16_t>(get), local_control::kVersion + 1, 0, ""));
    EXPECT_TRUE(raw.Closed());
  }
  {
    // A flag no version has: closed.
    RawLocal raw(name);
    ASSERT_TRUE(raw.Send(0, static_cast<uint16_t>(get), local_control::kVersion, 0x80, ""));
    EXPECT_TRUE(raw.Closed());
  }
  {
    // A length over the limit: closed, with nothing allocated for it.
    RawLocal raw(name);
    ASSERT_TRUE(raw.Send(local_control::kMaxBodyBytes + 1, static_cast<uint16_t>(get),
                         local_control::kVersion, 0, ""));
    EXPECT_TRUE(raw.Closed());
  }
  {
    // A frame cut short: the master waits for the rest, and lets go when the peer leaves.
    RawLocal raw(name);
    ASSERT_TRUE(raw.Send(1000, static_cast<uint16_t>(get), local_control::kVersion, 0, "short"));
  }

  // Every client is served still, over the socket.
  auto client = Client(*server, "after-hostile", kToken);
  MountAndPut(client, "after-hostile", "after-seg", Keys("page/", 8));
  EXPECT_GE(server->local_control_calls(), 3u);
}

TEST(LocalControlTest, BytesThatAreNoRequestGetInvalidArgument) {
  // Without a token (loopback) the bytes are parsed at once.
  auto server = StartMaster(AuthOptions{});
  ASSERT_NE(server, nullptr);
  RawLocal raw(Challenge(*server).local_socket());
  ASSERT_TRUE(raw.Send(MethodIndex("BatchGetReplicas"), std::string("\xff\xff\xff\xff", 4)));
  auto status = raw.Receive();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  proto::StatsRequest stats;
  std::string body;
  ASSERT_TRUE(raw.Send(MethodIndex("GetStats"), stats.SerializeAsString()));
  status = raw.Receive(&body);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->ok()) << status->error_message();
  proto::StatsReply reply;
  EXPECT_TRUE(reply.ParseFromString(body));
}

TEST(LocalControlTest, AClientFollowsARestartedMasterToItsNewSocket) {
  auto server = StartMaster(WithToken());
  ASSERT_NE(server, nullptr);
  const uint16_t port = server->port();
  auto client = Client(*server, "restart-client", kToken);
  MountAndPut(client, "restart-client", "seg-1", Keys("a/", 4));
  const std::string first = Challenge(*server).local_socket();
  server.reset();

  MasterServerOptions options = TestOptions(WithToken());
  options.port = port;
  server = StartMaster(options);
  ASSERT_NE(server, nullptr);
  ASSERT_NE(Challenge(*server).local_socket(), first);
  // The first call finds the old socket gone, and goes over gRPC (where the session is opened
  // again); the calls after it use the new master's socket.
  MountAndPut(client, "restart-client", "seg-2", Keys("b/", 4));
  proto::StatsRequest request;
  proto::StatsReply reply;
  const uint64_t before = server->local_control_calls();
  ASSERT_TRUE(client.Call("GetStats", &Stub::GetStats, request, &reply).ok());
  EXPECT_EQ(server->local_control_calls(), before + 1);
}

}  // namespace
}  // namespace larder::master
