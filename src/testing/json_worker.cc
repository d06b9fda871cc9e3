// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "testing/json_worker.h"

#include <string>

namespace larder::test {

Result<nlohmann::json> Exchange(ChildProcess& worker, const nlohmann::json& command,
                                std::chrono::milliseconds timeout) {
  LARDER_RETURN_IF_ERROR(worker.WriteLine(command.dump()));
  LARDER_ASSIGN_OR_RETURN(std::string line, worker.ReadLine(timeout));
  nlohmann::json reply = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!reply.is_object()) return InvalidArgumentError("a worker replied '" + line + "'");
  reply.erase("lat_us");
  return reply;
}

}  // namespace larder::test
