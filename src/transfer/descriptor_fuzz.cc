// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Fuzzes segment descriptors as they arrive from peers and the master (JSON, with base64
// transport blobs), and the transports' readers of those blobs: the tcp endpoint, the shm socket
// and, where built, the ucx record. A descriptor that parses must survive ToJson / FromJson
// unchanged; no blob may crash a transport's CanReach.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "larder/transfer_engine.h"
#include "transfer/engine_internal.h"
#include "transfer/transport_registry.h"

using namespace larder;  // NOLINT: a fuzz target

namespace {

void Check(bool condition) {
  if (!condition) std::abort();
}

bool Same(const SegmentDescriptor& a, const SegmentDescriptor& b) {
  return a.segment_id == b.segment_id && a.name == b.name && a.epoch == b.epoch &&
         a.engine_id == b.engine_id && a.host_id == b.host_id && a.address == b.address &&
         a.size == b.size && a.memory_kind == b.memory_kind && a.page_size == b.page_size &&
         a.transports == b.transports;
}

// One of each transport, never started: CanReach reads only the descriptor and the transport's
// own identity, which is empty here.
std::vector<std::unique_ptr<transfer::Transport>>& Transports() {
  static auto* transports = [] {
    auto* all = new std::vector<std::unique_ptr<transfer::Transport>>();
    for (const char* name : {"tcp", "shm", "ucx"}) {
      const transfer::TransportFactory* f = transfer::TransportRegistry::Global().Find(name);
      if (f != nullptr) all->push_back(f->create({.named = true}));
    }
    return all;
  }();
  return *transports;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view json(reinterpret_cast<const char*>(data), size);
  auto parsed = SegmentDescriptor::FromJson(json);
  if (!parsed.ok()) return 0;
  Check(parsed->transports.size() <= SegmentDescriptor::kMaxTransports);
  for (const auto& [name, blob] : parsed->transports) {
    Check(blob.size() <= SegmentDescriptor::kMaxBlobBytes);
  }
  auto again = SegmentDescriptor::FromJson(parsed->ToJson());
  Check(again.ok() && Same(*parsed, *again));
  for (auto& transport : Transports()) (void)transport->CanReach(*parsed);
  return 0;
}
