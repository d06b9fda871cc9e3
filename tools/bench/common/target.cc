// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "bench/common/target.h"

#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>

#include "larder/transfer_engine.h"
#include "transfer/device/device_transport.h"

namespace larder::bench {

Status RunTarget(const TargetOptions& options) {
  TransferEngineOptions engine_options;
  engine_options.protocol = options.protocol;
  engine_options.listen_address = options.listen_address;
  engine_options.auth_token = options.auth_token;
  engine_options.use_huge_pages = options.huge_pages;
  if (options.device >= 0) {
    LARDER_RETURN_IF_ERROR(transfer::DefaultDeviceBackend()->SetCurrentDevice(options.device));
  }
  LARDER_ASSIGN_OR_RETURN(auto engine, TransferEngine::Create(engine_options));
  LARDER_ASSIGN_OR_RETURN(auto memory, engine->AllocateSegmentMemory(options.segment_size));
  // Fault every page in now so that the first measurement does not pay for it. Device memory is
  // not the CPU's to touch: the initiator's warm-up pass writes it.
  if (memory->kind() != MemoryKind::kDevice) {
    std::memset(memory->data(), options.fill, memory->size());
  }
  LARDER_ASSIGN_OR_RETURN(SegmentId id, engine->RegisterSegment(options.segment_name, memory));
  (void)id;
  AnnounceReady(engine->address());
  if (options.json) {
    // After READY: ChildProcess::Spawn reads up to that line, so the protocol is unchanged.
    nlohmann::json announcement = {{"address", engine->address()},
                                   {"segment_name", options.segment_name},
                                   {"segment_size", memory->size()},
                                   {"page_size", memory->page_size()},
                                   {"protocol", options.protocol}};
    std::cout << announcement.dump() << std::endl;
  }
  WaitForParentOrSignal();
  return Status();
}

Result<ChildProcess> SpawnTarget(const TargetOptions& options,
                                 const std::map<std::string, std::string>& env,
                                 const std::vector<std::string>& prefix) {
  std::vector<std::string> argv = prefix;
  std::vector<std::string> own = {SelfExecutable(), "target",
                                  "--listen",       options.listen_address,
                                  "--segment-size", std::to_string(options.segment_size),
                                  "--segment-name", options.segment_name,
                                  "--protocol",     options.protocol};
  argv.insert(argv.end(), own.begin(), own.end());
  if (options.device >= 0) {
    argv.push_back("--device");
    argv.push_back(std::to_string(options.device));
  }
  if (options.huge_pages) argv.push_back("--huge-pages");
  if (options.json) argv.push_back("--json");
  std::map<std::string, std::string> child_env = env;
  if (!options.auth_token.empty()) child_env["LARDER_AUTH_TOKEN"] = options.auth_token;
  return ChildProcess::Spawn(argv, child_env, std::chrono::seconds(60));
}

}  // namespace larder::bench
