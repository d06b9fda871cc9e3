// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

// The status page larder-master serves at / (plain HTML, CSS and JavaScript in the binary, no
// outside resources): a summary, charts of the last minutes and tables of the segments and
// clients, refreshed every 2 s from /api/summary, /api/history, /api/segments and /api/clients
// (http_endpoint.h). On a master with a cluster token the page asks for the admin token, keeps it
// in the tab's sessionStorage and sends it as a bearer to the two admin routes. Every figure it
// shows sits in an element with an id (summary) or a data-field attribute (table cells), so that
// a test can compare the page with the JSON it came from.

#include <string_view>

namespace larder::master {

std::string_view StatusPageHtml();

}  // namespace larder::master
