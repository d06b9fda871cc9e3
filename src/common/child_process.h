// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Child processes, and the other side of them: a parent (a benchmark, the demo, an end-to-end
// test) spawns a program and reads the address it announces ("READY <ip:port>" on stdout); the
// services' mains announce it, and serve until their parent goes or a termination signal comes.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "larder/status.h"

namespace larder {

// A running child. Its stdin is a pipe held by the parent: children serve until it closes, so
// they never outlive a crashed parent. Destruction kills (SIGKILL) and reaps a child still running.
class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess();
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;

  // Runs `argv` (argv[0] is the path) with `env` added to this process's environment, and waits
  // until it prints "READY <address>" (returned by address()) or `timeout` passes.
  static Result<ChildProcess> Spawn(const std::vector<std::string>& argv,
                                    const std::map<std::string, std::string>& env,
                                    std::chrono::milliseconds timeout);

  pid_t pid() const { return pid_; }
  const std::string& address() const { return address_; }
  // Writes `line` and a newline to its stdin. Errors: Unavailable (it exited).
  Status WriteLine(const std::string& line);
  // The next line it prints on stdout (without the newline). Errors: DeadlineExceeded,
  // Unavailable (it exited).
  Result<std::string> ReadLine(std::chrono::milliseconds timeout);

  // Sends `signal` (e.g. SIGKILL for crash tests). For SIGSTOP, returns once every thread of the
  // child has stopped (or it exited): a stop takes effect as each thread next enters the kernel,
  // so without the wait the child could still answer a request sent after Kill returned.
  void Kill(int signal);
  // Closes its stdin and waits up to `timeout` for it to exit; kills it after that. Exit status.
  int Stop(std::chrono::milliseconds timeout);

 private:
  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  std::string address_;
  std::string buffered_;  // stdout read but not yet returned by ReadLine
  // Set when waiting for a stop reaped the child instead: its exit status, for Stop.
  bool reaped_ = false;
  int reaped_status_ = 0;
};

// Path of the running executable.
std::string SelfExecutable();

// Announces readiness to a parent that spawned us with ChildProcess::Spawn.
void AnnounceReady(const std::string& address);

// Blocks SIGTERM and SIGINT in the calling thread and in every thread it starts afterwards, so
// that WaitForParentOrSignal can take them. Call first thing in main.
void BlockTerminationSignals();

// Blocks until stdin reaches EOF (the parent closed it or died) or SIGTERM/SIGINT arrives.
// REQUIRES: BlockTerminationSignals() ran before any thread was started.
void WaitForParentOrSignal();

}  // namespace larder
