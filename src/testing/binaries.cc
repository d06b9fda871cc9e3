// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "testing/binaries.h"

#include <cstdlib>

#include "common/child_process.h"

namespace larder::test {

std::string Bin(const std::string& name) {
  if (const char* dir = std::getenv("LARDER_BIN_DIR"); dir != nullptr && *dir != '\0') {
    return std::string(dir) + "/" + name;
  }
  const std::string self = SelfExecutable();
  const size_t slash = self.rfind('/');
  return (slash == std::string::npos ? std::string(".") : self.substr(0, slash)) + "/" + name;
}

}  // namespace larder::test
