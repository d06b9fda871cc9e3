// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// What TransferEngineOptions::non_dumpable does and does not do. Without it, any process of the
// owner's uid can open the owner's memfd through /proc/PID/fd/N, map it read-write and read or
// change the segment: the documented boundary is the uid. With it, that path is closed (EACCES),
// while peers still map the segment through the authenticated fd handoff.
//
// Root (CAP_SYS_PTRACE) ignores the dumpable flag, so when the test runs as root both the owner
// and the attacker run as an unprivileged uid (kUnprivilegedUid); otherwise both keep ours.
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "common/child_process.h"
#include "larder/transfer_engine.h"

namespace larder {
namespace {

using namespace std::chrono_literals;

constexpr int kUnprivilegedUid = 65534;  // nobody
constexpr uint64_t kSegmentBytes = 1 << 20;
constexpr size_t kCheckedBytes = 4096;

// Byte i of the segment that larder-e2e-peer serves.
uint8_t PatternByte(uint64_t i) { return static_cast<uint8_t>((i * 131) ^ (i >> 12)); }

std::string PeerBinary() {
  const char* dir = std::getenv("LARDER_BIN_DIR");
  return std::string(dir ? dir : ".") + "/larder-e2e-peer";
}

// The uid both roles run as: an unprivileged one when we are root, else ours (-1: no switch).
int RoleUid() { return geteuid() == 0 ? kUnprivilegedUid : -1; }

// Runs `body` in a forked child, first switched to `uid` (all ids, no supplementary groups) unless
// it is -1, and returns what `body` returned, or what went wrong. The child is killed when it has
// not answered by `timeout`. REQUIRES: this process has no other threads (fork keeps only ours).
std::string RunAs(int uid, const std::function<std::string()>& body,
                  std::chrono::milliseconds timeout = 20s) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return "pipe: " + std::string(std::strerror(errno));
  pid_t pid = fork();
  if (pid < 0) return "fork: " + std::string(std::strerror(errno));
  if (pid == 0) {
    close(fds[0]);
    std::string out;
    auto id = static_cast<uid_t>(uid);
    if (uid >= 0 &&
        (setgroups(0, nullptr) != 0 || setresgid(id, id, id) != 0 || setresuid(id, id, id) != 0)) {
      out = "cannot switch to uid " + std::to_string(uid) + ": " + std::strerror(errno);
    } else {
      out = body();
    }
    ssize_t n = write(fds[1], out.data(), out.size());
    _exit(n == static_cast<ssize_t>(out.size()) ? 0 : 1);
  }
  close(fds[1]);
  std::string out;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  bool finished = false;
  while (!finished) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fds[0], POLLIN, 0};
    int rc = poll(&p, 1, static_cast<int>(left.count()));
    if (rc < 0 && errno != EINTR) break;
    if (rc <= 0) continue;
    char buf[512];
    ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      finished = true;  // the child wrote everything and exited
    } else {
      out.append(buf, static_cast<size_t>(n));
    }
  }
  close(fds[0]);
  if (!finished) {
    kill(pid, SIGKILL);
    out = "timed out: " + out;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return out;
}

// The attack: as a process of the owner's uid, find the owner's segment memfd through
// /proc/PID/fd ("/memfd:larder-segment ..."), open it read-write, map it, check it holds the
// segment and change its first byte. Returns "stole: read the segment, wrote byte 0", or the step
// that failed with its errno ("readlink errno 13; open errno 13" when /proc/PID/fd is closed).
std::string StealSegmentThroughProc(pid_t owner) {
  const std::string dir = "/proc/" + std::to_string(owner) + "/fd/";
  int readlink_errno = 0;
  std::string found;
  for (int fd = 0; fd < 1024 && found.empty(); ++fd) {
    std::string path = dir + std::to_string(fd);
    char link[256];
    ssize_t n = readlink(path.c_str(), link, sizeof(link) - 1);
    if (n < 0) {
      if (errno != ENOENT) readlink_errno = errno;
      continue;
    }
    link[n] = '\0';
    if (std::strncmp(link, "/memfd:larder-segment", 21) == 0) found = path;
  }
  if (found.empty()) {
    if (readlink_errno == 0) return "no memfd among the owner's fds";
    // Blind guesses at the fd number fail the same way: the path itself is closed.
    int open_errno = 0;
    for (int fd = 0; fd < 1024; ++fd) {
      int opened = open((dir + std::to_string(fd)).c_str(), O_RDWR | O_CLOEXEC);
      if (opened >= 0) {
        close(opened);
        return "opened fd " + std::to_string(fd) + " though readlink failed";
      }
      if (errno != ENOENT) open_errno = errno;
    }
    return "readlink errno " + std::to_string(readlink_errno) + "; open errno " +
           std::to_string(open_errno);
  }
  int fd = open(found.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return "open errno " + std::to_string(errno);
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < kCheckedBytes) {
    close(fd);
    return "memfd too small";
  }
  void* p = mmap(nullptr, kCheckedBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return "mmap errno " + std::to_string(errno);
  auto* bytes = static_cast<uint8_t*>(p);
  bool segment = true;
  for (uint64_t i = 0; i < kCheckedBytes; ++i) segment &= bytes[i] == PatternByte(i);
  bytes[0] ^= 0xff;
  munmap(p, kCheckedBytes);
  return segment ? "stole: read the segment, wrote byte 0" : "mapped other bytes";
}

// An honest peer of the owner's uid: opens the owner's segment over shm only (the fd handoff) and
// reads its first bytes. "shm: pattern", "shm: differs at byte N", or the error. Run it through
// RunAs, so that this process never starts an engine's threads.
std::string ReadThroughHandoff(const std::string& address) {
  TransferEngineOptions options;
  options.protocol = "shm";
  auto engine = TransferEngine::Create(options);
  if (!engine.ok()) return "create: " + engine.status().ToString();
  auto segment = (*engine)->OpenSegment(address, "e2e");
  if (!segment.ok()) return "open: " + segment.status().ToString();
  std::vector<uint8_t> buf(kCheckedBytes);
  TransferRequest r{TransferOp::kRead, buf.data(), *segment, 0, buf.size()};
  auto results = (*engine)->TransferSync({&r, 1}, 10s);
  if (!results.ok()) return "read: " + results.status().ToString();
  if (!(*results)[0].status.ok()) return "read: " + (*results)[0].status.ToString();
  std::string route(RouteKindName((*results)[0].route));
  for (uint64_t i = 0; i < buf.size(); ++i) {
    if (buf[i] != PatternByte(i)) return route + ": differs at byte " + std::to_string(i);
  }
  return route + ": pattern";
}

// How the owner is made non-dumpable.
enum class NonDumpable { kOff, kOption, kEnvironment };

class ShmTrustTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (RoleUid() >= 0) {
      std::string dropped = RunAs(RoleUid(), [] { return std::string("ok"); });
      if (dropped != "ok") {
        GTEST_SKIP() << "root here cannot run processes as uid " << kUnprivilegedUid << " ("
                     << dropped << "), and as root the dumpable flag is bypassed";
      }
    }
  }

  // Starts an owner (larder-e2e-peer serve) of RoleUid() exporting the patterned segment "e2e".
  ChildProcess StartOwner(NonDumpable mode) {
    std::vector<std::string> argv = {PeerBinary(), "serve",          "--protocol",
                                     "auto",       "--segment-size", std::to_string(kSegmentBytes)};
    if (RoleUid() >= 0) {
      argv.push_back("--uid");
      argv.push_back(std::to_string(RoleUid()));
    }
    if (mode == NonDumpable::kOption) argv.push_back("--non-dumpable");
    std::map<std::string, std::string> env = {
        {"LARDER_LOG_LEVEL", "error"},
        {"LARDER_NON_DUMPABLE", mode == NonDumpable::kEnvironment ? "1" : ""}};
    auto child = ChildProcess::Spawn(argv, env, 30s);
    EXPECT_TRUE(child.ok()) << child.status();
    return child.ok() ? std::move(child).value() : ChildProcess();
  }
};

TEST_F(ShmTrustTest, SameUidProcessCanOpenTheMemfdOfADumpableOwner) {
  auto owner = StartOwner(NonDumpable::kOff);
  ASSERT_GT(owner.pid(), 0);
  pid_t pid = owner.pid();
  std::string address = owner.address();
  auto read_through_handoff = [address] { return ReadThroughHandoff(address); };
  EXPECT_EQ(RunAs(RoleUid(), read_through_handoff), "shm: pattern");
  // Same uid, no handoff, no token: the documented boundary is the uid, and this crosses nothing.
  EXPECT_EQ(RunAs(RoleUid(), [pid] { return StealSegmentThroughProc(pid); }),
            "stole: read the segment, wrote byte 0");
  // The change landed in the owner's segment: an honest peer now reads it.
  EXPECT_EQ(RunAs(RoleUid(), read_through_handoff), "shm: differs at byte 0");
  owner.Stop(5s);
}

class ShmTrustNonDumpableTest : public ShmTrustTest,
                                public ::testing::WithParamInterface<NonDumpable> {};

TEST_P(ShmTrustNonDumpableTest, ProcFdIsClosedAndTheHandoffStillServes) {
  auto owner = StartOwner(GetParam());
  ASSERT_GT(owner.pid(), 0);
  pid_t pid = owner.pid();
  EXPECT_EQ(RunAs(RoleUid(), [pid] { return StealSegmentThroughProc(pid); }),
            "readlink errno " + std::to_string(EACCES) + "; open errno " + std::to_string(EACCES));
  // The owner still serves peers of its uid through the handoff, and its bytes are intact.
  std::string address = owner.address();
  EXPECT_EQ(RunAs(RoleUid(), [address] { return ReadThroughHandoff(address); }), "shm: pattern");
  owner.Stop(5s);
}

INSTANTIATE_TEST_SUITE_P(Owner, ShmTrustNonDumpableTest,
                         ::testing::Values(NonDumpable::kOption, NonDumpable::kEnvironment),
                         [](const ::testing::TestParamInfo<NonDumpable>& info) {
                           return std::string(info.param == NonDumpable::kOption ? "Option"
                                                                                 : "Environment");
                         });

}  // namespace
}  // namespace larder
