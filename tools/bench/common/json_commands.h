// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The command loop of every benchmark worker: its parent writes one JSON object per line on the
// worker's stdin, and reads the replies on its stdout.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>

namespace larder::bench {

// Serves commands until stdin closes or a {"cmd": "quit"} arrives. `handle` answers each one; a
// reply that is not null is written as one line on stdout (a null reply writes nothing, for
// workers that report on their own schedule). A line that is not a JSON object, and a command that
// `handle` rejects with a json::exception (a missing or mistyped field), are answered
// {"error": ...}.
void ServeJsonCommands(const std::function<nlohmann::json(const nlohmann::json&)>& handle);

}  // namespace larder::bench
