// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// larder-e2e-peer: a second process for end-to-end tests.
//   serve  export a segment (--name, "e2e" by default) filled with a known pattern, print
//          "READY <address>" (and with --print-host-id "HOST <host id>"), serve until stdin
//          closes; optionally as another uid (--uid) and non-dumpable (--non-dumpable); on the
//          device protocol, in the (emulated) device memory of --device
//   probe  open a peer's segment (optionally after dropping to another uid), read it, and print
//          "ROUTE <route>" and "STATUS <code name>" ; exits 0 when the probe ran
#include <grp.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstring>
#include <iostream>

#include "common/child_process.h"
#include "larder/transfer_engine.h"
#include "transfer/device/device_transport.h"

namespace {

// Byte i of a served segment.
uint8_t PatternByte(uint64_t i) { return static_cast<uint8_t>((i * 131) ^ (i >> 12)); }

// Switches every uid and gid of this process (real, effective, saved) to `uid`, dropping the
// supplementary groups. Needs root. False (with a message on stderr) when the kernel refuses.
bool SwitchToUid(int uid, const char* who) {
  auto id = static_cast<uid_t>(uid);
  if (setgroups(0, nullptr) != 0 || setresgid(id, id, id) != 0 || setresuid(id, id, id) != 0) {
    std::cerr << who << ": cannot switch to uid " << uid << ": " << std::strerror(errno) << "\n";
    return false;
  }
  return true;
}

int Serve(const std::string& protocol, const std::string& name, uint64_t size,
          const std::string& token, int allowed_uid, bool print_host_id, int uid, bool non_dumpable,
          int device) {
  // The device transport initializes on this thread's current device, as with a real GPU.
  if (device >= 0) {
    if (auto bound = larder::transfer::DefaultDeviceBackend()->SetCurrentDevice(device);
        !bound.ok()) {
      std::cerr << "serve: " << bound << "\n";
      return 1;
    }
  }
  if (uid >= 0) {
    if (!SwitchToUid(uid, "serve")) return 2;
    // The kernel clears the dumpable flag whenever credentials change; a process started as `uid`
    // has it set. Restore it, so that only the engine's option decides what is tested.
    if (prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0) {
      std::cerr << "serve: prctl(PR_SET_DUMPABLE, 1): " << std::strerror(errno) << "\n";
      return 2;
    }
  }
  larder::TransferEngineOptions options;
  options.protocol = protocol;
  options.auth_token = token;
  options.non_dumpable = non_dumpable;
  if (allowed_uid >= 0) options.shm_allowed_uids = {static_cast<uint32_t>(allowed_uid)};
  auto engine = larder::TransferEngine::Create(options);
  if (!engine.ok()) {
    std::cerr << "serve: " << engine.status() << "\n";
    return 1;
  }
  auto memory = (*engine)->AllocateSegmentMemory(size);
  if (!memory.ok()) {
    std::cerr << "serve: " << memory.status() << "\n";
    return 1;
  }
  auto* bytes = static_cast<uint8_t*>((*memory)->data());
  for (uint64_t i = 0; i < size; ++i) bytes[i] = PatternByte(i);
  auto id = (*engine)->RegisterSegment(name, *memory);
  if (!id.ok()) {
    std::cerr << "serve: " << id.status() << "\n";
    return 1;
  }
  larder::AnnounceReady((*engine)->address());
  if (print_host_id) std::cout << "HOST " << (*engine)->host_id() << std::endl;
  larder::WaitForParentOrSignal();
  return 0;
}

int Probe(const std::string& target, const std::string& protocol, int uid) {
  if (uid >= 0 && !SwitchToUid(uid, "probe")) return 2;
  larder::TransferEngineOptions options;
  options.protocol = protocol;
  auto engine = larder::TransferEngine::Create(options);
  if (!engine.ok()) {
    std::cerr << "probe: " << engine.status() << "\n";
    return 1;
  }
  auto handle = (*engine)->OpenSegment(target, "e2e");
  if (!handle.ok()) {
    std::cout << "STATUS " << larder::StatusCodeName(handle.status().code()) << "\n"
              << "MESSAGE " << handle.status().message() << "\n";
    return 0;
  }
  std::cout << "ROUTE " << larder::RouteKindName((*engine)->SegmentRoute(*handle).value()) << "\n";
  std::vector<uint8_t> buf(4096);
  larder::TransferRequest r{larder::TransferOp::kRead, buf.data(), *handle, 0, buf.size()};
  auto results = (*engine)->TransferSync({&r, 1}, std::chrono::seconds(10));
  larder::Status st = results.ok() ? (*results)[0].status : results.status();
  if (st.ok()) {
    for (uint64_t i = 0; i < buf.size(); ++i) {
      if (buf[i] != PatternByte(i)) st = larder::DataLossError("pattern mismatch");
    }
  }
  std::cout << "STATUS " << larder::StatusCodeName(st.code()) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  larder::BlockTerminationSignals();
  CLI::App app{"larder-e2e-peer: the other process of end-to-end tests"};
  app.require_subcommand(1);
  std::string protocol = "auto", name = "e2e", token, target;
  uint64_t size = 64ULL << 20;
  int allowed_uid = -1, uid = -1, device = -1;
  bool print_host_id = false, non_dumpable = false;
  auto* serve = app.add_subcommand("serve", "export a patterned segment");
  serve->add_option("--protocol", protocol)->capture_default_str();
  serve->add_option("--name", name, "the segment's name")->capture_default_str();
  serve->add_option("--segment-size", size)->capture_default_str();
  serve->add_option("--token", token, "cluster token");
  serve->add_option("--allowed-uid", allowed_uid, "the only uid allowed to map over shm");
  serve->add_flag("--print-host-id", print_host_id, "print \"HOST <host id>\" after READY");
  serve->add_option("--uid", uid, "switch to this uid (and gid) first (needs root)");
  serve->add_flag("--non-dumpable", non_dumpable, "set TransferEngineOptions::non_dumpable");
  serve->add_option("--device", device, "bind to this (emulated) device first (device protocol)");
  auto* probe = app.add_subcommand("probe", "open a peer's 'e2e' segment and read it");
  probe->add_option("--target", target)->required();
  probe->add_option("--protocol", protocol)->capture_default_str();
  probe->add_option("--uid", uid, "switch to this uid first (needs root)");
  CLI11_PARSE(app, argc, argv);
  if (serve->parsed()) {
    return Serve(protocol, name, size, token, allowed_uid, print_host_id, uid, non_dumpable,
                 device);
  }
  return Probe(target, protocol, uid);
}
