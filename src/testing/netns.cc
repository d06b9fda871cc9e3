// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "testing/netns.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <set>
#include <sstream>

namespace larder::test {
namespace {

constexpr char kNamespacePrefix[] = "larder-dep-";
constexpr int kNameAttempts = 16;
constexpr uint32_t kSubnets = 16384;  // /30s in 10.231.0.0/16

struct CommandOutput {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs argv (no shell) and collects its output. Errors only when it cannot be started.
Result<CommandOutput> RunCommand(const std::vector<std::string>& argv) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return ErrnoToStatus(errno, "pipe");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    close(out[0]);
    close(out[1]);
    return ErrnoToStatus(err, "fork");
  }
  if (pid == 0) {
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    dup2(out[1], STDERR_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out[1]);
  CommandOutput result;
  char chunk[4096];
  for (;;) {
    ssize_t n = read(out[0], chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    result.output.append(chunk, static_cast<size_t>(n));
  }
  close(out[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

std::string Join(const std::vector<std::string>& argv) {
  std::string text;
  for (const auto& a : argv) text += (text.empty() ? "" : " ") + a;
  return text;
}

std::string Trim(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

// The output of an `ip` command that must succeed; Internal naming the command otherwise.
Result<std::string> IpOutput(const std::string& ip, std::vector<std::string> args) {
  args.insert(args.begin(), ip);
  LARDER_ASSIGN_OR_RETURN(CommandOutput out, RunCommand(args));
  if (out.exit_code != 0) {
    std::ostringstream message;
    message << "'" << Join(args) << "' failed (exit " << out.exit_code << "): " << Trim(out.output);
    return InternalError(message.str());
  }
  return out.output;
}

Status Ip(const std::string& ip, std::vector<std::string> args) {
  return IpOutput(ip, std::move(args)).status();
}

bool AllDigits(std::string_view text) {
  if (text.empty()) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

bool PidAlive(int pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

// The pid of a namespace named "larder-dep-<pid>[-<n>]", or -1.
int NamespacePid(std::string_view name) {
  if (name.substr(0, sizeof(kNamespacePrefix) - 1) != kNamespacePrefix) return -1;
  name.remove_prefix(sizeof(kNamespacePrefix) - 1);
  std::string_view pid = name.substr(0, name.find('-'));
  if (!AllDigits(pid) || pid.size() > 9) return -1;
  if (pid.size() < name.size() && !AllDigits(name.substr(pid.size() + 1))) return -1;
  return std::atoi(std::string(pid).c_str());
}

// The pid of a veth named "ld<pid>a[<n>]" or "ld<pid>b[<n>]", or -1.
int VethPid(std::string_view name) {
  if (name.substr(0, 2) != "ld") return -1;
  name.remove_prefix(2);
  size_t end = name.find_first_of("ab");
  if (end == std::string_view::npos) return -1;
  std::string_view pid = name.substr(0, end);
  std::string_view suffix = name.substr(end + 1);
  if (!AllDigits(pid) || pid.size() > 9 || (!suffix.empty() && !AllDigits(suffix))) return -1;
  return std::atoi(std::string(pid).c_str());
}

// First words of `ip netns list` lines.
Result<std::vector<std::string>> ListNamespaces(const std::string& ip) {
  LARDER_ASSIGN_OR_RETURN(std::string out, IpOutput(ip, {"netns", "list"}));
  std::vector<std::string> names;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::string name = line.substr(0, line.find(' '));
    if (!name.empty()) names.push_back(name);
  }
  return names;
}

// Link names of `ip -o link show` ("12: ld42a@if11: <...>" -> "ld42a").
Result<std::vector<std::string>> ListLinks(const std::string& ip) {
  LARDER_ASSIGN_OR_RETURN(std::string out, IpOutput(ip, {"-o", "link", "show"}));
  std::vector<std::string> names;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    size_t colon = line.find(": ");
    if (colon == std::string::npos) continue;
    std::string rest = line.substr(colon + 2);
    std::string name = rest.substr(0, rest.find_first_of("@:"));
    if (!name.empty()) names.push_back(name);
  }
  return names;
}

// "10.231.<hi>.<lo>" of the host (1 or 2) in subnet `index`.
std::string SubnetAddress(uint32_t index, uint32_t host) {
  uint32_t offset = index * 4 + host;
  return "10.231." + std::to_string(offset / 256) + "." + std::to_string(offset % 256);
}

}  // namespace

std::string IpProgram() {
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("PATH"); path != nullptr) {
    std::istringstream parts(path);
    for (std::string dir; std::getline(parts, dir, ':');) {
      if (!dir.empty()) dirs.push_back(dir);
    }
  }
  for (const char* dir : {"/usr/sbin", "/sbin", "/usr/bin", "/bin"}) dirs.push_back(dir);
  for (const auto& dir : dirs) {
    std::string candidate = dir + "/ip";
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

Status NetnsUsable() {
  if (geteuid() != 0) {
    return FailedPreconditionError("network namespaces need root (euid is " +
                                   std::to_string(geteuid()) + ")");
  }
  std::string ip = IpProgram();
  if (ip.empty()) return FailedPreconditionError("no `ip` program (install iproute2)");
  auto listed = RunCommand({ip, "netns", "list"});
  if (!listed.ok()) return FailedPreconditionError("cannot run ip: " + listed.status().ToString());
  if (listed->exit_code != 0) {
    return FailedPreconditionError("`ip netns list` failed: " + Trim(listed->output));
  }
  return Status::Ok();
}

Result<int> RemoveStaleNamespaces() {
  std::string ip = IpProgram();
  if (ip.empty()) return FailedPreconditionError("no `ip` program (install iproute2)");
  int removed = 0;
  LARDER_ASSIGN_OR_RETURN(std::vector<std::string> namespaces, ListNamespaces(ip));
  for (const auto& name : namespaces) {
    int pid = NamespacePid(name);
    if (pid < 0 || PidAlive(pid)) continue;
    if (Ip(ip, {"netns", "del", name}).ok()) ++removed;
  }
  LARDER_ASSIGN_OR_RETURN(std::vector<std::string> links, ListLinks(ip));
  for (const auto& name : links) {
    int pid = VethPid(name);
    if (pid < 0 || PidAlive(pid)) continue;
    if (Ip(ip, {"link", "del", name}).ok()) ++removed;
  }
  return removed;
}

void RemoveNamespacesOfPid(int pid) {
  std::string ip = IpProgram();
  if (ip.empty()) return;
  if (auto namespaces = ListNamespaces(ip); namespaces.ok()) {
    for (const auto& name : *namespaces) {
      if (NamespacePid(name) == pid) Ip(ip, {"netns", "del", name}).IgnoreError();
    }
  }
  if (auto links = ListLinks(ip); links.ok()) {
    for (const auto& name : *links) {
      if (VethPid(name) == pid) Ip(ip, {"link", "del", name}).IgnoreError();
    }
  }
}

Result<std::unique_ptr<NetworkNamespace>> NetworkNamespace::Create() {
  LARDER_RETURN_IF_ERROR(NetnsUsable());
  std::unique_ptr<NetworkNamespace> ns(new NetworkNamespace());
  ns->ip_ = IpProgram();
  // Best effort: a listing error shows up again below.
  if (auto removed = RemoveStaleNamespaces(); removed.ok() && *removed > 0) {
    std::cerr << "removed " << *removed << " network namespaces and veths left by dead runs\n";
  }

  LARDER_ASSIGN_OR_RETURN(std::vector<std::string> namespaces, ListNamespaces(ns->ip_));
  LARDER_ASSIGN_OR_RETURN(std::vector<std::string> links, ListLinks(ns->ip_));
  std::set<std::string> taken(namespaces.begin(), namespaces.end());
  taken.insert(links.begin(), links.end());
  const std::string pid = std::to_string(getpid());
  Status last = InternalError("no free namespace name");
  for (int attempt = 0; attempt < kNameAttempts && !ns->created_namespace_; ++attempt) {
    std::string suffix = attempt == 0 ? "" : std::to_string(attempt);
    std::string name = kNamespacePrefix + pid + (attempt == 0 ? "" : "-" + suffix);
    std::string veth_a = "ld" + pid + "a" + suffix;
    std::string veth_b = "ld" + pid + "b" + suffix;
    if (taken.count(name) || taken.count(veth_a) || taken.count(veth_b)) continue;
    last = Ip(ns->ip_, {"netns", "add", name});
    if (!last.ok()) continue;  // created by someone else meanwhile: next name
    ns->name_ = name;
    ns->veth_a_ = veth_a;
    ns->veth_b_ = veth_b;
    ns->created_namespace_ = true;
  }
  if (!ns->created_namespace_) return last;

  // A /30 that no address or route of this namespace uses yet.
  LARDER_ASSIGN_OR_RETURN(std::string addresses, IpOutput(ns->ip_, {"-o", "-4", "addr", "show"}));
  LARDER_ASSIGN_OR_RETURN(std::string routes, IpOutput(ns->ip_, {"-4", "route", "show"}));
  uint32_t start = static_cast<uint32_t>(getpid()) % kSubnets;
  bool found = false;
  for (uint32_t i = 0; i < kSubnets && !found; ++i) {
    uint32_t index = (start + i) % kSubnets;
    std::string network = SubnetAddress(index, 0) + "/30";
    bool used = routes.find(network) != std::string::npos;
    for (uint32_t host = 0; host < 4 && !used; ++host) {
      used = addresses.find("inet " + SubnetAddress(index, host) + "/") != std::string::npos;
    }
    if (used) continue;
    ns->address_a_ = SubnetAddress(index, 1);
    ns->address_b_ = SubnetAddress(index, 2);
    found = true;
  }
  if (!found) return InternalError("no free /30 in 10.231.0.0/16");

  ns->created_veth_ = true;  // from here on, Teardown also deletes the host-side veth
  for (const auto& step : std::vector<std::vector<std::string>>{
           {"link", "add", ns->veth_a_, "type", "veth", "peer", "name", ns->veth_b_},
           {"link", "set", ns->veth_b_, "netns", ns->name_},
           {"addr", "add", ns->address_a_ + "/30", "dev", ns->veth_a_},
           {"link", "set", ns->veth_a_, "up"},
           {"-n", ns->name_, "addr", "add", ns->address_b_ + "/30", "dev", ns->veth_b_},
           {"-n", ns->name_, "link", "set", ns->veth_b_, "up"},
           {"-n", ns->name_, "link", "set", "lo", "up"},
       }) {
    LARDER_RETURN_IF_ERROR(Ip(ns->ip_, step));  // ~NetworkNamespace removes what exists
  }
  return ns;
}

std::vector<std::string> NetworkNamespace::ExecPrefix() const {
  return {ip_, "netns", "exec", name_};
}

NetworkNamespace::~NetworkNamespace() { Teardown(); }

void NetworkNamespace::Teardown() {
  // Deleting the namespace destroys the veth end inside it, and with it its peer here; the
  // explicit delete covers a veth that never made it into the namespace.
  if (created_namespace_) Ip(ip_, {"netns", "del", name_}).IgnoreError();
  if (created_veth_) {
    if (auto links = ListLinks(ip_); links.ok()) {
      for (const auto& link : *links) {
        if (link == veth_a_ || link == veth_b_) Ip(ip_, {"link", "del", link}).IgnoreError();
      }
    }
  }
  created_namespace_ = created_veth_ = false;
}

}  // namespace larder::test
