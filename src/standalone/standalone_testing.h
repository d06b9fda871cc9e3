// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Test helpers for the standalone daemon: spawning larder-master and larder-client processes
// from LARDER_BIN_DIR (one pair for a whole test suite), unique socket names, memfds to share,
// the byte pattern attached processes write.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/child_process.h"
#include "common/net.h"
#include "larder/standalone.h"
#include "larder/status.h"
#include "testing/binaries.h"
#include "testing/master_process.h"
#include "testing/wait.h"

namespace larder::standalone::testing {

using larder::test::Bin;
using larder::test::MasterProcess;
using larder::test::WaitUntil;

// A larder-master on loopback.
Result<MasterProcess> StartMaster();

struct DaemonProcess {
  ChildProcess process;
  std::string socket;   // as the daemon announced it
  std::string segment;  // its segment's name
};
// larder-client on `socket` for the master at `master`, with a 64 MiB segment and `flags`.
Result<DaemonProcess> StartDaemon(const std::string& master, const std::string& socket,
                                  const std::vector<std::string>& flags = {});

// "@larder-client-test-<pid>-<n>-<tag>", unique in this process.
std::string UniqueSocket(const std::string& tag);

// One larder-master and one larder-client for it that the tests of a suite share: Start in
// SetUpTestSuite, Stop in TearDownTestSuite. Not thread-safe.
class SuiteDeployment {
 public:
  // Starts both, the daemon on UniqueSocket(`tag`) with `daemon_flags`. Errors: those of
  // StartMaster and StartDaemon (nothing stays running then).
  Status Start(const std::string& tag, const std::vector<std::string>& daemon_flags = {});
  // Stops the daemon, then the master. Harmless when not started.
  void Stop();

  bool started() const { return daemon_.has_value(); }
  // REQUIRES: started().
  MasterProcess& master() { return *master_; }
  DaemonProcess& daemon() { return *daemon_; }

 private:
  std::optional<MasterProcess> master_;
  std::optional<DaemonProcess> daemon_;
};

// A memfd of `size` bytes with `seals` (F_SEAL_* flags; 0: none) added, mapped MAP_SHARED here:
// memory that a client shares with larder-client. `status` says whether creating, sizing,
// sealing or mapping it failed (`data` is null then). Unmapped on destruction.
struct SharedMemfd {
  SharedMemfd(size_t size, unsigned seals);
  ~SharedMemfd();
  SharedMemfd(const SharedMemfd&) = delete;
  SharedMemfd& operator=(const SharedMemfd&) = delete;

  uint64_t address() const { return reinterpret_cast<uintptr_t>(data); }
  // Another fd of the same memfd.
  Fd Dup() const;

  Status status;
  Fd fd;
  char* data = nullptr;
  size_t size = 0;
};

// Byte i of the value of `key`: differs between keys and along a value.
uint8_t PatternByte(std::string_view key, uint64_t i);
void FillPattern(std::string_view key, void* data, uint64_t size);
// The index of the first byte that differs from the pattern, or -1 when none does.
int64_t FirstMismatch(std::string_view key, const void* data, uint64_t size);

// Default options with `socket`.
AttachOptions AttachTo(const std::string& socket);

}  // namespace larder::standalone::testing
