// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/bootstrap.h"

#include <nlohmann/json.hpp>

#include "transfer/segment_exports.h"
#include "transfer/wire/client.h"

namespace larder::transfer {

using namespace wire;  // NOLINT: the frame protocol is this file's vocabulary

void ServeDescriptors(FrameServer* server, const SegmentExports* exports) {
  server->Handle(FrameType::kDescribe, [exports](FrameConnection& conn, const FrameHeader& h) {
    if (h.length != 0) {
      conn.SendError(h.request_id, InvalidArgumentError("describe frame carries no payload"))
          .IgnoreError();
      return false;
    }
    nlohmann::json list = nlohmann::json::array();
    for (const auto& d : exports->List()) list.push_back(nlohmann::json::parse(d.ToJson()));
    return conn.SendReply(FrameType::kDescribeReply, h.request_id, list.dump()).ok();
  });
}

Result<std::vector<SegmentDescriptor>> FetchDescriptors(const HostPort& address,
                                                        const EngineContext& context,
                                                        Deadline deadline) {
  LARDER_ASSIGN_OR_RETURN(auto config, TcpClientConfig::FromContext(context));
  std::string peer = address.ToString();
  LARDER_ASSIGN_OR_RETURN(TcpStream stream, ConnectAndAuthenticate(address, *config, deadline));
  FrameHeader ask;
  ask.type = FrameType::kDescribe;
  LARDER_RETURN_IF_ERROR(SendFrame(stream, ask, nullptr, 0, deadline));
  FrameHeader reply;
  LARDER_RETURN_IF_ERROR(RecvHeader(stream, &reply, deadline));
  if (reply.type == FrameType::kError) return RecvErrorFrame(stream, reply, deadline);
  if (reply.type != FrameType::kDescribeReply || reply.length > kMaxControlPayload) {
    return DataLossError("bad describe reply from " + peer);
  }
  std::string body(reply.length, '\0');
  LARDER_RETURN_IF_ERROR(stream.RecvAll(body.data(), body.size(), deadline));
  auto list = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!list.is_array()) return DataLossError("describe reply from " + peer + " is not a list");
  std::vector<SegmentDescriptor> out;
  for (const auto& item : list) {
    auto d = SegmentDescriptor::FromJson(item.dump());
    if (!d.ok()) {
      return DataLossError("describe reply from " + peer + ": " + d.status().message());
    }
    out.push_back(std::move(d).value());
  }
  return out;
}

}  // namespace larder::transfer
