// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "testing/master_process.h"

#include <chrono>
#include <cstdlib>

#include "testing/binaries.h"

namespace larder::test {

Result<MasterProcess> SpawnMaster(const std::string& binary, const std::string& port,
                                  const std::vector<std::string>& flags,
                                  const std::map<std::string, std::string>& env) {
  const std::string path = binary.empty() ? Bin("larder-master") : binary;
  std::vector<std::string> argv = {path, "--host",      "127.0.0.1", "--port",
                                   port, "--http-port", "0",         "--parent-watch"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  LARDER_ASSIGN_OR_RETURN(ChildProcess child,
                          ChildProcess::Spawn(argv, env, std::chrono::seconds(60)));
  const std::string& announced = child.address();
  size_t space = announced.find(' ');
  if (space == std::string::npos) {
    return InternalError("larder-master announced '" + announced + "' (no HTTP port)");
  }
  MasterProcess master;
  master.address = announced.substr(0, space);
  master.http_port = std::atoi(announced.c_str() + space + 1);
  master.process = std::move(child);
  return master;
}

}  // namespace larder::test
