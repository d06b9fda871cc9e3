// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Fuzzes segment descriptors as they arrive from peers and the master (JSON, with base64
// transport blobs), and the transports' readers of those blobs: the tcp endpoint, the shm socket,
// the device transport's handle and, where built, the ucx record. A descriptor that parses must
// survive ToJson / FromJson unchanged; no blob may crash a transport's CanReach. An input that is
// not a JSON object is a device memory handle, imported by an emulated device (host "fuzz-host"):
// no handle may crash it or map anything that is not the exporter's tagged memory.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "larder/transfer_engine.h"
#include "testing/fuzz_check.h"
#include "transfer/device/emulated_device.h"
#include "transfer/engine_internal.h"
#include "transfer/transport_registry.h"

using namespace larder;  // NOLINT: a fuzz target

namespace {

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
    for (const char* name : {"tcp", "shm", "device", "ucx"}) {
      const transfer::TransportFactory* f = transfer::TransportRegistry::Global().Find(name);
      if (f != nullptr) all->push_back(f->create({.named = true}));
    }
    return all;
  }();
  return *transports;
}

// An initialized emulated device of the host "fuzz-host" (the handles' host field is what the
// fuzzer controls), on device 0 of the fuzzing thread.
transfer::EmulatedDevice& Importer() {
  static auto* device = [] {
    auto* d = new transfer::EmulatedDevice({.host_id = "fuzz-host"});
    larder::test::FuzzCheck(d->SetCurrentDevice(0).ok() && d->Init().ok());
    return d;
  }();
  return *device;
}

void ImportHandle(std::string_view handle) {
  Result<transfer::ImportedAllocation> imported = Importer().ImportAllocation(handle);
  if (imported.ok()) larder::test::FuzzCheck(Importer().CloseImport(imported->base).ok());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view json(reinterpret_cast<const char*>(data), size);
  if (!json.starts_with('{')) {
    ImportHandle(json);
    return 0;
  }
  auto parsed = SegmentDescriptor::FromJson(json);
  if (!parsed.ok()) return 0;
  larder::test::FuzzCheck(parsed->transports.size() <= SegmentDescriptor::kMaxTransports);
  for (const auto& [name, blob] : parsed->transports) {
    larder::test::FuzzCheck(blob.size() <= SegmentDescriptor::kMaxBlobBytes);
  }
  auto again = SegmentDescriptor::FromJson(parsed->ToJson());
  larder::test::FuzzCheck(again.ok() && Same(*parsed, *again));
  for (auto& transport : Transports()) (void)transport->CanReach(*parsed);
  if (const std::string* handle = parsed->TransportBlob("device")) ImportHandle(*handle);
  return 0;
}
