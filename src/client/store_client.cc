// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "larder/store_client.h"

#include <cstdio>

#include "client/store_client_impl.h"
#include "common/env.h"
#include "common/logging.h"
#include "common/memory.h"

namespace larder {
namespace client {
namespace {

// The wire's soft-pin actions are the API's (larder/soft_pin.h).
static_assert(static_cast<int>(SoftPinAction::kPreserve) == proto::SOFT_PIN_PRESERVE);
static_assert(static_cast<int>(SoftPinAction::kEnable) == proto::SOFT_PIN_ENABLE);
static_assert(static_cast<int>(SoftPinAction::kDisable) == proto::SOFT_PIN_DISABLE);
static_assert(static_cast<int>(kLastSoftPinAction) == proto::SoftPinAction_MAX);

// "23.0 GiB": memory sizes are rarely whole mebibytes.
std::string ApproxGiB(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f GiB", static_cast<double>(bytes) / (1ull << 30));
  return text;
}

}  // namespace

Status StoreClientImpl::Init() {
  if (const uint64_t memory = HostMemoryBytes();
      !options_.sparse_segment && memory > 0 && options_.global_segment_size > memory) {
    return InvalidArgumentError(
        "global segment of " + FormatByteSize(options_.global_segment_size) +
        " is larger than the memory this process can fill (" + ApproxGiB(memory) +
        ", the host's RAM or its cgroup's limit): the kernel would kill it once the store "
        "filled the segment. Give a smaller segment size, or set LARDER_SPARSE_SEGMENT=1 "
        "(StoreClientOptions::sparse_segment) if it will never be filled");
  }
  if (options_.global_segment_size > 0) {
    LARDER_ASSIGN_OR_RETURN(segment_memory_,
                            engine_->AllocateSegmentMemory(options_.global_segment_size));
    segment_name_ = options_.segment_name;
    if (segment_name_.empty()) {
      segment_name_ = engine_->address().empty() ? engine_->id() : engine_->address();
    }
    LARDER_ASSIGN_OR_RETURN(local_segment_,
                            engine_->RegisterSegment(segment_name_, segment_memory_));
    for (const SegmentDescriptor& descriptor : engine_->ListSegments()) {
      if (descriptor.segment_id == local_segment_) descriptor_ = descriptor;
    }
  }
  MasterMembershipOptions membership;
  membership.client_id = engine_->id();
  membership.host_id = engine_->host_id();
  membership.segment_memory = segment_memory_;
  membership.segment_name = segment_name_;
  membership.descriptor = descriptor_;
  membership.heartbeat_interval = options_.heartbeat_interval;
  membership.connect_timeout = options_.master_connect_timeout;
  membership.add_traffic = [this](proto::HeartbeatRequest* request) {
    AddTrafficReport(engine_->Stats(), request);
  };
  membership.on_mount = [this] {
    MutexLock lock(cache_mu_);
    cache_.clear();  // segment ids of an earlier incarnation mean nothing now
  };
  membership.on_segments_changed = [this] { return CloseGoneSegments(); };
  membership_ = std::make_unique<MasterMembership>(&master_, std::move(membership));
  LARDER_RETURN_IF_ERROR(membership_->Start());
  releases_.Start();
  LARDER_RETURN_IF_ERROR(StartDiskHolder());
  return Status::Ok();
}

}  // namespace client

Result<std::unique_ptr<StoreClient>> StoreClient::Create(const StoreClientOptions& options) {
  if (options.master_address.empty()) return InvalidArgumentError("master_address is empty");
  if (options.replica_num == 0) return InvalidArgumentError("replica_num must be at least 1");
  LARDER_RETURN_IF_ERROR(client::ValidateTenant(options.tenant_id));
  LARDER_ASSIGN_OR_RETURN(std::unique_ptr<TransferEngine> engine,
                          TransferEngine::Create(client::StoreEngineOptions(options)));
  auto client = std::make_unique<client::StoreClientImpl>(options, std::move(engine));
  LARDER_RETURN_IF_ERROR(client->Init());
  return std::unique_ptr<StoreClient>(std::move(client));
}

}  // namespace larder
