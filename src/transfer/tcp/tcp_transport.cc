// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/tcp/tcp_transport.h"

#include <map>
#include <mutex>

#include "common/memory.h"
#include "transfer/tcp/tcp_client.h"
#include "transfer/transport_registry.h"

namespace larder::transfer {
namespace {

class TcpSegment final : public RemoteSegment {
 public:
  TcpSegment(SegmentDescriptor descriptor, std::shared_ptr<tcp::TcpPeer> peer)
      : RemoteSegment(std::move(descriptor)), peer_(std::move(peer)) {}
  tcp::TcpPeer& peer() { return *peer_; }

 private:
  std::shared_ptr<tcp::TcpPeer> peer_;
};

class TcpTransport final : public Transport {
 public:
  ~TcpTransport() override { Stop(); }

  std::string_view name() const override { return "tcp"; }
  RouteKind route() const override { return RouteKind::kTcp; }
  TransportCaps caps() const override { return {.allocates_exportable_memory = true}; }

  // InvalidArgument naming the file when the TLS CA does not load.
  Status Start(const EngineContext& context) override {
    context_ = context;
    LARDER_ASSIGN_OR_RETURN(client_config_, tcp::TcpClientConfig::FromContext(context));
    return Status();
  }

  void Stop() override {
    std::map<std::string, std::shared_ptr<tcp::TcpPeer>> peers;
    {
      std::lock_guard lock(mu_);
      peers.swap(peers_);
    }
    for (auto& [name, peer] : peers) peer->Stop();
  }

  Result<std::shared_ptr<MemoryRegion>> Allocate(size_t size, HugePages huge_pages) override {
    return AllocateAnonymous(size, huge_pages);
  }

  // The data server copies with the CPU, so device memory is out of its reach.
  bool CanReach(const SegmentDescriptor& d) const override {
    return !d.tcp_endpoint.empty() && d.memory_kind != MemoryKind::kDevice;
  }

  Result<std::shared_ptr<RemoteSegment>> Open(const SegmentDescriptor& descriptor) override {
    if (!CanReach(descriptor)) {
      return FailedPreconditionError("segment '" + descriptor.name + "' has no tcp endpoint");
    }
    LARDER_ASSIGN_OR_RETURN(HostPort address, ParseHostPort(descriptor.tcp_endpoint));
    std::lock_guard lock(mu_);
    auto& peer = peers_[descriptor.tcp_endpoint];
    if (!peer) {
      peer = std::make_shared<tcp::TcpPeer>(address, client_config_,
                                            context_.options->tcp_connections_per_peer);
    }
    return std::make_shared<TcpSegment>(descriptor, peer);
  }

  void Submit(RemoteSegment& segment, std::span<Slice* const> slices,
              SliceCallback* done) override {
    auto& tcp_segment = static_cast<TcpSegment&>(segment);
    tcp_segment.peer().Enqueue(segment.descriptor().segment_id, slices, done);
  }

 private:
  EngineContext context_;
  std::shared_ptr<const tcp::TcpClientConfig> client_config_;  // set by Start
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<tcp::TcpPeer>> peers_;  // guarded by mu_
};

}  // namespace

std::unique_ptr<Transport> CreateTcpTransport() { return std::make_unique<TcpTransport>(); }

LARDER_REGISTER_TRANSPORT(tcp, RouteKind::kTcp, CreateTcpTransport);

}  // namespace larder::transfer
