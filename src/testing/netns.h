// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// A network namespace joined to this one by a veth pair: "another host" on one machine, for
// `larder-bench deployment` and its end-to-end test. Built with iproute2 (`ip netns add`,
// `ip link add ... type veth peer name ...`, `ip addr add`, `ip link set ... up`), so it needs
// root (CAP_NET_ADMIN and CAP_SYS_ADMIN).
//
// Names derive from this process's pid: namespace "larder-dep-<pid>", veths "ld<pid>a" (this
// namespace) and "ld<pid>b" (inside the namespace), and a /30 out of 10.231.0.0/16 chosen from the
// pid: host A (this namespace) is .1 of it, host B .2. When a name or the subnet is taken, the
// next suffix / subnet is tried. Creating one first removes what crashed runs left behind:
// namespaces "larder-dep-<pid>[-<n>]" whose pid no longer exists, and veths "ld<pid>a[<n>]" /
// "ld<pid>b[<n>]" of such pids.
//
// Thread safety: a NetworkNamespace is not shared between threads; the functions are thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "larder/status.h"

namespace larder::test {

// The path of the `ip` program (searched in PATH, then /usr/sbin, /sbin, /usr/bin, /bin), or "".
std::string IpProgram();

// OK when this process can create network namespaces here (root, `ip` present, `ip netns list`
// works); otherwise FailedPrecondition saying why.
Status NetnsUsable();

// A namespace and its veth pair, removed (namespace deleted, host-side veth deleted) on
// destruction.
class NetworkNamespace {
 public:
  // Removes leftovers of dead runs, then creates the namespace with loopback up and a veth pair
  // addressed and up on both ends. Errors: FailedPrecondition (NetnsUsable fails), Internal
  // naming the `ip` command and its output when one fails (what was created is removed again).
  static Result<std::unique_ptr<NetworkNamespace>> Create();
  ~NetworkNamespace();
  NetworkNamespace(const NetworkNamespace&) = delete;
  NetworkNamespace& operator=(const NetworkNamespace&) = delete;

  // "larder-dep-<pid>" (or with a "-<n>" suffix).
  const std::string& name() const { return name_; }
  // Address of the veth end in this namespace ("host A"), e.g. "10.231.18.5".
  const std::string& host_a_address() const { return address_a_; }
  // Address of the veth end inside the namespace ("host B"), e.g. "10.231.18.6".
  const std::string& host_b_address() const { return address_b_; }
  const std::string& host_a_veth() const { return veth_a_; }
  const std::string& host_b_veth() const { return veth_b_; }
  // argv prefix that runs a program inside the namespace: {ip, "netns", "exec", name}.
  std::vector<std::string> ExecPrefix() const;

 private:
  NetworkNamespace() = default;
  void Teardown();

  std::string ip_;
  std::string name_;
  std::string veth_a_;
  std::string veth_b_;
  std::string address_a_;
  std::string address_b_;
  bool created_namespace_ = false;
  bool created_veth_ = false;
};

// Deletes namespaces "larder-dep-<pid>[-<n>]" whose pid is not running and veths of such pids
// left in this namespace. Returns how many namespaces and links were removed. Errors: what `ip`
// reports when listing fails.
Result<int> RemoveStaleNamespaces();

// Deletes namespace `name` (and so the veth end inside it) and the host-side veths of its pid,
// ignoring what does not exist. For tests that must clean up after a killed bench.
void RemoveNamespacesOfPid(int pid);

}  // namespace larder::test
