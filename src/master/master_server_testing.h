// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

#include <span>
#include <string>
#include <utility>

#include "master/master_server.h"
#include "master/master_state.h"

namespace larder::master {

// A MasterServer's defaults for a test, except where it listens: loopback, with the gRPC and HTTP
// ports picked free (the default ports, 50051 and 9003, would collide between tests that ctest
// runs side by side).
inline MasterServerOptions LoopbackServerOptions() {
  MasterServerOptions options;
  options.listen_host = "127.0.0.1";
  options.port = 0;
  options.http_port = 0;
  return options;
}

// Mounts one segment for `client_id` on `host_id` in `state`; that mount's outcome.
inline auto MountOne(MasterState& state, const std::string& client_id, const std::string& host_id,
                     SegmentMount mount) {
  return std::move(state.MountSegments(client_id, host_id, std::span(&mount, 1))[0]);
}

}  // namespace larder::master
