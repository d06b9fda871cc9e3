// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "bench/common/json_commands.h"

#include <iostream>
#include <string>

namespace larder::bench {

using json = nlohmann::json;

void ServeJsonCommands(const std::function<json(const json&)>& handle) {
  std::string line;
  while (std::getline(std::cin, line)) {
    json command = json::parse(line, nullptr, /*allow_exceptions=*/false);
    json reply;
    if (!command.is_object()) {
      reply = {{"error", "a command is one JSON object per line"}};
    } else if (command.value("cmd", "") == "quit") {
      return;
    } else {
      try {
        reply = handle(command);
      } catch (const json::exception& e) {
        reply = {{"error", std::string("bad command: ") + e.what()}};
      }
    }
    if (!reply.is_null()) {
      std::cout << reply.dump(-1, ' ', false, json::error_handler_t::replace) << std::endl;
    }
  }
}

}  // namespace larder::bench
