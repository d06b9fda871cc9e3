// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/tcp/tcp_transport.h"

#include <map>
#include <vector>

#include "common/logging.h"
#include "common/memory.h"
#include "common/mutex.h"
#include "transfer/device/device_staging.h"
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

// Sends a read reply's header for `length` bytes of payload together with its first `n` bytes.
Status SendReadReply(FrameConnection& conn, uint64_t request_id, uint64_t length,
                     const uint8_t* first, uint64_t n) {
  FrameHeader reply;
  reply.type = FrameType::kReadReply;
  reply.request_id = request_id;
  reply.length = length;
  uint8_t out[wire::kFrameHeaderSize];
  EncodeHeader(reply, out);
  iovec iov[2] = {{out, sizeof(out)}, {const_cast<uint8_t*>(first), n}};
  return conn.stream().SendAllV(iov, 2, FrameDeadline());
}

// Reads `length` bytes arriving on `stream` into nothing, so that the connection stays usable.
bool SkipPayload(wire::TcpStream& stream, uint64_t length) {
  std::vector<uint8_t> sink(std::min<uint64_t>(length, 1 << 20));
  for (uint64_t left = length; left > 0;) {
    uint64_t n = std::min<uint64_t>(left, sink.size());
    if (!stream.RecvAll(sink.data(), n, FrameDeadline()).ok()) return false;
    left -= n;
  }
  return true;
}

// A read of a device segment: each chunk is copied device -> pinned host, then sent. The first
// copy runs before the reply's header, so a failed copy of a read of one chunk (every read this
// engine's own clients send) is a clean error; a later one closes the connection, which the
// reader sees as the read failing.
bool ServeDeviceRead(const SegmentExports& exports, DeviceStaging& staging, FrameConnection& conn,
                     const FrameHeader& h) {
  bool keep = true;
  Status access = exports.AccessDevice(h.segment_id, h.offset, h.length, [&](uint8_t* device) {
    Result<DeviceStaging::Buffer> buffer =
        staging.Acquire(DeviceStaging::Pool::kServe, FrameDeadline());
    if (!buffer.ok()) {
      keep = conn.SendError(h.request_id, buffer.status()).ok();
      return;
    }
    const uint64_t chunk = staging.chunk_bytes();
    uint64_t n = std::min(chunk, h.length);
    if (Status copied = staging.ToHost(buffer->data(), device, n); !copied.ok()) {
      keep = conn.SendError(h.request_id, copied).ok();
      return;
    }
    if (!SendReadReply(conn, h.request_id, h.length, buffer->data(), n).ok()) {
      keep = false;
      return;
    }
    for (uint64_t offset = n; offset < h.length; offset += n) {
      n = std::min(chunk, h.length - offset);
      Status copied = staging.ToHost(buffer->data(), device + offset, n);
      if (!copied.ok()) {
        Log().warn("read of device segment {} failed mid-reply ({}); closing the connection",
                   h.segment_id, copied.ToString());
        keep = false;
        return;
      }
      if (!conn.stream().SendAll(buffer->data(), n, FrameDeadline()).ok()) {
        keep = false;
        return;
      }
    }
  });
  if (!access.ok()) return conn.SendError(h.request_id, access).ok();
  return keep;
}

// A write into a device segment: each chunk is received into pinned host memory, then copied
// host -> device. A failed copy or an exhausted pool still takes the whole payload, then answers
// with the error.
bool ServeDeviceWrite(const SegmentExports& exports, DeviceStaging& staging, FrameConnection& conn,
                      const FrameHeader& h) {
  wire::TcpStream& stream = conn.stream();
  bool received = true;
  Status outcome;
  Status access = exports.AccessDevice(h.segment_id, h.offset, h.length, [&](uint8_t* device) {
    Result<DeviceStaging::Buffer> buffer =
        staging.Acquire(DeviceStaging::Pool::kServe, FrameDeadline());
    if (!buffer.ok()) {
      outcome = buffer.status();
      received = SkipPayload(stream, h.length);
      return;
    }
    const uint64_t chunk = staging.chunk_bytes();
    for (uint64_t offset = 0; offset < h.length;) {
      const uint64_t n = std::min(chunk, h.length - offset);
      if (!stream.RecvAll(buffer->data(), n, FrameDeadline()).ok()) {
        received = false;
        return;
      }
      if (outcome.ok()) outcome = staging.ToDevice(device + offset, buffer->data(), n);
      offset += n;
    }
  });
  if (!access.ok()) {
    if (!SkipPayload(stream, h.length)) return false;
    return conn.SendError(h.request_id, access).ok();
  }
  if (!received) return false;
  if (!outcome.ok()) return conn.SendError(h.request_id, outcome).ok();
  return conn.SendReply(FrameType::kWriteReply, h.request_id, {}).ok();
}

bool ServeRead(const SegmentExports& exports, DeviceStaging* staging, FrameConnection& conn,
               const FrameHeader& h) {
  if (h.length > wire::kMaxFramePayload) {
    return conn
        .SendError(h.request_id, InvalidArgumentError("read of " + std::to_string(h.length) +
                                                      " bytes exceeds the frame limit"))
        .ok();
  }
  if (staging != nullptr && exports.IsDevice(h.segment_id)) {
    return ServeDeviceRead(exports, *staging, conn, h);
  }
  Status send_status;
  Status access = exports.Access(h.segment_id, h.offset, h.length, [&](uint8_t* src) {
    send_status = SendReadReply(conn, h.request_id, h.length, src, h.length);
  });
  if (!access.ok()) return conn.SendError(h.request_id, access).ok();
  return send_status.ok();
}

bool ServeWrite(const SegmentExports& exports, DeviceStaging* staging, FrameConnection& conn,
                const FrameHeader& h) {
  wire::TcpStream& stream = conn.stream();
  if (h.length > wire::kMaxFramePayload) {
    conn.SendError(h.request_id, InvalidArgumentError("write of " + std::to_string(h.length) +
                                                      " bytes exceeds the frame limit"))
        .IgnoreError();
    return false;  // cannot skip a payload that large safely
  }
  if (staging != nullptr && exports.IsDevice(h.segment_id)) {
    return ServeDeviceWrite(exports, *staging, conn, h);
  }
  Status recv_status;
  Status access = exports.Access(h.segment_id, h.offset, h.length, [&](uint8_t* dst) {
    recv_status = stream.RecvAll(dst, h.length, FrameDeadline());
  });
  if (!access.ok()) {
    // Skip the payload so the connection stays usable, then report.
    if (!SkipPayload(stream, h.length)) return false;
    return conn.SendError(h.request_id, access).ok();
  }
  if (!recv_status.ok()) return false;
  return conn.SendReply(FrameType::kWriteReply, h.request_id, {}).ok();
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
    DeviceStaging* staging = context.device_staging;
    context.frame_server->Handle(FrameType::kRead,
                                 [exports, staging](FrameConnection& c, const FrameHeader& h) {
                                   return ServeRead(*exports, staging, c, h);
                                 });
    context.frame_server->Handle(FrameType::kWrite,
                                 [exports, staging](FrameConnection& c, const FrameHeader& h) {
                                   return ServeWrite(*exports, staging, c, h);
                                 });
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

  // The data server copies with the CPU: device memory is served through the engine's staging
  // (its device transport's pinned host buffers), and not at all by an engine without one.
  Result<std::string> Export(const SegmentDescriptor& descriptor, uint8_t* base) override {
    (void)base;
    if (descriptor.memory_kind == MemoryKind::kDevice && context_.device_staging == nullptr) {
      return std::string();
    }
    return context_.engine_address;
  }

  // Whatever the segment's memory: its owner stages device memory (a device segment carries a
  // tcp endpoint only when its owner can).
  bool CanReach(const SegmentDescriptor& d) const override { return EndpointOf(d).ok(); }

  Result<std::shared_ptr<RemoteSegment>> Open(const SegmentDescriptor& descriptor) override {
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
