// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Which device backend the registry's "device" transport runs over (LARDER_DEVICE_BACKEND).
#include <thread>

#include "common/env.h"
#include "common/logging.h"
#include "transfer/device/device_transport.h"
#include "transfer/device/emulated_device.h"

namespace larder::transfer {
namespace {

// Stands for a backend that cannot be had: every call fails with the reason.
class UnavailableDevice final : public DeviceBackend {
 public:
  explicit UnavailableDevice(std::string why) : why_(std::move(why)) {}
  std::string_view name() const override { return "unavailable"; }
  uint64_t registration_granularity() const override { return 2ULL << 20; }
  bool reads_unregistered_host_memory() const override { return false; }
  Status SetCurrentDevice(int) override { return Refused(); }
  Result<int> CurrentDevice() const override { return Refused(); }
  Status Init() override { return Refused(); }
  Result<void*> Allocate(uint64_t) override { return Refused(); }
  Status Free(void*) override { return Refused(); }
  bool IsDeviceMemory(const void*, uint64_t) const override { return false; }
  Status Register(uint64_t, uint64_t) override { return Refused(); }
  Status Deregister(uint64_t) override { return Refused(); }
  Result<uint64_t> SubmitCopy(void*, const void*, uint64_t) override { return Refused(); }
  Result<bool> QueryCopy(uint64_t) override { return Refused(); }
  Result<void*> AllocateHost(uint64_t) override { return Refused(); }
  Status FreeHost(void*) override { return Refused(); }
  Result<std::string> ExportAllocation(void*) override { return Refused(); }
  Result<ImportedAllocation> ImportAllocation(std::string_view) override { return Refused(); }
  Status CloseImport(void*) override { return Refused(); }

 private:
  Status Refused() const { return FailedPreconditionError(why_); }
  const std::string why_;
};

std::shared_ptr<DeviceBackend> Emulated() {
  EmulatedDeviceOptions options;
  if (std::string peers = GetEnv("LARDER_EMULATED_DEVICE_PEERS"); !peers.empty()) {
    Result<std::vector<int>> groups = ParsePeerGroups(peers, options.device_count);
    if (groups.ok()) {
      options.peer_groups = std::move(groups).value();
    } else {
      // Fail closed: no device reaches another's memory.
      Log().error("LARDER_EMULATED_DEVICE_PEERS: {}; no emulated device has peer access",
                  groups.status().ToString());
      options.peer_groups.assign(static_cast<size_t>(options.device_count), -1);
    }
  }
  return std::make_shared<EmulatedDevice>(std::move(options));
}

}  // namespace

Status DeviceBackend::WaitCopy(uint64_t id) {
  for (;;) {
    LARDER_ASSIGN_OR_RETURN(bool finished, QueryCopy(id));
    if (finished) return Status();
    std::this_thread::yield();
  }
}

std::shared_ptr<DeviceBackend> DefaultDeviceBackend() {
  std::shared_ptr<DeviceBackend> cuda = CreateCudaBackend();
  std::string name = GetEnv("LARDER_DEVICE_BACKEND");
  if (name.empty()) name = cuda ? "cuda" : "emulated";
  if (name == "emulated") return Emulated();
  if (name == "cuda" && cuda) return cuda;
  std::string why = name == "cuda" ? "LARDER_DEVICE_BACKEND=cuda: this build has no CUDA backend "
                                     "(build with -DLARDER_WITH_CUDA=ON where a CUDA toolkit is)"
                                   : "LARDER_DEVICE_BACKEND=" + name +
                                         ": no such device backend (cuda or emulated)";
  Log().error("{}", why);
  return std::make_shared<UnavailableDevice>(std::move(why));
}

}  // namespace larder::transfer
