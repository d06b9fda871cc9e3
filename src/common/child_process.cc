// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "common/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace larder {

ChildProcess::~ChildProcess() {
  if (pid_ > 0) Stop(std::chrono::milliseconds(0));
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept { *this = std::move(other); }

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    if (pid_ > 0) Stop(std::chrono::milliseconds(0));
    pid_ = other.pid_;
    stdin_fd_ = other.stdin_fd_;
    stdout_fd_ = other.stdout_fd_;
    address_ = std::move(other.address_);
    buffered_ = std::move(other.buffered_);
    reaped_ = other.reaped_;
    reaped_status_ = other.reaped_status_;
    other.pid_ = -1;
    other.stdin_fd_ = other.stdout_fd_ = -1;
  }
  return *this;
}

Result<ChildProcess> ChildProcess::Spawn(const std::vector<std::string>& argv,
                                         const std::map<std::string, std::string>& env,
                                         std::chrono::milliseconds timeout) {
  if (argv.empty()) return InvalidArgumentError("no program to spawn");
  // A child that dies must not take us with it when we next write to its stdin.
  signal(SIGPIPE, SIG_IGN);
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) return ErrnoToStatus(errno, "pipe");
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]);
    close(in[1]);
    return ErrnoToStatus(errno, "pipe");
  }
  // Build everything exec needs before fork: the child may only call async-signal-safe functions.
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_storage;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    std::string key = entry.substr(0, entry.find('='));
    if (env.count(key) == 0) env_storage.push_back(entry);
  }
  for (const auto& [k, v] : env) env_storage.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& e : env_storage) envp.push_back(e.data());
  envp.push_back(nullptr);

  pid_t pid = fork();
  if (pid < 0) return ErrnoToStatus(errno, "fork");
  if (pid == 0) {
    dup2(in[0], STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  ChildProcess child;
  child.pid_ = pid;
  child.stdin_fd_ = in[1];
  child.stdout_fd_ = out[0];

  std::string line;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      return DeadlineExceededError("child " + argv[0] + " did not become ready");
    pollfd p{child.stdout_fd_, POLLIN, 0};
    int rc = poll(&p, 1, static_cast<int>(left.count()));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) continue;
    char c;
    ssize_t n = read(child.stdout_fd_, &c, 1);
    if (n <= 0) {
      return UnavailableError("child " + argv[0] + " exited before becoming ready");
    }
    if (c != '\n') {
      line += c;
      continue;
    }
    if (line.rfind("READY ", 0) == 0) {
      child.address_ = line.substr(6);
      return child;
    }
    line.clear();
  }
}

Status ChildProcess::WriteLine(const std::string& line) {
  std::string data = line + "\n";
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(stdin_fd_, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return UnavailableError("child " + std::to_string(pid_) + " closed its stdin");
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Result<std::string> ChildProcess::ReadLine(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    size_t newline = buffered_.find('\n');
    if (newline != std::string::npos) {
      std::string line = buffered_.substr(0, newline);
      buffered_.erase(0, newline + 1);
      return line;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return DeadlineExceededError("child " + std::to_string(pid_) + " printed no line in time");
    }
    pollfd p{stdout_fd_, POLLIN, 0};
    int rc = poll(&p, 1, static_cast<int>(left.count()));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) continue;
    char chunk[65536];
    ssize_t n = read(stdout_fd_, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return UnavailableError("child " + std::to_string(pid_) + " exited");
    buffered_.append(chunk, static_cast<size_t>(n));
  }
}

void ChildProcess::Kill(int signal) {
  if (pid_ <= 0 || reaped_) return;
  kill(pid_, signal);
  if (signal != SIGSTOP) return;
  // waitpid reports the stop once the whole thread group has stopped.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    pid_t done = waitpid(pid_, &status, WUNTRACED | WNOHANG);
    if (done < 0) return;
    if (done == pid_) {
      if (WIFSTOPPED(status)) return;
      reaped_ = true;
      reaped_status_ = status;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

int ChildProcess::Stop(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return -1;
  if (stdin_fd_ >= 0) close(stdin_fd_);
  stdin_fd_ = -1;
  int status = reaped_status_;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  pid_t done = reaped_ ? pid_ : 0;
  while (!reaped_ && (done = waitpid(pid_, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (done == 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
  }
  if (stdout_fd_ >= 0) close(stdout_fd_);
  stdout_fd_ = -1;
  pid_ = -1;
  reaped_ = false;
  return status;
}

std::string SelfExecutable() {
  char path[4096];
  ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "";
  path[n] = '\0';
  return path;
}

void AnnounceReady(const std::string& address) {
  std::printf("READY %s\n", address.c_str());
  std::fflush(stdout);
}

void BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void WaitForParentOrSignal() {
  for (;;) {
    pollfd p{STDIN_FILENO, POLLIN, 0};
    int rc = poll(&p, 1, 100);
    if (rc > 0) {
      char buf[256];
      ssize_t n = read(STDIN_FILENO, buf, sizeof(buf));
      if (n <= 0) return;
    }
    sigset_t pending;
    sigpending(&pending);
    if (sigismember(&pending, SIGTERM) || sigismember(&pending, SIGINT)) return;
  }
}

}  // namespace larder
