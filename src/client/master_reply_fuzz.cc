// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Fuzzes the store client's decoding of the master's replies: a BatchGetReplicas reply and the
// ListSegments reply that names its segments (two length-prefixed protobuf messages), checked
// and turned into ObjectInfos for a batch of as many keys as the first byte says, the per-item
// statuses of a reply's error list, and the segment descriptors inside ListSegments; the first
// message is also read as a BatchPutStart reply, checked and read for that batch. A master, or
// whoever answers in its place, must not be able to crash a client.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "client/master_client.h"
#include "client/store_pieces.h"
#include "common/segment_descriptor_proto.h"
#include "master.pb.h"
#include "testing/fuzz_check.h"

using namespace larder;  // NOLINT: a fuzz target

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const size_t count = data[0];
  size_t first = static_cast<size_t>(data[1]) | static_cast<size_t>(data[2]) << 8;
  data += 3;
  size -= 3;
  if (first > size) first = size;
  // The first message read as a PutStart reply as well: checked, then read as the client does.
  proto::BatchPutStartReply put;
  if (put.ParseFromArray(data, static_cast<int>(first)) &&
      client::CheckPutStartReply(put, count).ok()) {
    for (size_t i = 0; i < count; ++i) {
      const proto::PutStartResult& result = put.results(static_cast<int>(i));
      (void)client::FromItemStatus(result.status());
      for (const proto::Replica& replica : result.replicas()) (void)replica.offset();
    }
  }
  proto::BatchGetReplicasReply replicas;
  proto::ListSegmentsReply segments;
  if (!replicas.ParseFromArray(data, static_cast<int>(first))) return 0;
  if (!segments.ParseFromArray(data + first, static_cast<int>(size - first))) return 0;

  std::vector<Status> statuses = client::ItemStatuses(count, replicas.errors());
  larder::test::FuzzCheck(statuses.size() == count);
  for (const proto::SegmentInfo& info : segments.segments()) {
    (void)FromProto(info.segment_descriptor());
  }
  if (!client::CheckReplicaColumns(replicas, count).ok()) return 0;
  std::vector<Result<ObjectInfo>> infos = client::ObjectInfos(replicas, segments);
  larder::test::FuzzCheck(infos.size() == count);
  return 0;
}
