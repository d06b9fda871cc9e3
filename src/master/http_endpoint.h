// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

// The master's HTTP endpoint for operators and monitoring:
//   GET /                 the status page (status_page.h), which reads the /api routes
//   GET /api/summary      JSON: version, role, objects, bytes, clients, hit rate, ops/s, ...
//   GET /api/history      JSON {"points":[...]}: rates per sampling interval (status_history.h)
//   GET /api/segments     JSON {"segments":[...]}: each with its owner and the bytes moved with
//                         the owner's engine, by route
//   GET /api/clients      JSON {"clients":[...]}: each with its last heartbeat and routes
//                         (every field: docs/operations.md)
//   POST /api/remove      JSON body {"prefix": P, "force": false}: removes every complete object
//                         whose key starts with P (MasterState::RemoveByPrefix); answers
//                         {"prefix", "removed", "skipped_leased"}; 415 unless the body is
//                         application/json, 400 for another shape
//   GET /metrics          Prometheus text format
//   GET /health           "ok" (a master without etcd); with etcd JSON {"status":"ok","role":R},
//                         R "leader" or "standby", or 503 {"status":"unavailable","role":R}
//                         once it no longer serves (R "fenced" or "stopped")
//   GET /segments         JSON array of mounted segments
//   GET /keys?prefix=P&limit=N   JSON array of {key, size}, sorted (default limit 1000, at most
//                         100000)
// and the routes of Mooncake's master, in its formats, for its tools:
//   GET /get_all_segments        each segment name and "\n"
//   GET /get_all_keys            each complete key and "\n", sorted, at most 100000; bytes that
//                                are not printable ASCII, and backslash, as \xNN
//   GET /query_key?key=K         one JSON line per replica: {"size_", "buffer_address_" (segment
//                                base + offset), "protocol_" ("tcp"), "transport_endpoint_" (the
//                                segment's tcp endpoint, or its name)}; 404 OBJECT_NOT_FOUND
//   GET /batch_query_keys?keys=K1,K2   {"success":true,"data":{K:{"ok":true,"values":[...]} or
//                                {"ok":false,"error":"OBJECT_NOT_FOUND"}}}; at most 1024 keys
//   GET /query_segment?segment=S "S\nUsed(bytes): U\nCapacity(bytes) : C\n"; 500 when unknown
// /, /metrics, /health, /api/summary and /api/history are open and name no keys or clients.
// With a cluster token, every other route needs
// the admin token as a bearer ("Authorization: Bearer TOKEN"; 401 without one, 403 for a wrong
// one, and always 403 when the master has no admin token).

#include <functional>
#include <string>

namespace httplib {
class Server;
}

namespace larder::master {

class MasterState;
class StatusHistory;

struct HttpAuth {
  bool required = false;    // the master has a cluster token
  std::string admin_token;  // empty: the admin routes are closed while `required`
};

// `role` (when set) names the master's role in /health (MasterServer::role()); thread-safe.
// `history` (when set, outliving the server) feeds /api/history and the rates of /api/summary.
void InstallHttpRoutes(httplib::Server& server, MasterState& state, HttpAuth auth,
                       std::function<std::string()> role = {},
                       const StatusHistory* history = nullptr);

}  // namespace larder::master
