// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/testing/fault_transport.h"

#include <vector>

namespace larder::transfer {

FaultTransport::FaultTransport(std::unique_ptr<Transport> inner, FaultPlan plan)
    : inner_(std::move(inner)), plan_(std::move(plan)) {}

TransportCaps FaultTransport::caps() const {
  TransportCaps caps = inner_->caps();
  caps.needs_local_registration |= plan_.needs_local_registration;
  return caps;
}

Result<std::shared_ptr<RemoteSegment>> FaultTransport::Open(const SegmentDescriptor& descriptor) {
  if (!plan_.open_error.ok()) return plan_.open_error;
  return inner_->Open(descriptor);
}

void FaultTransport::Submit(RemoteSegment& segment, std::span<Slice* const> slices,
                            SliceCallback* done) {
  std::vector<Slice*> pass;
  for (Slice* s : slices) {
    uint64_t ordinal = seen_.fetch_add(1) + 1;
    bool fail = ordinal <= plan_.fail_first_slices ||
                (plan_.fail_every_nth_slice != 0 && ordinal % plan_.fail_every_nth_slice == 0);
    if (fail) {
      failed_.fetch_add(1);
      done->OnSliceDone(s, plan_.slice_error);
    } else {
      pass.push_back(s);
    }
  }
  forwarded_.fetch_add(pass.size());
  if (!pass.empty()) inner_->Submit(segment, pass, done);
}

}  // namespace larder::transfer
