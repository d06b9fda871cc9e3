// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

#include "master/master_server.h"

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

}  // namespace larder::master
