// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Test-only: a real single-member etcd for tests, on free loopback ports, with its data in a
// fresh temporary directory. Tests can stop it (a crash), restart it on the same ports and data,
// and freeze it (SIGSTOP) to make it unreachable without closing its connections.
//
//   std::string why;
//   if (!EtcdTestServer::Available(&why)) GTEST_SKIP() << why;
//   auto etcd = EtcdTestServer::Start();
//   ASSERT_TRUE(etcd.ok()) << etcd.status();
//   ... (*etcd)->endpoint() ...   // "127.0.0.1:PORT", for EtcdOptions or --etcd
//
// The binary is $LARDER_ETCD when set, else `etcd` on PATH (Debian's etcd-server: 3.4). Each
// server has its own ports and directory, so tests using it can run concurrently.
//
// Thread safety: none; drive one server from one thread. The etcd process gets SIGKILL if the
// thread that started it (or restarted it) exits, so start it from the test's main thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>

#include "larder/status.h"

namespace larder::etcd {

class EtcdTestServer {
 public:
  // True when an etcd binary is found; otherwise false, with `why` (when not null) saying what
  // is missing, for GTEST_SKIP.
  static bool Available(std::string* why);

  // Starts etcd and waits (up to `timeout`) until it answers a read. Errors: FailedPrecondition
  // (no binary), Unavailable (it exited or did not answer in time; the message carries the end
  // of its log).
  static Result<std::unique_ptr<EtcdTestServer>> Start(
      std::chrono::milliseconds timeout = std::chrono::seconds(30));

  // Kills etcd (SIGKILL) and removes its directory.
  ~EtcdTestServer();
  EtcdTestServer(const EtcdTestServer&) = delete;
  EtcdTestServer& operator=(const EtcdTestServer&) = delete;

  // "127.0.0.1:PORT" of its client URL; stays the same across Restart.
  const std::string& endpoint() const { return endpoint_; }
  // The etcd process, or -1 while stopped.
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }

  // Kills etcd (SIGKILL, a crash) and reaps it; its data stays for Restart. No-op when stopped.
  void Stop();
  // Stops etcd when running, then starts it again on the same ports and data directory (keys
  // and leases survive; etcd extends leases on start) and waits until it answers, as Start.
  Status Restart(std::chrono::milliseconds timeout = std::chrono::seconds(30));
  // SIGSTOP / SIGCONT: while paused, connections stay open but nothing answers.
  // REQUIRES: running().
  void Pause();
  void Resume();

 private:
  EtcdTestServer() = default;
  Status Launch(std::chrono::milliseconds timeout);
  std::string LogTail() const;

  std::string binary_;
  std::string dir_;  // temporary directory: data/ and etcd.log
  uint16_t client_port_ = 0;
  uint16_t peer_port_ = 0;
  std::string endpoint_;
  pid_t pid_ = -1;
  bool paused_ = false;
};

}  // namespace larder::etcd
