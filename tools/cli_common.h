// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// What the larder-master and larder-client mains share: flag validators, token files, and the
// life of a service process (its log level, and waiting for SIGTERM, SIGINT or, with
// --parent-watch, the end of stdin).
#pragma once

#include <CLI/CLI.hpp>
#include <cstddef>
#include <string>

#include "larder/status.h"

namespace larder::cli {

// Validators of flags that ParseByteSize (zero allowed) and ParseDuration read.
CLI::Validator ByteSize();
CLI::Validator Duration();

// --auth-token-file and --admin-token-file: the files holding the cluster token and the operator
// token.
struct TokenFlags {
  std::string auth_token_file;   // empty: not given
  std::string admin_token_file;  // empty: not given
};

// Adds the TokenFlags options (existing files only) to `app`, with these help texts. `flags`
// outlives parsing.
void AddTokenFlags(CLI::App* app, TokenFlags* flags, const std::string& auth_help,
                   const std::string& admin_help);

// Reads the token of each given file (its content without trailing newlines and spaces) into
// `auth_token` and `admin_token`; those of files not given stay as they are.
// Errors: InvalidArgument naming the file when it cannot be read or its token has fewer than
// `min_bytes` bytes (REQUIRES: min_bytes >= 1).
Status ReadTokens(const TokenFlags& flags, size_t min_bytes, std::string* auth_token,
                  std::string* admin_token);

// --log-level and --parent-watch of a service.
struct ServiceFlags {
  std::string log_level;      // empty: LARDER_LOG_LEVEL decides
  bool parent_watch = false;  // also exit when stdin closes
};

// Adds the ServiceFlags options to `app`; `service` names the process in their help ("daemon",
// "master"). `flags` outlives parsing.
void AddServiceFlags(CLI::App* app, ServiceFlags* flags, const std::string& service);

// Applies --log-level, when given. Call after parsing.
void ApplyLogLevel(const ServiceFlags& flags);

// Returns on SIGTERM or SIGINT, or with --parent-watch also when stdin closes.
// REQUIRES: bench::BlockTerminationSignals() ran first, before any thread started.
void WaitForShutdown(const ServiceFlags& flags);

}  // namespace larder::cli
