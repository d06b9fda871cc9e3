// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// larder-ctl: the operator's command line over a running cluster. What the master knows comes
// from its HTTP port (the /api routes of docs/operations.md, and /keys); object bytes (get) come
// through a store client, as any reader's do.
#include <httplib.h>
#include <unistd.h>

#include <chrono>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "cli_common.h"
#include "common/env.h"
#include "common/logging.h"
#include "larder/store_client.h"
#include "larder/version.h"

namespace {

using json = nlohmann::ordered_json;

// Settings every command shares.
struct Global {
  std::string master;  // gRPC host:port (get)
  std::string http;    // HTTP host:port (everything else)
  std::string timeout = "10s";
  bool json = false;
  larder::cli::TokenFlags tokens;
  std::string auth_token;
  std::string admin_token;
};

// An error for the operator: printed as "larder-ctl: ..." with exit status 1.
struct Failure {
  std::string message;
};

// As the status page writes sizes.
std::string Bytes(double n) { return larder::FormatReadableBytes(n); }

std::string Fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", digits, value);
  return text;
}

// A key as a terminal can show it: bytes that are not printable ASCII, and '\', as \xNN (a
// tenant's key shows as \x00tenant\x00key), as the master's /get_all_keys writes them.
std::string Printable(const std::string& key) {
  // A key may be up to the master's --max-key-size (kilobytes): messages show its start.
  constexpr size_t kShown = 96;
  std::string out;
  for (unsigned char c : key) {
    if (out.size() >= kShown) {
      out += "... (" + std::to_string(key.size()) + " bytes)";
      break;
    }
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    }
  }
  return out;
}

// "host:port" split; the port is required.
std::pair<std::string, int> HostPort(const std::string& address, const char* what) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon != std::string::npos && colon + 1 < address.size()) {
    try {
      port = std::stoi(address.substr(colon + 1));
    } catch (const std::exception&) {
      port = 0;
    }
  }
  if (colon == std::string::npos || colon == 0 || port <= 0 || port > 65535) {
    throw Failure{std::string(what) + " '" + address + "' is not HOST:PORT"};
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return {host, port};
}

class Http {
 public:
  explicit Http(const Global& global) : global_(global) {
    auto [host, port] = HostPort(global.http, "--http");
    client_ = std::make_unique<httplib::Client>(host, port);
    const auto timeout = *larder::ParseDuration(global.timeout);
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(timeout);
    const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(timeout - seconds);
    client_->set_connection_timeout(seconds.count(), micros.count());
    client_->set_read_timeout(seconds.count(), micros.count());
    client_->set_write_timeout(seconds.count(), micros.count());
    if (!global.admin_token.empty()) client_->set_bearer_token_auth(global.admin_token);
  }

  json Get(const std::string& path) { return Check(client_->Get(path), "GET " + path); }
  json Post(const std::string& path, const json& body) {
    return Check(client_->Post(path, body.dump(), "application/json"), "POST " + path);
  }

 private:
  json Check(const httplib::Result& result, const std::string& what) {
    if (!result) {
      throw Failure{"cannot reach larder-master's HTTP port at " + global_.http + " (" + what +
                    "): " + httplib::to_string(result.error()) +
                    "; give it with --http HOST:PORT or LARDER_MASTER_HTTP"};
    }
    if (result->status == 401) {
      throw Failure{"the master has a cluster token and " + what +
                    " needs the admin token: --admin-token-file FILE or LARDER_ADMIN_TOKEN"};
    }
    if (result->status == 403) {
      throw Failure{"the master refused the admin token for " + what + ": " + Trim(result->body)};
    }
    if (result->status != 200) {
      throw Failure{what + ": HTTP " + std::to_string(result->status) + ": " + Trim(result->body)};
    }
    json body = json::parse(result->body, nullptr, false);
    if (body.is_discarded()) throw Failure{what + ": the master's answer is not JSON"};
    return body;
  }
  static std::string Trim(std::string text) {
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    return text;
  }

  const Global& global_;
  std::unique_ptr<httplib::Client> client_;
};

void PrintJson(const json& value) { std::cout << value.dump(2) << "\n"; }

// Columns padded to their widest cell; numbers to the right.
void PrintTable(const std::vector<std::string>& header,
                const std::vector<std::vector<std::string>>& rows, const std::vector<bool>& right) {
  std::vector<size_t> width(header.size());
  for (size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (size_t c = 0; c < cells.size(); ++c) {
      const std::string pad(width[c] - cells[c].size(), ' ');
      const bool last = c + 1 == cells.size();
      out += right[c] ? pad + cells[c] : cells[c] + (last ? "" : pad);
      if (!last) out += "  ";
    }
    std::cout << out << "\n";
  };
  line(header);
  for (const auto& row : rows) line(row);
}

std::string Routes(const json& routes) {
  std::string out;
  for (const auto& [route, figures] : routes.items()) {
    if (!out.empty()) out += ", ";
    out += route + " " + Bytes(figures.value("bytes", 0.0));
    if (figures.value("failures", 0) > 0) {
      out += " (" + std::to_string(figures["failures"].get<uint64_t>()) + " failed)";
    }
  }
  return out.empty() ? "-" : out;
}

int ShowStatus(const Global& global) {
  json s = Http(global).Get("/api/summary");
  if (global.json) {
    PrintJson(s);
    return 0;
  }
  const double used = s.value("bytes_used", 0.0), capacity = s.value("bytes_capacity", 0.0);
  std::cout << "larder-master " << global.http << ": version " << s.value("version", "?")
            << ", role " << s.value("role", "?") << ", incarnation "
            << s.value("incarnation", std::string("?")) << "\n";
  std::cout << "objects         " << s.value("objects", uint64_t{0}) << "\n";
  std::cout << "bytes used      " << Bytes(used) << " of " << Bytes(capacity)
            << (capacity > 0 ? " (" + Fixed(100 * used / capacity, 1) + "%)" : "") << "\n";
  auto percent = [&s](const char* field) {
    return s[field].is_number() ? Fixed(100 * s[field].get<double>(), 1) + "%" : std::string("-");
  };
  // The hit rate the serving engines see: their lookups' where they look up first.
  std::cout << "hit rate        " << percent("hit_rate") << " (lookups "
            << percent("lookup_hit_rate") << " of " << s.value("lookups", uint64_t{0}) << ", gets "
            << percent("get_hit_rate") << " of " << s.value("gets", uint64_t{0}) << ")\n";
  std::cout << "ops/s           " << Fixed(s.value("ops_per_s", 0.0), 1) << "\n";
  std::cout << "evictions       " << s.value("evictions", uint64_t{0}) << " ("
            << Fixed(s.value("evictions_per_s", 0.0), 1) << "/s)\n";
  std::cout << "lease expiries  " << s.value("lease_expiries", uint64_t{0}) << " ("
            << s.value("leases_active", uint64_t{0}) << " leases held now)\n";
  std::cout << "clients         " << s.value("clients", uint64_t{0}) << " ("
            << s.value("client_expiries", uint64_t{0}) << " expired since the start), segments "
            << s.value("segments", uint64_t{0}) << "\n";
  if (const json& disk = s.value("disk", json::object()); disk.value("holders", 0) > 0) {
    std::cout << "disk tier       " << disk.value("holders_online", uint64_t{0}) << " of "
              << disk.value("holders", uint64_t{0}) << " holders online, "
              << disk.value("copies", uint64_t{0}) << " copies ("
              << Bytes(disk.value("copy_bytes", 0.0)) << "), disks "
              << Bytes(disk.value("used_bytes", 0.0)) << " of "
              << Bytes(disk.value("capacity_bytes", 0.0)) << "\n";
    std::cout << "disk work       " << disk.value("demoted", uint64_t{0}) << " demoted ("
              << disk.value("demote_failed", uint64_t{0}) << " failed, "
              << disk.value("queue_full", uint64_t{0}) << " left to eviction), "
              << disk.value("disk_hits", uint64_t{0}) << " disk hits, "
              << disk.value("promotions", uint64_t{0}) << " promotions (p50 "
              << disk.value("promotion_p50_ms", 0.0) << " ms, p99 "
              << disk.value("promotion_p99_ms", 0.0) << " ms)\n";
  }
  return 0;
}

int Segments(const Global& global) {
  json list = Http(global).Get("/api/segments")["segments"];
  if (global.json) {
    PrintJson(list);
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const json& s : list) {
    const double size = s.value("size", 0.0), used = s.value("used", 0.0);
    rows.push_back({s.value("name", "") + (s.value("draining", false) ? " (draining)" : ""),
                    s.value("owner", ""), s.value("host_id", ""), Bytes(size),
                    Bytes(used) + (size > 0 ? " (" + Fixed(100 * used / size, 0) + "%)" : ""),
                    std::to_string(s.value("objects", uint64_t{0})),
                    Bytes(s.value("page_size", 0.0)), Routes(s.value("routes_to_owner", json{}))});
  }
  PrintTable({"SEGMENT", "OWNER", "HOST", "SIZE", "USED", "OBJECTS", "PAGE", "TO OWNER"}, rows,
             {false, false, false, true, true, true, true, false});
  return 0;
}

int Clients(const Global& global) {
  json list = Http(global).Get("/api/clients")["clients"];
  if (global.json) {
    PrintJson(list);
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const json& c : list) {
    rows.push_back({c.value("client_id", ""), c.value("host_id", ""),
                    std::to_string(c.value("pid", int64_t{0})),
                    c.value("alive", true) ? "yes" : "no (expired)",
                    Fixed(c.value("last_heartbeat_ms_ago", 0.0) / 1000, 1) + " s ago",
                    std::to_string(c.value("segments", uint64_t{0})),
                    Routes(c.value("routes", json{}))});
  }
  PrintTable({"CLIENT", "HOST", "PID", "ALIVE", "HEARTBEAT", "SEGMENTS", "MOVED"}, rows,
             {false, false, true, false, true, true, false});
  return 0;
}

json ListKeys(const Global& global, const std::string& prefix, size_t limit) {
  return Http(global).Get("/keys?" + httplib::detail::params_to_query_str(
                                         {{"prefix", prefix}, {"limit", std::to_string(limit)}}));
}

int Keys(const Global& global, const std::string& prefix, size_t limit) {
  json keys = ListKeys(global, prefix, limit);
  if (global.json) {
    PrintJson(keys);
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const json& k : keys) {
    rows.push_back({Printable(k.value("key", "")), std::to_string(k.value("size", uint64_t{0}))});
  }
  PrintTable({"KEY", "BYTES"}, rows, {false, true});
  if (keys.size() == limit) {
    std::cerr << "larder-ctl: the first " << limit << " keys; --limit N lists more\n";
  }
  return 0;
}

// A store client that contributes no memory: it reads and writes through other processes'
// segments. `tenant`: the key namespace it works in ("" is the default tenant).
std::unique_ptr<larder::StoreClient> OpenClient(const Global& global, const std::string& tenant) {
  auto options = larder::StoreClientOptions::FromEnvironment();
  if (!options.ok()) throw Failure{options.status().ToString()};
  options->master_address = global.master;
  options->global_segment_size = 0;
  options->tenant_id = tenant;
  options->master_connect_timeout = *larder::ParseDuration(global.timeout);
  options->rpc_timeout = options->master_connect_timeout;
  if (!global.auth_token.empty()) options->auth_token = global.auth_token;
  auto client = larder::StoreClient::Create(*options);
  if (!client.ok())
    throw Failure{"joining the cluster at " + global.master + ": " + client.status().ToString()};
  return std::move(*client);
}

int GetKey(const Global& global, const std::string& key, const std::string& output) {
  if (output.empty() && isatty(STDOUT_FILENO)) {
    throw Failure{"the value's bytes would go to a terminal: redirect stdout or give -o FILE"};
  }
  if (output.empty() && global.json) {
    throw Failure{"--json prints what was read, so the bytes need -o FILE"};
  }
  auto client = OpenClient(global, "");
  auto value = client->Get(key);
  if (!value.ok()) {
    throw Failure{"get '" + Printable(key) + "': " + value.status().ToString()};
  }
  if (output.empty()) {
    std::cout.write(value->data(), static_cast<std::streamsize>(value->size()));
    std::cout.flush();
    if (!std::cout) throw Failure{"writing to stdout failed"};
  } else {
    std::ofstream file(output, std::ios::binary | std::ios::trunc);
    file.write(value->data(), static_cast<std::streamsize>(value->size()));
    file.close();
    if (!file) throw Failure{"writing " + output + " failed"};
  }
  if (global.json) {
    PrintJson({{"key", key}, {"size", value->size()}, {"file", output}});
  } else if (!output.empty()) {
    std::cerr << "larder-ctl: " << value->size() << " bytes of '" << Printable(key)
              << "' written to " << output << "\n";
  }
  return 0;
}

int Remove(const Global& global, const std::string& prefix, bool yes, bool force) {
  if (prefix.empty()) {
    throw Failure{"remove needs a non-empty --prefix (every key starts with the empty one)"};
  }
  if (!yes) {
    constexpr size_t kShown = 5;
    json keys = ListKeys(global, prefix, 100000);
    if (keys.empty()) {
      std::cerr << "larder-ctl: no key starts with '" << Printable(prefix) << "'\n";
      if (global.json) PrintJson({{"prefix", prefix}, {"removed", 0}, {"skipped_leased", 0}});
      return 0;
    }
    if (!isatty(STDIN_FILENO)) {
      throw Failure{std::to_string(keys.size()) + (keys.size() == 100000 ? " or more" : "") +
                    " keys start with '" + Printable(prefix) +
                    "': confirm with --yes (stdin is not a terminal to ask on)"};
    }
    std::cerr << keys.size() << (keys.size() == 100000 ? " or more" : "") << " keys start with '"
              << Printable(prefix) << "', e.g.\n";
    for (size_t i = 0; i < std::min(kShown, keys.size()); ++i) {
      std::cerr << "  " << Printable(keys[i].value("key", "")) << "\n";
    }
    std::cerr << "Remove them" << (force ? ", leased ones too" : "") << "? [y/N] ";
    std::string answer;
    std::getline(std::cin, answer);
    if (answer != "y" && answer != "Y" && answer != "yes") {
      std::cerr << "larder-ctl: nothing removed\n";
      return 1;
    }
  }
  json reply = Http(global).Post("/api/remove", {{"prefix", prefix}, {"force", force}});
  if (global.json) {
    PrintJson(reply);
    return 0;
  }
  std::cout << "removed " << reply.value("removed", uint64_t{0}) << " objects";
  if (const uint64_t leased = reply.value("skipped_leased", uint64_t{0}); leased > 0) {
    std::cout << "; " << leased << " held by readers were left (--force removes them too)";
  }
  std::cout << "\n";
  return 0;
}

// The tenant, and the key a client of that tenant uses, of a key as the master stores it: "\0" T
// "\0" key for tenant T, "\0\0" key for a default-tenant key that starts with '\0' (see
// master/types.h).
std::pair<std::string, std::string> SplitTenant(const std::string& stored) {
  if (stored.empty() || stored[0] != '\0') return {"", stored};
  const size_t end = stored.find('\0', 1);
  if (end == std::string::npos) return {"", stored};
  return {stored.substr(1, end - 1), stored.substr(end + 1)};
}

std::string FromHex(const std::string& hex) {
  if (hex.size() % 2 != 0) throw Failure{"the master sent a key_hex of odd length"};
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    unsigned value = 0;
    if (std::sscanf(hex.c_str() + 2 * i, "%2x", &value) != 1) {
      throw Failure{"the master sent a key_hex that is not hex"};
    }
    out[i] = static_cast<char>(value);
  }
  return out;
}

struct DrainFlags {
  bool undo = false;
  bool keep = false;  // migrate, but drop nothing
  bool yes = false;
  bool force = false;
  size_t limit = 100000;
  uint64_t migrate_bytes = 0;  // 0: as much as finds room
};

// Marks the segment draining (no put places anything there any more), copies its objects, the
// most recently used first, to other segments (a get and an upsert each: pins and soft pins
// stay), until --migrate-bytes are moved or the other segments are full, and then drops what is
// left on it, so that its owner can leave without taking the cache's hot part along.
int Drain(const Global& global, const std::string& segment, const DrainFlags& flags) {
  Http http(global);
  if (flags.undo) {
    json reply = http.Post("/api/drain", {{"segment", segment}, {"draining", false}});
    if (global.json) {
      PrintJson(reply);
    } else {
      std::cout << "segment " << segment << " takes new objects again\n";
    }
    return 0;
  }
  if (!flags.yes && !flags.keep) {
    if (!isatty(STDIN_FILENO)) {
      throw Failure{"drain drops what it does not move off " + segment +
                    ": confirm with --yes (stdin is not a terminal to ask on), or --keep"};
    }
    std::cerr << "Drain " << segment
              << ": move its most used objects elsewhere and drop the rest? [y/N] ";
    std::string answer;
    std::getline(std::cin, answer);
    if (answer != "y" && answer != "Y" && answer != "yes") {
      std::cerr << "larder-ctl: nothing changed\n";
      return 1;
    }
  }
  json marked = http.Post("/api/drain", {{"segment", segment}, {"draining", true}});
  json listing = http.Get("/api/segment_objects?" +
                          httplib::detail::params_to_query_str(
                              {{"segment", segment}, {"limit", std::to_string(flags.limit)}}));
  const json& objects = listing.at("objects");
  // Progress on stderr (stdout has the result, or the JSON): what is to move, then a line at
  // most every second; on a terminal one line rewritten in place.
  const bool progress = !global.json;
  const bool tty = isatty(STDERR_FILENO);
  uint64_t listed_bytes = 0;
  for (const json& object : objects) listed_bytes += object.at("size").get<uint64_t>();
  if (progress) {
    std::cerr << "segment " << segment << " holds " << objects.size() << " objects ("
              << Bytes(static_cast<double>(listed_bytes)) << "); moving the most used first\n";
  }
  auto last_report = std::chrono::steady_clock::now();
  size_t visited = 0;
  bool line_open = false;  // a progress line rewritten in place waits for its newline

  std::map<std::string, std::unique_ptr<larder::StoreClient>> clients;  // by tenant
  uint64_t migrated = 0, migrated_bytes = 0, gone = 0, not_moved = 0, planned_bytes = 0;
  std::map<std::string, uint64_t> failures;  // by status code
  bool full = false;
  // Moved in batches (one get and one put call each) of consecutive objects of one tenant, so
  // that the hottest go first.
  constexpr size_t kBatchObjects = 64;
  constexpr uint64_t kBatchBytes = 64 << 20;
  std::string batch_tenant;
  std::vector<std::string> batch;
  uint64_t batch_bytes = 0;
  auto move_batch = [&] {
    if (batch.empty()) return;
    auto& client = clients[batch_tenant];
    if (!client) client = OpenClient(global, batch_tenant);
    std::vector<larder::Result<std::string>> values = client->BatchGet(batch);
    std::vector<std::string> keys;
    std::vector<std::span<const std::byte>> bytes;
    for (size_t i = 0; i < batch.size(); ++i) {
      if (values[i].ok()) {
        keys.push_back(batch[i]);
        bytes.push_back(std::as_bytes(std::span(*values[i])));
      } else if (values[i].status().code() == larder::StatusCode::kNotFound) {
        ++gone;  // removed or evicted since the listing: nothing to move
      } else {
        ++failures[std::string(larder::StatusCodeName(values[i].status().code()))];
      }
    }
    larder::PutConfig config;
    config.overwrite = true;  // the new object lands elsewhere; the pins stay
    std::vector<larder::Status> puts;
    if (!keys.empty()) puts = client->BatchPut(keys, bytes, config);
    for (size_t i = 0; i < puts.size(); ++i) {
      if (puts[i].ok()) {
        ++migrated;
        migrated_bytes += bytes[i].size();
      } else if (puts[i].code() == larder::StatusCode::kResourceExhausted) {
        full = true;  // the other segments hold no more than their own hot part already
        ++not_moved;
      } else {
        ++failures[std::string(larder::StatusCodeName(puts[i].code()))];
      }
    }
    batch.clear();
    batch_bytes = 0;
    const auto now = std::chrono::steady_clock::now();
    if (progress && now - last_report >= std::chrono::seconds(1)) {
      last_report = now;
      std::cerr << (tty ? "\r" : "") << "moved " << migrated << " objects ("
                << Bytes(static_cast<double>(migrated_bytes)) << "), " << visited << " of "
                << objects.size() << " looked at" << (tty ? "   " : "\n") << std::flush;
      line_open = tty;
    }
  };
  for (const json& object : objects) {
    ++visited;
    const uint64_t size = object.at("size");
    if (full || (flags.migrate_bytes > 0 && planned_bytes + size > flags.migrate_bytes)) {
      ++not_moved;
      continue;
    }
    planned_bytes += size;
    auto [tenant, key] = SplitTenant(FromHex(object.at("key_hex")));
    if (!batch.empty() && (tenant != batch_tenant || batch.size() == kBatchObjects ||
                           batch_bytes + size > kBatchBytes)) {
      move_batch();
    }
    batch_tenant = tenant;
    batch.push_back(std::move(key));
    batch_bytes += size;
  }
  move_batch();
  clients.clear();
  if (line_open) std::cerr << "\n";
  if (progress && !flags.keep) std::cerr << "dropping what is left on " << segment << "\n";

  json dropped = {{"removed", 0}, {"skipped_leased", 0}};
  if (!flags.keep) {
    dropped = http.Post("/api/remove", {{"segment", segment}, {"force", flags.force}});
  }
  json result = {{"segment", segment},
                 {"listed", objects.size()},
                 {"listing_truncated", listing.value("truncated", false)},
                 {"migrated", migrated},
                 {"migrated_bytes", migrated_bytes},
                 {"gone", gone},
                 {"not_moved", not_moved},
                 {"pool_full", full},
                 {"failures", failures},
                 {"dropped", dropped.value("removed", uint64_t{0})},
                 {"skipped_leased", dropped.value("skipped_leased", uint64_t{0})}};
  if (global.json) {
    PrintJson(result);
  } else {
    std::cout << "segment " << segment << " drains: no new object goes there\n"
              << "moved " << migrated << " objects (" << Bytes(static_cast<double>(migrated_bytes))
              << ") to other segments, most used first";
    if (full) std::cout << "; the other segments are full";
    std::cout << "\n";
    if (gone > 0) std::cout << gone << " were removed or evicted meanwhile\n";
    for (const auto& [code, count] : failures) {
      std::cout << count << " could not be moved: " << code << "\n";
    }
    if (flags.keep) {
      std::cout << not_moved << " left in place (--keep)\n";
    } else {
      std::cout << "dropped " << result["dropped"].get<uint64_t>() << " objects left on it";
      if (const uint64_t leased = result["skipped_leased"]; leased > 0) {
        std::cout << "; " << leased << " held by readers stay (--force drops them too)";
      }
      std::cout << "\n";
    }
    if (result["listing_truncated"].get<bool>()) {
      std::cout << "the segment held more than --limit " << flags.limit
                << " objects: the least used were dropped without a try\n";
    }
  }
  return failures.empty() ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "larder-ctl: look at and act on a running Larder cluster.\n"
      "What the master knows comes from its HTTP port (--http); object bytes (get) come from the\n"
      "segments that hold them, through the master's gRPC port (--master), as a store client\n"
      "that contributes no memory. docs/operations.md has every command and field."};
  app.set_version_flag("--version", std::string("larder-ctl ") + larder::Version(),
                       "print the version and exit");
  app.require_subcommand(1);
  // Global flags are taken after the subcommand too ("larder-ctl status --json").
  app.fallthrough();
  Global global;
  global.master = larder::GetEnv("LARDER_MASTER");
  if (global.master.empty()) global.master = "127.0.0.1:50051";
  global.http = larder::GetEnv("LARDER_MASTER_HTTP");
  app.add_option("--master", global.master,
                 "the master's gRPC address HOST:PORT, or etcd://... (default: LARDER_MASTER, "
                 "else 127.0.0.1:50051); used by get")
      ->capture_default_str();
  app.add_option("--http", global.http,
                 "the master's HTTP address HOST:PORT (default: LARDER_MASTER_HTTP, else the "
                 "host of --master with port 9003)");
  app.add_option("--timeout", global.timeout, "deadline of each call, e.g. 5s, 500ms")
      ->check(larder::cli::Duration())
      ->capture_default_str();
  app.add_flag("--json", global.json, "print JSON (as the master's /api routes give it)");
  larder::cli::AddTokenFlags(
      &app, &global.tokens,
      "file holding the cluster token, which get needs (default: LARDER_AUTH_TOKEN)",
      "file holding the admin token, which every command but status and get needs on a master "
      "with a cluster token (default: LARDER_ADMIN_TOKEN)");

  app.add_subcommand("status", "the cluster at a glance: objects, bytes, hit rate, rates");
  app.add_subcommand("segments", "every mounted segment: owner, host, size, use, traffic");
  app.add_subcommand("clients", "every live client: host, last heartbeat, traffic by route");
  std::string prefix;
  size_t limit = 1000;
  auto* keys = app.add_subcommand("keys", "keys (and sizes) that start with a prefix, sorted");
  keys->add_option("--prefix", prefix, "the keys' prefix (default: every key)");
  keys->add_option("--limit", limit, "at most this many")
      ->check(CLI::Range(size_t{1}, size_t{100000}))
      ->capture_default_str();
  std::string key, output;
  auto* get = app.add_subcommand("get", "write one object's value to stdout (or -o FILE)");
  get->add_option("KEY", key, "the key")->required();
  get->add_option("-o,--output", output, "write the value to this file instead of stdout");
  bool yes = false, force = false;
  auto* remove = app.add_subcommand("remove", "remove every object whose key starts with a prefix");
  remove->add_option("--prefix", prefix, "the keys' prefix")->required();
  remove->add_flag("-y,--yes", yes, "do not ask for confirmation");
  remove->add_flag("--force", force,
                   "remove objects that readers hold too (their space is reused once the readers "
                   "are done)");
  std::string segment;
  DrainFlags drain_flags;
  auto* drain = app.add_subcommand(
      "drain",
      "stop placing objects in a segment, move its most used objects to other segments and drop "
      "the rest, so that its owner can leave without losing the cache's hot part");
  drain->add_option("SEGMENT", segment, "the segment's name (larder-ctl segments)")->required();
  drain->add_option("--migrate-bytes", drain_flags.migrate_bytes,
                    "move at most this many bytes (default: as many as the other segments take)");
  drain
      ->add_option("--limit", drain_flags.limit,
                   "consider at most this many of its objects, the most used")
      ->check(CLI::Range(size_t{1}, size_t{100000}))
      ->capture_default_str();
  drain->add_flag("--keep", drain_flags.keep, "move what fits, drop nothing");
  drain->add_flag("-y,--yes", drain_flags.yes, "do not ask for confirmation");
  drain->add_flag("--force", drain_flags.force, "drop objects that readers hold too");
  drain->add_flag("--undo", drain_flags.undo, "let the segment take new objects again");
  CLI11_PARSE(app, argc, argv);

  try {
    larder::SetLogLevel(
        larder::GetEnv("LARDER_LOG_LEVEL").empty() ? "error" : larder::GetEnv("LARDER_LOG_LEVEL"));
    global.auth_token = larder::GetEnv("LARDER_AUTH_TOKEN");
    global.admin_token = larder::GetEnv("LARDER_ADMIN_TOKEN");
    if (larder::Status read =
            larder::cli::ReadTokens(global.tokens, 1, &global.auth_token, &global.admin_token);
        !read.ok()) {
      throw Failure{read.ToString()};
    }
    if (global.http.empty()) {
      std::string host = "127.0.0.1";
      if (!global.master.starts_with("etcd://")) host = HostPort(global.master, "--master").first;
      if (host.find(':') != std::string::npos) host = "[" + host + "]";
      global.http = host + ":9003";
    }
    const std::string command = app.get_subcommands().front()->get_name();
    if (command == "status") return ShowStatus(global);
    if (command == "segments") return Segments(global);
    if (command == "clients") return Clients(global);
    if (command == "keys") return Keys(global, prefix, limit);
    if (command == "get") return GetKey(global, key, output);
    if (command == "remove") return Remove(global, prefix, yes, force);
    if (command == "drain") return Drain(global, segment, drain_flags);
  } catch (const Failure& failure) {
    std::cerr << "larder-ctl: " << failure.message << "\n";
    return 1;
  } catch (const nlohmann::json::exception& error) {
    std::cerr << "larder-ctl: the master's answer has an unexpected shape: " << error.what()
              << "\n";
    return 1;
  }
  return 2;
}
