// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

// The master's HTTP endpoint for operators and monitoring:
//   GET /metrics          Prometheus text format
//   GET /health           "ok"
//   GET /segments         JSON array of mounted segments
//   GET /keys?prefix=P&limit=N   JSON array of {key, size}, sorted (default limit 1000)

namespace httplib {
class Server;
}

namespace larder::master {

class MasterState;

void InstallHttpRoutes(httplib::Server& server, MasterState& state);

}  // namespace larder::master
