// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The emulator's device memory shared between processes: each rule that a real driver enforces on
// an IPC handle gets a test that breaks it. The exporter is a child process of the test.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "transfer/device/emulated_device.h"

namespace larder::transfer {
namespace {

constexpr uint64_t kMiB = 1 << 20;

bool WriteAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = write(fd, p, size);
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool ReadAll(int fd, void* data, size_t size) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = read(fd, p, size);
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// A child process that allocates `size` bytes of emulated device memory on `device`, fills them
// with `fill` and sends their handle; then it answers commands until its command pipe closes:
// 'f' frees the allocation, 'p' sends back its first byte.
class Exporter {
 public:
  Exporter(int device, uint64_t size, char fill) {
    int commands[2], replies[2];
    if (pipe(commands) != 0 || pipe(replies) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(commands[1]);
      close(replies[0]);
      _exit(Serve(commands[0], replies[1], device, size, fill));
    }
    child_command_fd_ = commands[0];
    close(commands[0]);
    close(replies[1]);
    commands_ = commands[1];
    replies_ = replies[0];
    uint32_t length = 0;
    if (ReadAll(replies_, &length, sizeof(length)) && length <= kMaxDeviceHandleBytes) {
      handle_.resize(length);
      if (!ReadAll(replies_, handle_.data(), length)) handle_.clear();
    }
  }
  ~Exporter() {
    if (commands_ >= 0) close(commands_);
    if (replies_ >= 0) close(replies_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }
  Exporter(const Exporter&) = delete;
  Exporter& operator=(const Exporter&) = delete;

  const std::string& handle() const { return handle_; }
  int pid() const { return pid_; }
  // The child's end of the command pipe: an fd of the exporter that is not its allocation.
  int child_command_fd() const { return child_command_fd_; }

  // The exporter frees the allocation; true once it has.
  bool Free() { return Ask('f') == 'k'; }
  // The first byte of the allocation as the exporter sees it.
  char FirstByte() { return Ask('p'); }
  void Kill() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  static int Serve(int commands, int replies, int device, uint64_t size, char fill) {
    EmulatedDevice exporter;
    if (!exporter.SetCurrentDevice(device).ok() || !exporter.Init().ok()) return 2;
    Result<void*> memory = exporter.Allocate(size);
    if (!memory.ok()) return 3;
    std::memset(*memory, fill, size);
    Result<std::string> handle = exporter.ExportAllocation(*memory);
    if (!handle.ok()) return 4;
    const auto length = static_cast<uint32_t>(handle->size());
    if (!WriteAll(replies, &length, sizeof(length)) || !WriteAll(replies, handle->data(), length)) {
      return 5;
    }
    char command;
    while (ReadAll(commands, &command, 1)) {
      char reply = '?';
      if (command == 'f') reply = exporter.Free(*memory).ok() ? 'k' : 'e';
      if (command == 'p') reply = *static_cast<char*>(*memory);
      if (!WriteAll(replies, &reply, 1)) return 6;
    }
    return 0;
  }
  char Ask(char command) {
    char reply = 0;
    if (!WriteAll(commands_, &command, 1) || !ReadAll(replies_, &reply, 1)) return 0;
    return reply;
  }

  pid_t pid_ = -1;
  int child_command_fd_ = -1;
  int commands_ = -1;
  int replies_ = -1;
  std::string handle_;
};

// An importing backend, initialized on `device`.
std::unique_ptr<EmulatedDevice> Importer(int device, EmulatedDeviceOptions options = {}) {
  auto importer = std::make_unique<EmulatedDevice>(std::move(options));
  EXPECT_TRUE(importer->SetCurrentDevice(device).ok());
  EXPECT_TRUE(importer->Init().ok());
  return importer;
}

TEST(EmulatedDeviceIpcTest, AnImportMapsTheExportersMemoryBothWays) {
  Exporter exporter(/*device=*/0, 3 * kMiB, 'a');
  ASSERT_FALSE(exporter.handle().empty());
  ASSERT_LE(exporter.handle().size(), kMaxDeviceHandleBytes);
  auto importer = Importer(1);
  Result<ImportedAllocation> imported = importer->ImportAllocation(exporter.handle());
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->size, 4 * kMiB);  // the whole allocation, rounded to the granularity
  EXPECT_EQ(imported->exporter_device, 0);
  EXPECT_EQ(reinterpret_cast<uint64_t>(imported->base) % (2 * kMiB), 0u);
  EXPECT_TRUE(importer->IsDeviceMemory(imported->base, 1));
  EXPECT_EQ(importer->import_calls(), 1u);
  EXPECT_GT(importer->import_ns(), 0u);
  EXPECT_EQ(importer->live_imports(), 1u);

  // Read it (device to host) and write it (host to device): the exporter sees the write.
  auto* device_bytes = static_cast<char*>(imported->base);
  std::vector<char> host(4096);
  Result<uint64_t> read = importer->SubmitCopy(host.data(), device_bytes, host.size());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(importer->QueryCopy(*read).value());
  EXPECT_EQ(host[0], 'a');
  EXPECT_EQ(host[4095], 'a');
  std::vector<char> z(1, 'z');
  Result<uint64_t> write = importer->SubmitCopy(device_bytes, z.data(), 1);
  ASSERT_TRUE(write.ok()) << write.status();
  EXPECT_TRUE(importer->QueryCopy(*write).value());
  EXPECT_EQ(exporter.FirstByte(), 'z');

  ASSERT_TRUE(importer->CloseImport(imported->base).ok());
  EXPECT_EQ(importer->live_imports(), 0u);
  EXPECT_EQ(importer->CloseImport(imported->base).code(), StatusCode::kNotFound);
}

TEST(EmulatedDeviceIpcTest, ACopyMustStayInsideTheImport) {
  Exporter exporter(0, 2 * kMiB, 'b');
  auto importer = Importer(0);
  Result<ImportedAllocation> imported = importer->ImportAllocation(exporter.handle());
  ASSERT_TRUE(imported.ok()) << imported.status();
  std::vector<char> host(8192);
  auto* end = static_cast<char*>(imported->base) + imported->size;
  Result<uint64_t> crossing = importer->SubmitCopy(host.data(), end - 4096, 8192);
  EXPECT_EQ(crossing.status().code(), StatusCode::kInvalidArgument) << crossing.status();
  EXPECT_NE(crossing.status().message().find("leaves the imported range"), std::string::npos);
  Result<uint64_t> inside = importer->SubmitCopy(host.data(), end - 4096, 4096);
  EXPECT_TRUE(inside.ok()) << inside.status();
}

TEST(EmulatedDeviceIpcTest, AHandleOpensOnItsOwnHostOnly) {
  Exporter exporter(0, 2 * kMiB, 'c');
  auto elsewhere = Importer(0, {.host_id = "another-host"});
  Result<ImportedAllocation> imported = elsewhere->ImportAllocation(exporter.handle());
  EXPECT_EQ(imported.status().code(), StatusCode::kFailedPrecondition) << imported.status();
  EXPECT_NE(imported.status().message().find("its own host only"), std::string::npos);
  EXPECT_EQ(elsewhere->live_imports(), 0u);
}

TEST(EmulatedDeviceIpcTest, AHandleOpensOnlyOnADeviceWithPeerAccess) {
  Result<std::vector<int>> groups = ParsePeerGroups("0-3,4-7", 8);
  ASSERT_TRUE(groups.ok()) << groups.status();
  Exporter exporter(/*device=*/1, 2 * kMiB, 'd');
  auto far = Importer(5, {.peer_groups = *groups});
  Result<ImportedAllocation> refused = far->ImportAllocation(exporter.handle());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("device 5 has no peer access to device 1"),
            std::string::npos)
      << refused.status();
  auto near = Importer(3, {.peer_groups = *groups});
  EXPECT_TRUE(near->ImportAllocation(exporter.handle()).ok());
}

TEST(EmulatedDeviceIpcTest, AHandleIsStaleOnceTheExporterFreesOrExits) {
  Exporter freed(0, 2 * kMiB, 'e');
  ASSERT_TRUE(freed.Free());
  auto importer = Importer(0);
  Result<ImportedAllocation> after_free = importer->ImportAllocation(freed.handle());
  EXPECT_EQ(after_free.status().code(), StatusCode::kFailedPrecondition) << after_free.status();
  EXPECT_NE(after_free.status().message().find("stale"), std::string::npos);

  Exporter exited(0, 2 * kMiB, 'f');
  const std::string handle = exited.handle();
  exited.Kill();
  Result<ImportedAllocation> after_exit = importer->ImportAllocation(handle);
  EXPECT_EQ(after_exit.status().code(), StatusCode::kFailedPrecondition) << after_exit.status();
  EXPECT_EQ(importer->live_imports(), 0u);
}

TEST(EmulatedDeviceIpcTest, ACopyFailsOnceTheExporterDiesAndOthersGoOn) {
  Exporter dying(0, 2 * kMiB, 'g');
  Exporter living(0, 2 * kMiB, 'h');
  auto importer = Importer(0);
  Result<ImportedAllocation> dead = importer->ImportAllocation(dying.handle());
  Result<ImportedAllocation> alive = importer->ImportAllocation(living.handle());
  ASSERT_TRUE(dead.ok() && alive.ok());
  dying.Kill();
  std::vector<char> host(4096);
  Result<uint64_t> copy = importer->SubmitCopy(host.data(), dead->base, host.size());
  EXPECT_EQ(copy.status().code(), StatusCode::kFailedPrecondition) << copy.status();
  EXPECT_NE(copy.status().message().find("exited"), std::string::npos) << copy.status();
  Result<uint64_t> other = importer->SubmitCopy(host.data(), alive->base, host.size());
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_TRUE(importer->QueryCopy(*other).value());
  EXPECT_EQ(host[0], 'h');
  EXPECT_TRUE(importer->CloseImport(dead->base).ok());
}

TEST(EmulatedDeviceIpcTest, BadHandlesAreRefused) {
  auto importer = Importer(0);
  for (const std::string& bad :
       {std::string(), std::string("garbage"), std::string("LDEVH1\x05", 7),
        std::string(kMaxDeviceHandleBytes + 1, 'x')}) {
    Result<ImportedAllocation> imported = importer->ImportAllocation(bad);
    EXPECT_EQ(imported.status().code(), StatusCode::kInvalidArgument) << imported.status();
  }
  // A truncated real handle.
  Exporter exporter(0, 2 * kMiB, 'i');
  const std::string& handle = exporter.handle();
  for (size_t cut = 0; cut < handle.size(); cut += 7) {
    EXPECT_EQ(importer->ImportAllocation(handle.substr(0, cut)).status().code(),
              StatusCode::kInvalidArgument)
        << cut;
  }
  // One of this process: a real driver opens another process's handles only.
  Result<void*> own = importer->Allocate(2 * kMiB);
  ASSERT_TRUE(own.ok());
  Result<std::string> own_handle = importer->ExportAllocation(*own);
  ASSERT_TRUE(own_handle.ok()) << own_handle.status();
  auto sibling = Importer(0);
  EXPECT_EQ(sibling->ImportAllocation(*own_handle).status().code(),
            StatusCode::kFailedPrecondition);
  // Exports: only whole allocations, only after init.
  EXPECT_EQ(importer->ExportAllocation(static_cast<char*>(*own) + 4096).status().code(),
            StatusCode::kInvalidArgument);
  EmulatedDevice uninitialized;
  ASSERT_TRUE(uninitialized.SetCurrentDevice(0).ok());
  EXPECT_EQ(uninitialized.ExportAllocation(*own).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(importer->live_imports(), 0u);
}

// The emulated handle is magic | u16 host id length | host id | i32 pid | i32 fd | ...: the same
// handle with another fd of the exporter.
std::string WithFd(std::string handle, int32_t fd) {
  uint16_t host_size = 0;
  std::memcpy(&host_size, handle.data() + 6, sizeof(host_size));
  std::memcpy(handle.data() + 6 + 2 + host_size + 4, &fd, sizeof(fd));
  return handle;
}

TEST(EmulatedDeviceIpcTest, AHandleNamingAnotherFileOfTheExporterIsNeverOpened) {
  Exporter exporter(0, 2 * kMiB, 'j');
  ASSERT_GE(exporter.child_command_fd(), 0);
  auto importer = Importer(0);
  // The exporter's command pipe: opening it read-write would make the importer a writer (and a
  // reader) of that pipe; the import must refuse before it opens anything.
  for (int32_t fd : {exporter.child_command_fd(), 0, 1, 2, 1000}) {
    Result<ImportedAllocation> imported = importer->ImportAllocation(WithFd(exporter.handle(), fd));
    EXPECT_EQ(imported.status().code(), StatusCode::kFailedPrecondition) << imported.status();
    EXPECT_NE(imported.status().message().find("names no allocation"), std::string::npos)
        << imported.status();
  }
  EXPECT_EQ(importer->live_imports(), 0u);
  // The exporter's pipe is untouched, and the true handle still opens.
  EXPECT_EQ(exporter.FirstByte(), 'j');
  EXPECT_TRUE(importer->ImportAllocation(exporter.handle()).ok());
}

TEST(EmulatedDeviceIpcTest, PeerGroupsParse) {
  Result<std::vector<int>> all = ParsePeerGroups("", 4);
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->empty());
  Result<std::vector<int>> two = ParsePeerGroups("0-1,3", 4);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(*two, (std::vector<int>{0, 0, -1, 1}));
  for (const char* bad : {"0-9", "2-1", "a", "0-1,1-2", "0,,1", "-1"}) {
    EXPECT_EQ(ParsePeerGroups(bad, 4).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EmulatedDevice device({.peer_groups = *two});
  EXPECT_TRUE(device.HasPeerAccess(0, 1));
  EXPECT_TRUE(device.HasPeerAccess(2, 2));
  EXPECT_FALSE(device.HasPeerAccess(2, 0));
  EXPECT_FALSE(device.HasPeerAccess(1, 3));
}

}  // namespace
}  // namespace larder::transfer
