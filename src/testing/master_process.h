// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// A larder-master child process, for the tests and benches that start, kill, pause and restart
// their master.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/child_process.h"
#include "larder/status.h"

namespace larder::test {

struct MasterProcess {
  ChildProcess process;
  std::string address;  // "127.0.0.1:PORT", as announced
  int http_port = -1;
  std::string port() const { return address.substr(address.rfind(':') + 1); }
};

// Starts `binary` (empty: Bin("larder-master")) on 127.0.0.1:`port` ("0": a
// free one) with an HTTP port of its own, watching its parent, plus `flags`; waits until it
// announces "READY <ip:port> <http port>".
Result<MasterProcess> SpawnMaster(const std::string& binary, const std::string& port,
                                  const std::vector<std::string>& flags,
                                  const std::map<std::string, std::string>& env);

}  // namespace larder::test
