// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

// The master's HTTP endpoint for operators and monitoring:
//   GET /metrics          Prometheus text format
//   GET /health           "ok"
//   GET /segments         JSON array of mounted segments
//   GET /keys?prefix=P&limit=N   JSON array of {key, size}, sorted (default limit 1000, at most
//                         100000)
// /metrics and /health are open and name no keys. With a cluster token, /segments and /keys need
// the admin token as a bearer ("Authorization: Bearer TOKEN"; 401 without one, 403 for a wrong
// one, and always 403 when the master has no admin token).

#include <string>

namespace httplib {
class Server;
}

namespace larder::master {

class MasterState;

struct HttpAuth {
  bool required = false;    // the master has a cluster token
  std::string admin_token;  // empty: the admin routes are closed while `required`
};

void InstallHttpRoutes(httplib::Server& server, MasterState& state, HttpAuth auth);

}  // namespace larder::master
