// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "etcd/etcd_test_server.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "common/env.h"
#include "common/net.h"
#include "etcd/etcd_client.h"

namespace larder::etcd {

namespace {

// An executable `name` on PATH, or "".
std::string FindOnPath(const std::string& name) {
  std::string path = GetEnv("PATH");
  if (path.empty()) path = "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= path.size()) {
    size_t colon = path.find(':', start);
    std::string dir =
        path.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (!dir.empty()) {
      std::string candidate = dir;
      candidate += '/';
      candidate += name;
      if (access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return "";
}

std::string EtcdBinary(std::string* why) {
  std::string configured = GetEnv("LARDER_ETCD");
  if (!configured.empty()) {
    if (access(configured.c_str(), X_OK) == 0) return configured;
    if (why != nullptr) {
      *why = "LARDER_ETCD=";
      *why += configured;
      *why += " is not an executable file";
    }
    return "";
  }
  std::string found = FindOnPath("etcd");
  if (found.empty() && why != nullptr) {
    *why =
        "no etcd binary: install etcd 3.4+ (Debian: apt-get install etcd-server) or set "
        "LARDER_ETCD to its path";
  }
  return found;
}

// A port that was free a moment ago (etcd binds it next; Start retries when that loses a race).
Result<uint16_t> FreePort() {
  LARDER_ASSIGN_OR_RETURN(Fd listener, TcpListen(HostPort{"127.0.0.1", 0}));
  return BoundPort(listener.get());
}

std::string Url(uint16_t port) {
  std::string url = "http://127.0.0.1:";
  url += std::to_string(port);
  return url;
}

}  // namespace

bool EtcdTestServer::Available(std::string* why) { return !EtcdBinary(why).empty(); }

Result<std::unique_ptr<EtcdTestServer>> EtcdTestServer::Start(std::chrono::milliseconds timeout) {
  std::string why;
  std::string binary = EtcdBinary(&why);
  if (binary.empty()) return FailedPreconditionError(why);
  std::unique_ptr<EtcdTestServer> server(new EtcdTestServer());
  server->binary_ = binary;
  std::string pattern = std::filesystem::temp_directory_path().string();
  pattern += "/larder-etcd-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    std::string what = "mkdtemp ";
    what += pattern;
    return ErrnoToStatus(errno, what);
  }
  server->dir_ = pattern;
  // Ports are picked free but taken by etcd only later; another process may win one meanwhile.
  Status launched;
  for (int attempt = 0; attempt < 3; ++attempt) {
    LARDER_ASSIGN_OR_RETURN(server->client_port_, FreePort());
    LARDER_ASSIGN_OR_RETURN(server->peer_port_, FreePort());
    if (server->client_port_ == server->peer_port_) continue;
    server->endpoint_ = "127.0.0.1:";
    server->endpoint_ += std::to_string(server->client_port_);
    launched = server->Launch(timeout);
    if (launched.ok()) return server;
    server->Stop();
    std::filesystem::remove_all(server->dir_ + "/data");
  }
  return launched;
}

EtcdTestServer::~EtcdTestServer() {
  Stop();
  if (!dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
}

Status EtcdTestServer::Launch(std::chrono::milliseconds timeout) {
  const std::string name = "larder-test";
  const std::string client_url = Url(client_port_);
  const std::string peer_url = Url(peer_port_);
  std::string cluster = name;
  cluster += '=';
  cluster += peer_url;
  std::vector<std::string> args = {binary_,        "--name",
                                   name,           "--data-dir",
                                   dir_ + "/data", "--listen-client-urls",
                                   client_url,     "--advertise-client-urls",
                                   client_url,     "--listen-peer-urls",
                                   peer_url,       "--initial-advertise-peer-urls",
                                   peer_url,       "--initial-cluster",
                                   cluster,        "--initial-cluster-state",
                                   "new",          "--logger",
                                   "zap",          "--log-level",
                                   "error"};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const std::string log = dir_ + "/etcd.log";
  const pid_t parent = getpid();

  pid_t pid = fork();
  if (pid < 0) return ErrnoToStatus(errno, "fork for etcd");
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    int in = open("/dev/null", O_RDONLY);
    int out = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (in < 0 || out < 0) _exit(127);
    dup2(in, STDIN_FILENO);
    dup2(out, STDOUT_FILENO);
    dup2(out, STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  pid_ = pid;
  paused_ = false;

  EtcdOptions options;
  options.endpoints = {endpoint_};
  options.timeout = std::chrono::milliseconds(500);
  LARDER_ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> client, EtcdClient::Create(options));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Status last;
  for (;;) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      std::string message = "etcd (";
      message += binary_;
      message += ") exited before answering; its log ends: ";
      message += LogTail();
      return UnavailableError(message);
    }
    auto probe = client->Get("/larder-test/probe");
    if (probe.ok()) return Status();
    last = probe.status();
    if (std::chrono::steady_clock::now() >= deadline) break;
    // Polls, bounded by the deadline above.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::string message = "etcd on ";
  message += endpoint_;
  message += " did not answer within ";
  message += std::to_string(timeout.count());
  message += " ms (";
  message += last.ToString();
  message += "); its log ends: ";
  message += LogTail();
  return UnavailableError(message);
}

std::string EtcdTestServer::LogTail() const {
  std::ifstream in(dir_ + "/etcd.log");
  std::ostringstream text;
  text << in.rdbuf();
  std::string all = text.str();
  if (all.size() > 2000) all = all.substr(all.size() - 2000);
  return all.empty() ? std::string("(empty)") : all;
}

void EtcdTestServer::Stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  paused_ = false;
}

Status EtcdTestServer::Restart(std::chrono::milliseconds timeout) {
  Stop();
  return Launch(timeout);
}

void EtcdTestServer::Pause() {
  if (pid_ <= 0 || paused_) return;
  kill(pid_, SIGSTOP);
  // Returns once it is stopped, so that "paused" holds when the caller goes on.
  int status = 0;
  while (waitpid(pid_, &status, WUNTRACED) < 0 && errno == EINTR) {
  }
  paused_ = true;
}

void EtcdTestServer::Resume() {
  if (pid_ <= 0 || !paused_) return;
  kill(pid_, SIGCONT);
  int status = 0;
  while (waitpid(pid_, &status, WCONTINUED) < 0 && errno == EINTR) {
  }
  paused_ = false;
}

}  // namespace larder::etcd
