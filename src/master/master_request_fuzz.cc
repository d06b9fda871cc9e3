// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Fuzzes the master's request handling: each input is a sequence of calls, every call one byte
// choosing the method, two bytes of length and that many bytes of its request message (parsed
// as protobuf, so malformed fields reach the handlers the way a hostile client's would). The calls
// run in order through the gRPC service (service.cc) against a fresh MasterState with a fake
// clock, so a sequence such as mount, put, get, unmount exercises the state machine and every
// input replays the same way (maintenance runs only when the input says so).
#include <grpcpp/server_context.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "master.grpc.pb.h"
#include "master/master_state.h"
#include "master/service.h"
#include "master/sessions.h"

using namespace larder;  // NOLINT: a fuzz target

namespace {

constexpr size_t kMaxCalls = 16;

template <typename Request, typename Reply, typename Method>
void Call(proto::Master::Service& service, Method method, const uint8_t* bytes, size_t size) {
  Request request;
  if (!request.ParseFromArray(bytes, static_cast<int>(size))) return;
  Reply reply;
  grpc::ServerContext context;
  (void)(service.*method)(&context, &request, &reply);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Every input starts at the same instant; the calls move the clock on.
  static const master::Clock::time_point start = master::Clock::now();
  static master::Clock::time_point now;
  now = start;
  master::MasterOptions options;
  options.shards = 4;
  options.clock = [] { return now; };
  master::MasterState state(options);
  master::SessionTable sessions(master::AuthOptions{});
  auto service = master::NewMasterHandlers(&state, &sessions);
  using S = proto::Master::Service;
  size_t calls = 0;
  while (size >= 3 && calls++ < kMaxCalls) {
    const uint8_t method = data[0];
    size_t length = static_cast<size_t>(data[1]) | static_cast<size_t>(data[2]) << 8;
    data += 3;
    size -= 3;
    if (length > size) length = size;
    const uint8_t* body = data;
    data += length;
    size -= length;
    switch (method % 16) {
      case 0:
        Call<proto::MountSegmentsRequest, proto::MountSegmentsReply>(*service, &S::MountSegments,
                                                                     body, length);
        break;
      case 1:
        Call<proto::UnmountSegmentsRequest, proto::UnmountSegmentsReply>(
            *service, &S::UnmountSegments, body, length);
        break;
      case 2:
        Call<proto::HeartbeatRequest, proto::HeartbeatReply>(*service, &S::Heartbeat, body, length);
        break;
      case 3:
        Call<proto::SyncCatalogRequest, proto::SyncCatalogReply>(*service, &S::SyncCatalog, body,
                                                                 length);
        break;
      case 4:
        Call<proto::BatchPutStartRequest, proto::BatchPutStartReply>(*service, &S::BatchPutStart,
                                                                     body, length);
        break;
      case 5:
        Call<proto::BatchKeysRequest, proto::BatchStatusReply>(*service, &S::BatchPutEnd, body,
                                                               length);
        break;
      case 6:
        Call<proto::BatchKeysRequest, proto::BatchStatusReply>(*service, &S::BatchPutRevoke, body,
                                                               length);
        break;
      case 7:
        Call<proto::BatchKeysRequest, proto::BatchGetReplicasReply>(*service, &S::BatchGetReplicas,
                                                                    body, length);
        break;
      case 8:
        Call<proto::ReleaseLeasesRequest, proto::ReleaseLeasesReply>(*service, &S::ReleaseLeases,
                                                                     body, length);
        break;
      case 9:
        Call<proto::BatchKeysRequest, proto::BatchExistReply>(*service, &S::BatchExist, body,
                                                              length);
        break;
      case 10:
        Call<proto::BatchKeysRequest, proto::BatchStatusReply>(*service, &S::BatchRemove, body,
                                                               length);
        break;
      case 11:
        Call<proto::RemoveAllRequest, proto::RemoveAllReply>(*service, &S::RemoveAll, body, length);
        break;
      case 12:
        Call<proto::RemoveByRegexRequest, proto::RemoveAllReply>(*service, &S::RemoveByRegex, body,
                                                                 length);
        break;
      case 13:
        Call<proto::ListSegmentsRequest, proto::ListSegmentsReply>(*service, &S::ListSegments, body,
                                                                   length);
        break;
      case 14:
        Call<proto::StatsRequest, proto::StatsReply>(*service, &S::GetStats, body, length);
        break;
      default:
        // Time passes: leases, puts and clients may expire at the next sweep.
        now += std::chrono::milliseconds(100 * (length + 1));
        state.RunMaintenance();
        break;
    }
  }
  return 0;
}
