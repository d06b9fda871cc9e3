// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "standalone/standalone_testing.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <thread>

namespace larder::standalone::testing {

Result<MasterProcess> StartMaster() { return test::SpawnMaster("", "0", {}, {}); }

Result<DaemonProcess> StartDaemon(const std::string& master, const std::string& socket,
                                  const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {
      Bin("larder-client"), "--master", master,          "--segment-size", "64M",
      "--socket",           socket,     "--parent-watch"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  LARDER_ASSIGN_OR_RETURN(ChildProcess child,
                          ChildProcess::Spawn(argv, {}, std::chrono::seconds(60)));
  DaemonProcess daemon;
  const std::string& announced = child.address();
  daemon.socket = announced.substr(0, announced.find(' '));
  daemon.segment = announced.substr(announced.find(' ') + 1);
  daemon.process = std::move(child);
  return daemon;
}

std::string UniqueSocket(const std::string& tag) {
  static std::atomic<int> next{0};
  return "@larder-client-test-" + std::to_string(getpid()) + "-" + std::to_string(next++) + "-" +
         tag;
}

Status SuiteDeployment::Start(const std::string& tag,
                              const std::vector<std::string>& daemon_flags) {
  LARDER_ASSIGN_OR_RETURN(MasterProcess master, StartMaster());
  LARDER_ASSIGN_OR_RETURN(DaemonProcess daemon,
                          StartDaemon(master.address, UniqueSocket(tag), daemon_flags));
  master_ = std::move(master);
  daemon_ = std::move(daemon);
  return Status::Ok();
}

void SuiteDeployment::Stop() {
  daemon_.reset();
  master_.reset();
}

SharedMemfd::SharedMemfd(size_t bytes, unsigned seals) : size(bytes) {
  fd = Fd(memfd_create("larder-test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) {
    status = ErrnoToStatus(errno, "memfd_create");
    return;
  }
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    status = ErrnoToStatus(errno, "ftruncate memfd");
    return;
  }
  if (seals != 0 && fcntl(fd.get(), F_ADD_SEALS, seals) != 0) {
    status = ErrnoToStatus(errno, "F_ADD_SEALS");
    return;
  }
  void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (mapped == MAP_FAILED) {
    status = ErrnoToStatus(errno, "mmap memfd");
    return;
  }
  data = static_cast<char*>(mapped);
}

SharedMemfd::~SharedMemfd() {
  if (data != nullptr) munmap(data, size);
}

Fd SharedMemfd::Dup() const { return Fd(dup(fd.get())); }

uint8_t PatternByte(std::string_view key, uint64_t i) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the key
  for (char c : key) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  uint64_t x = h ^ (i * 0x9e3779b97f4a7c15ull);
  x ^= x >> 29;
  return static_cast<uint8_t>(x ^ (x >> 11));
}

void FillPattern(std::string_view key, void* data, uint64_t size) {
  auto* bytes = static_cast<uint8_t*>(data);
  for (uint64_t i = 0; i < size; ++i) bytes[i] = PatternByte(key, i);
}

int64_t FirstMismatch(std::string_view key, const void* data, uint64_t size) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  for (uint64_t i = 0; i < size; ++i) {
    if (bytes[i] != PatternByte(key, i)) return static_cast<int64_t>(i);
  }
  return -1;
}

AttachOptions AttachTo(const std::string& socket) {
  AttachOptions options;
  options.socket = socket;
  return options;
}

}  // namespace larder::standalone::testing
