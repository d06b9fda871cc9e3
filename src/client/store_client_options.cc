// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// StoreClientOptions from the environment, and what a store client derives from its options: how
// it reaches the master, and its engine's options.
#include <algorithm>
#include <cstdlib>

#include "client/store_pieces.h"
#include "common/env.h"
#include "larder/store_client.h"

namespace larder {

Status RemoveScope::Validate() const {
  constexpr auto kMaxUnusedFor = std::chrono::hours(24);
  if (unused_for.count() < 0 || unused_for > kMaxUnusedFor) {
    return InvalidArgumentError(
        "unused_for of " + std::to_string(unused_for.count()) + " ms is outside 0.." +
        std::to_string(std::chrono::milliseconds(kMaxUnusedFor).count()) + " ms");
  }
  return Status::Ok();
}

Result<StoreClientOptions> StoreClientOptions::FromEnvironment() {
  StoreClientOptions options;
  auto set_string = [](const char* name, std::string* field) {
    std::string value = GetEnv(name);
    if (!value.empty()) *field = value;
  };
  set_string("LARDER_MASTER", &options.master_address);
  set_string("LARDER_LOCAL_HOSTNAME", &options.local_hostname);
  set_string("LARDER_SEGMENT_NAME", &options.segment_name);
  set_string("LARDER_AUTH_TOKEN", &options.auth_token);
  set_string("LARDER_ADMIN_TOKEN", &options.admin_token);
  set_string("LARDER_TLS_CA", &options.tls_ca_file);
  set_string("LARDER_TLS_CERT", &options.tls_cert_file);
  set_string("LARDER_TLS_KEY", &options.tls_key_file);
  set_string("LARDER_HOST_ID", &options.host_id);
  set_string("LARDER_TENANT", &options.tenant_id);
  set_string("LARDER_DISK_PATH", &options.disk_path);
  set_string("LARDER_DISK_CAPACITY", &options.disk_capacity);
  for (auto [name, field] : {std::pair{"LARDER_GLOBAL_SEGMENT_SIZE", &options.global_segment_size},
                             std::pair{"LARDER_LOCAL_BUFFER_SIZE", &options.local_buffer_size}}) {
    std::string value = GetEnv(name);
    if (value.empty()) continue;
    auto parsed = ParseByteSize(value, /*allow_zero=*/true);
    if (!parsed.ok()) return parsed.status().WithContext(name);
    *field = *parsed;
  }
  if (std::string value = GetEnv("LARDER_SPARSE_SEGMENT"); !value.empty()) {
    if (value != "0" && value != "1") {
      return InvalidArgumentError("LARDER_SPARSE_SEGMENT: '" + value + "' is not 0 or 1");
    }
    options.sparse_segment = value == "1";
  }
  if (std::string value = GetEnv("LARDER_LEASE_RELEASE_DELAY"); !value.empty()) {
    auto parsed = ParseDuration(value);
    if (!parsed.ok()) return parsed.status().WithContext("LARDER_LEASE_RELEASE_DELAY");
    options.lease_release_delay = *parsed;
  }
  if (std::string value = GetEnv("LARDER_MASTER_CONNECT_TIMEOUT"); !value.empty()) {
    auto parsed = ParseDuration(value);
    if (!parsed.ok()) return parsed.status().WithContext("LARDER_MASTER_CONNECT_TIMEOUT");
    options.master_connect_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(*parsed);
  }
  if (std::string value = GetEnv("LARDER_REPLICA_NUM"); !value.empty()) {
    char* end = nullptr;
    unsigned long n = std::strtoul(value.c_str(), &end, 10);
    if (end == value.c_str() || *end != '\0' || n == 0 || n > 64) {
      return InvalidArgumentError("LARDER_REPLICA_NUM: '" + value + "' is not a number in 1..64");
    }
    options.replica_num = static_cast<uint32_t>(n);
  }
  return options;
}

namespace client {

MasterClientOptions MasterOptionsFor(const StoreClientOptions& options,
                                     const TransferEngine& engine) {
  auto option_or_env = [](const std::string& option, const char* variable) {
    return option.empty() ? GetEnv(variable) : option;
  };
  MasterClientOptions out;
  out.address = options.master_address;
  out.timeout = options.rpc_timeout;
  out.client_id = engine.id();
  out.engine = &engine;
  out.auth_token = option_or_env(options.auth_token, "LARDER_AUTH_TOKEN");
  out.admin_token = option_or_env(options.admin_token, "LARDER_ADMIN_TOKEN");
  out.tls_ca_file = option_or_env(options.tls_ca_file, "LARDER_TLS_CA");
  return out;
}

TransferEngineOptions StoreEngineOptions(const StoreClientOptions& options) {
  TransferEngineOptions engine_options;
  engine_options.role = EngineRole::kStore;
  engine_options.protocol = options.protocol;
  // "ip" listens on a free port; "ip:port" (one colon: not a bare IPv6 address) on that port.
  const bool has_port =
      std::count(options.local_hostname.begin(), options.local_hostname.end(), ':') == 1;
  engine_options.listen_address = has_port ? options.local_hostname : options.local_hostname + ":0";
  engine_options.auth_token = options.auth_token;
  engine_options.tls_ca_file = options.tls_ca_file;
  engine_options.tls_cert_file = options.tls_cert_file;
  engine_options.tls_key_file = options.tls_key_file;
  engine_options.host_id = options.host_id;
  engine_options.huge_pages = options.huge_pages;
  engine_options.default_timeout = options.transfer_timeout;
  return engine_options;
}

}  // namespace client
}  // namespace larder
