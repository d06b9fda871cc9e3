// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// What the master's gRPC tests (auth_test.cc, edge_test.cc) share: a MasterServer in this
// process, MasterClients and raw stubs of it, and mounts and puts made by hand.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "client/master_client.h"
#include "master.grpc.pb.h"
#include "master/master_server.h"
#include "master/own_descriptor.h"

namespace larder::master::rpc_test {

using client::MasterClient;
using client::MasterClientOptions;
using Stub = proto::Master::Stub;

// A master of `options`, on loopback.
inline std::unique_ptr<MasterServer> StartMaster(MasterServerOptions options) {
  options.listen_host = "127.0.0.1";
  auto server = MasterServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(server).value() : nullptr;
}

// A free port, no HTTP listener (unless `http_port`), and `auth`.
inline MasterServerOptions TestOptions(AuthOptions auth, int http_port = -1) {
  MasterServerOptions options;
  options.port = 0;
  options.http_port = http_port;
  options.auth = std::move(auth);
  return options;
}

inline std::unique_ptr<MasterServer> StartMaster(AuthOptions auth, int http_port = -1) {
  return StartMaster(TestOptions(std::move(auth), http_port));
}

inline std::unique_ptr<MasterServer> StartMaster(std::string token, std::string admin = "",
                                                 int http_port = -1) {
  AuthOptions auth;
  auth.cluster_token = std::move(token);
  auth.admin_token = std::move(admin);
  return StartMaster(std::move(auth), http_port);
}

inline MasterClient Client(const MasterServer& server, std::string client_id, std::string token,
                           std::string admin = "") {
  MasterClientOptions options;
  options.address = server.address();
  options.timeout = std::chrono::seconds(10);
  options.client_id = std::move(client_id);
  options.auth_token = std::move(token);
  options.admin_token = std::move(admin);
  return MasterClient(options);
}

// A raw stub: what an attacker's own gRPC client sends, with no help from MasterClient.
inline std::unique_ptr<Stub> RawStub(const MasterServer& server) {
  return proto::Master::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
}

inline proto::SegmentDescriptor Proto(const SegmentDescriptor& descriptor) {
  proto::SegmentDescriptor out;
  ToProto(descriptor, &out);
  return out;
}

// Mounts segment `name` of `size` bytes at `base` for `client` on "host" with `descriptor`: the
// call's error, else the segment's own status.
inline Status Mount(const MasterClient& rpc, const std::string& client, const std::string& name,
                    uint64_t base, uint64_t size, const proto::SegmentDescriptor& descriptor) {
  proto::MountSegmentsRequest request;
  proto::MountSegmentsReply reply;
  request.set_client_id(client);
  request.set_host_id("host");
  proto::SegmentInfo* info = request.add_segments();
  info->set_name(name);
  info->set_base(base);
  info->set_size(size);
  *info->mutable_segment_descriptor() = descriptor;
  Status status = rpc.Call("MountSegments", &Stub::MountSegments, request, &reply);
  if (!status.ok()) return status;
  EXPECT_EQ(reply.status_size(), 1);
  if (reply.status_size() != 1) return InternalError("no status for the segment");
  return Status(static_cast<StatusCode>(reply.status(0).code()), reply.status(0).message());
}

// Mounts a segment of 64 MiB for `client` and stores `keys` in it (4 KiB each).
inline void MountAndPut(const MasterClient& rpc, const std::string& client,
                        const std::string& segment, const std::vector<std::string>& keys) {
  Status mounted = Mount(rpc, client, segment, 0x100000, 64 << 20,
                         Proto(OwnDescriptor(client, "host", segment, 64 << 20)));
  ASSERT_TRUE(mounted.ok()) << mounted;
  proto::BatchPutStartRequest start;
  proto::BatchPutStartReply started;
  start.set_client_id(client);
  proto::BatchKeysRequest end;
  proto::BatchStatusReply ended;
  end.set_client_id(client);
  for (const std::string& key : keys) {
    proto::PutItem* item = start.add_items();
    item->set_key(key);
    item->set_size(4096);
    end.add_keys(key);
  }
  ASSERT_TRUE(rpc.Call("BatchPutStart", &Stub::BatchPutStart, start, &started).ok());
  ASSERT_TRUE(rpc.Call("BatchPutEnd", &Stub::BatchPutEnd, end, &ended).ok());
  ASSERT_EQ(ended.errors_size(), 0);
}

inline std::vector<std::string> Keys(const std::string& prefix, int n) {
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) keys.push_back(prefix + std::to_string(i));
  return keys;
}

}  // namespace larder::master::rpc_test
