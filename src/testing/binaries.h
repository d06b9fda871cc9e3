// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Where the project's binaries are, for tests and benches that start them as processes.
#pragma once

#include <string>

namespace larder::test {

// The path of binary `name` (e.g. "larder-master"): in $LARDER_BIN_DIR when it is set (ctest
// sets it to the build's bin folder), else in the folder of the running executable.
std::string Bin(const std::string& name);

}  // namespace larder::test
