// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/tcp/tcp_transport.h"

#include <map>
#include <vector>

#include "common/memory.h"
#include "common/mutex.h"
#include "transfer/segment_exports.h"
#include "transfer/tcp/tcp_client.h"
#include "transfer/transport_registry.h"
#include "transfer/wire/server.h"

namespace larder::transfer {
namespace {

using wire::FrameConnection;
using wire::FrameDeadline;
using wire::FrameHeader;
using wire::FrameType;

// The tcp blob of a segment is the "ip:port" of its owner's frame server.
constexpr size_t kMaxEndpointBytes = 256;

Result<HostPort> EndpointOf(const SegmentDescriptor& d) {
  const std::string* blob = d.TransportBlob("tcp");
  if (blob == nullptr || blob->empty()) {
    return FailedPreconditionError("segment '" + d.name + "' has no tcp endpoint");
  }
  if (blob->size() > kMaxEndpointBytes) {
    return InvalidArgumentError("segment '" + d.name + "' has an oversized tcp endpoint");
  }
  return ParseHostPort(*blob);
}

bool ServeRead(const SegmentExports& exports, FrameConnection& conn, const FrameHeader& h) {
  if (h.length > wire::kMaxFramePayload) {
    return conn
        .SendError(h.request_id, InvalidArgumentError("read of " + std::to_string(h.length) +
                                                      " bytes exceeds the frame limit"))
        .ok();
  }
  Status send_status;
  Status access = exports.Access(h.segment_id, h.offset, h.length, [&](uint8_t* src) {
    FrameHeader reply;
    reply.type = FrameType::kReadReply;
    reply.request_id = h.request_id;
    reply.length = h.length;
    uint8_t out[wire::kFrameHeaderSize];
    EncodeHeader(reply, out);
    iovec iov[2] = {{out, sizeof(out)}, {src, h.length}};
    send_status = conn.stream().SendAllV(iov, 2, FrameDeadline());
  });
  if (!access.ok()) return conn.SendError(h.request_id, access).ok();
  return send_status.ok();
}

bool ServeWrite(const SegmentExports& exports, FrameConnection& conn, const FrameHeader& h) {
  wire::TcpStream& stream = conn.stream();
  if (h.length > wire::kMaxFramePayload) {
    conn.SendError(h.request_id, InvalidArgumentError("write of " + std::to_string(h.length) +
                                                      " bytes exceeds the frame limit"))
        .IgnoreError();
    return false;  // cannot skip a payload that large safely
  }
  Status recv_status;
  Status access = exports.Access(h.segment_id, h.offset, h.length, [&](uint8_t* dst) {
    recv_status = stream.RecvAll(dst, h.length, FrameDeadline());
  });
  if (!access.ok()) {
    // Skip the payload so the connection stays usable, then report.
    std::vector<uint8_t> sink(std::min<uint64_t>(h.length, 1 << 20));
    for (uint64_t left = h.length; left > 0;) {
      uint64_t n = std::min<uint64_t>(left, sink.size());
      if (!stream.RecvAll(sink.data(), n, FrameDeadline()).ok()) return false;
      left -= n;
    }
    return conn.SendError(h.request_id, access).ok();
  }
  if (!recv_status.ok()) return false;
  FrameHeader reply;
  reply.type = FrameType::kWriteReply;
  reply.request_id = h.request_id;
  uint8_t out[wire::kFrameHeaderSize];
  EncodeHeader(reply, out);
  return stream.SendAll(out, sizeof(out), FrameDeadline()).ok();
}

// The connection pools to one peer engine: one per traffic class.
struct TcpPeers {
  std::shared_ptr<tcp::TcpPeer> latency;
  std::shared_ptr<tcp::TcpPeer> bulk;
};

class TcpSegment final : public RemoteSegment {
 public:
  TcpSegment(SegmentDescriptor descriptor, TcpPeers peers)
      : RemoteSegment(std::move(descriptor)), peers_(std::move(peers)) {}
  tcp::TcpPeer& peer(bool latency) { return latency ? *peers_.latency : *peers_.bulk; }

 private:
  TcpPeers peers_;
};

class TcpTransport final : public Transport {
 public:
  ~TcpTransport() override { Stop(); }

  std::string_view name() const override { return "tcp"; }
  TransportCaps caps() const override { return {.allocates_exportable_memory = true}; }

  // Serves reads and writes of our segments on the engine's frame server. InvalidArgument naming
  // the file when the TLS CA does not load.
  Status Start(const EngineContext& context) override {
    context_ = context;
    LARDER_ASSIGN_OR_RETURN(client_config_, tcp::TcpClientConfig::FromContext(context));
    const SegmentExports* exports = context.exports;
    context.frame_server->Handle(
        FrameType::kRead,
        [exports](FrameConnection& c, const FrameHeader& h) { return ServeRead(*exports, c, h); });
    context.frame_server->Handle(
        FrameType::kWrite,
        [exports](FrameConnection& c, const FrameHeader& h) { return ServeWrite(*exports, c, h); });
    return Status();
  }

  void Stop() override {
    std::map<std::string, TcpPeers> peers;
    {
      MutexLock lock(mu_);
      peers.swap(peers_);
    }
    for (auto& [name, pools] : peers) {
      pools.latency->Stop();
      pools.bulk->Stop();
    }
  }

  Result<std::shared_ptr<MemoryRegion>> Allocate(size_t size, HugePages huge_pages) override {
    return AllocateAnonymous(size, huge_pages);
  }

  // The data server copies with the CPU, so device memory is out of its reach.
  Result<std::string> Export(const SegmentDescriptor& descriptor, uint8_t* base) override {
    (void)base;
    if (descriptor.memory_kind == MemoryKind::kDevice) return std::string();
    return context_.engine_address;
  }

  bool CanReach(const SegmentDescriptor& d) const override {
    return d.memory_kind != MemoryKind::kDevice && EndpointOf(d).ok();
  }

  Result<std::shared_ptr<RemoteSegment>> Open(const SegmentDescriptor& descriptor) override {
    if (descriptor.memory_kind == MemoryKind::kDevice) {
      return FailedPreconditionError("segment '" + descriptor.name +
                                     "' is device memory, which tcp cannot reach");
    }
    LARDER_ASSIGN_OR_RETURN(HostPort address, EndpointOf(descriptor));
    // One pool per endpoint and owner: its connections reach only a server that proves to be
    // the engine the descriptor names.
    const std::string endpoint = address.ToString() + '/';
    std::string key = endpoint + descriptor.engine_id;
    MutexLock lock(mu_);
    TcpPeers& pools = peers_[key];
    if (!pools.latency) {
      for (bool latency : {true, false}) {
        (latency ? pools.latency : pools.bulk) =
            std::make_shared<tcp::TcpPeer>(address, descriptor.engine_id, client_config_,
                                           context_.options->tcp_connections_per_peer, latency);
      }
      // The pools of earlier engines at this endpoint (a restarted owner) go with the last
      // segment that still uses them.
      for (auto it = peers_.lower_bound(endpoint);
           it != peers_.end() && it->first.starts_with(endpoint);) {
        it = it->first == key ? std::next(it) : peers_.erase(it);
      }
    }
    return std::make_shared<TcpSegment>(descriptor, pools);
  }

  void Submit(RemoteSegment& segment, std::span<Slice* const> slices,
              SliceCallback* done) override {
    auto& tcp_segment = static_cast<TcpSegment&>(segment);
    if (slices.empty()) return;
    uint64_t id = segment.descriptor().segment_id;
    // A batch is of one class; slices of the other (none today) go to their own pool.
    size_t same = 0;
    while (same < slices.size() && slices[same]->latency == slices[0]->latency) ++same;
    if (same == slices.size())
      return tcp_segment.peer(slices[0]->latency).Enqueue(id, slices, done);
    std::vector<Slice*> latency, bulk;
    for (Slice* s : slices) (s->latency ? latency : bulk).push_back(s);
    tcp_segment.peer(true).Enqueue(id, latency, done);
    tcp_segment.peer(false).Enqueue(id, bulk, done);
  }

 private:
  EngineContext context_;
  std::shared_ptr<const tcp::TcpClientConfig> client_config_;  // set by Start
  Mutex mu_;
  std::map<std::string, TcpPeers> peers_ LARDER_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<Transport> CreateTcpTransport() { return std::make_unique<TcpTransport>(); }

LARDER_REGISTER_TRANSPORT(tcp, 30, true,
                          [](const TransportSelection&) { return CreateTcpTransport(); });

}  // namespace larder::transfer
