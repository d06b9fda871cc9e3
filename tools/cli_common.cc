// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "cli_common.h"

#include <signal.h>

#include <fstream>
#include <sstream>
#include <utility>

#include "common/child_process.h"
#include "common/env.h"
#include "common/logging.h"

namespace larder::cli {
namespace {

Result<std::string> ReadTokenFile(const std::string& path, size_t min_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgumentError("cannot read token file " + path);
  std::ostringstream text;
  text << in.rdbuf();
  std::string token = text.str();
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) {
    token.pop_back();
  }
  if (token.size() >= min_bytes) return token;
  if (min_bytes <= 1) return InvalidArgumentError("token file " + path + " is empty");
  return InvalidArgumentError("token file " + path + " holds fewer than " +
                              std::to_string(min_bytes) +
                              " bytes; use a long random secret (e.g. `openssl rand -hex 32`)");
}

}  // namespace

CLI::Validator ByteSize() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        auto parsed = ParseByteSize(value, /*allow_zero=*/true);
        return parsed.ok() ? "" : parsed.status().message();
      },
      "SIZE", "byte size (64MiB, 4gb)");
}

CLI::Validator Duration() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        auto parsed = ParseDuration(value);
        return parsed.ok() ? "" : parsed.status().message();
      },
      "DURATION", "duration (500ms, 5s, 2m)");
}

void AddTokenFlags(CLI::App* app, TokenFlags* flags, const std::string& auth_help,
                   const std::string& admin_help) {
  app->add_option("--auth-token-file", flags->auth_token_file, auth_help)->check(CLI::ExistingFile);
  app->add_option("--admin-token-file", flags->admin_token_file, admin_help)
      ->check(CLI::ExistingFile);
}

Status ReadTokens(const TokenFlags& flags, size_t min_bytes, std::string* auth_token,
                  std::string* admin_token) {
  for (auto [path, token] : {std::pair{&flags.auth_token_file, auth_token},
                             std::pair{&flags.admin_token_file, admin_token}}) {
    if (path->empty()) continue;
    LARDER_ASSIGN_OR_RETURN(*token, ReadTokenFile(*path, min_bytes));
  }
  return Status::Ok();
}

void AddServiceFlags(CLI::App* app, ServiceFlags* flags, const std::string& service) {
  app->add_option("--log-level", flags->log_level,
                  "trace, debug, info, warn, error, critical or off (LARDER_LOG_LEVEL)")
      ->check(
          CLI::IsMember({"trace", "debug", "info", "warn", "warning", "error", "critical", "off"},
                        CLI::ignore_case));
  app->add_flag(
      "--parent-watch", flags->parent_watch,
      "also exit when stdin closes (for tools and supervisors that spawn the " + service + ")");
}

void ApplyLogLevel(const ServiceFlags& flags) {
  if (!flags.log_level.empty()) SetLogLevel(flags.log_level);
}

void WaitForShutdown(const ServiceFlags& flags) {
  if (flags.parent_watch) {
    WaitForParentOrSignal();
    return;
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  int signal = 0;
  sigwait(&set, &signal);
}

}  // namespace larder::cli
