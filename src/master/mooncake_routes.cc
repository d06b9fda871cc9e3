// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The routes of Mooncake's master, in its formats, for its tools (http_endpoint.h lists them).
#include <httplib.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "master/http_routes_internal.h"
#include "master/master_state.h"

namespace larder::master {
namespace {

// Bounds on the Mooncake-style queries (the URI itself is at most 8 KiB in cpp-httplib).
constexpr size_t kMaxQueryKeys = 1024;
constexpr char kObjectNotFound[] = "OBJECT_NOT_FOUND";

// Where readers reach a segment, as Mooncake's replica descriptors say it.
struct SegmentAddress {
  uint64_t base = 0;
  std::string endpoint;  // the tcp endpoint its descriptor announces, else its name
};

// The addresses of the segments the outcomes' replicas are on.
std::unordered_map<PoolSegmentId, SegmentAddress> AddressesOf(
    const MasterState& state, std::span<const GetOutcome> outcomes) {
  std::vector<PoolSegmentId> ids;
  for (const GetOutcome& outcome : outcomes) {
    for (const ReplicaLocation& replica : outcome.replicas) ids.push_back(replica.segment_id);
  }
  std::unordered_map<PoolSegmentId, SegmentAddress> addresses;
  if (ids.empty()) return addresses;
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (const SegmentView& segment : state.ListSegments(ids)) {
    SegmentAddress& address = addresses[segment.segment_id];
    address.base = segment.base;
    address.endpoint =
        segment.descriptor.address.empty() ? segment.name : segment.descriptor.address;
  }
  return addresses;
}

// One replica descriptor per replica of a found object (a replica whose segment went in between
// is left out).
std::vector<nlohmann::ordered_json> ReplicaDescriptors(
    const GetOutcome& outcome, const std::unordered_map<PoolSegmentId, SegmentAddress>& addresses) {
  std::vector<nlohmann::ordered_json> out;
  for (const ReplicaLocation& replica : outcome.replicas) {
    auto it = addresses.find(replica.segment_id);
    if (it == addresses.end()) continue;
    nlohmann::ordered_json descriptor;
    descriptor["size_"] = outcome.size;
    descriptor["buffer_address_"] = it->second.base + replica.offset;
    descriptor["protocol_"] = "tcp";
    descriptor["transport_endpoint_"] = it->second.endpoint;
    out.push_back(std::move(descriptor));
  }
  return out;
}

}  // namespace

void InstallMooncakeRoutes(httplib::Server& server, MasterState& state, const HttpAuth& auth) {
  server.Get("/get_all_segments",
             [&state, auth](const httplib::Request& request, httplib::Response& response) {
               if (!AdminAllowed(auth, request, response)) return;
               std::string body;
               for (const SegmentView& segment : state.ListSegments({})) {
                 body += EscapeLine(segment.name);
                 body += '\n';
               }
               response.set_content(body, kTextFormat);
             });
  server.Get("/get_all_keys",
             [&state, auth](const httplib::Request& request, httplib::Response& response) {
               if (!AdminAllowed(auth, request, response)) return;
               std::string body;
               for (const auto& [key, size] : state.ListKeys("", kMaxKeysListed)) {
                 body += EscapeLine(key);
                 body += '\n';
               }
               response.set_content(body, kTextFormat);
             });
  server.Get("/query_key",
             [&state, auth](const httplib::Request& request, httplib::Response& response) {
               if (!AdminAllowed(auth, request, response)) return;
               const std::string key = request.get_param_value("key");
               std::vector<GetOutcome> found;
               if (!key.empty()) {
                 std::string_view view = key;
                 found = state.DescribeKeys(std::span(&view, 1));
               }
               if (found.empty() || !found[0].status.ok()) {
                 response.status = 404;
                 response.set_content(kObjectNotFound, kTextFormat);
                 return;
               }
               std::string body;
               for (const nlohmann::ordered_json& replica :
                    ReplicaDescriptors(found[0], AddressesOf(state, found))) {
                 body += Dump(replica);
                 body += '\n';
               }
               response.set_content(body, kTextFormat);
             });
  server.Get("/batch_query_keys", [&state, auth](const httplib::Request& request,
                                                 httplib::Response& response) {
    if (!AdminAllowed(auth, request, response)) return;
    const std::string list = request.get_param_value("keys");
    std::vector<std::string_view> keys;
    for (size_t start = 0; start <= list.size() && keys.size() <= kMaxQueryKeys;) {
      size_t end = std::min(list.find(',', start), list.size());
      if (end > start) keys.push_back(std::string_view(list).substr(start, end - start));
      start = end + 1;
    }
    auto refuse = [&response](const std::string& error) {
      response.status = 400;
      response.set_content(Dump({{"success", false}, {"error", error}}), "application/json");
    };
    if (keys.empty()) return refuse("No keys provided. Use ?keys=key1,key2,...");
    if (keys.size() > kMaxQueryKeys) {
      return refuse("Too many keys: at most " + std::to_string(kMaxQueryKeys));
    }
    std::vector<GetOutcome> found = state.DescribeKeys(keys);
    auto addresses = AddressesOf(state, found);
    nlohmann::ordered_json data = nlohmann::ordered_json::object();
    for (size_t i = 0; i < keys.size(); ++i) {
      nlohmann::ordered_json item;
      if (found[i].status.ok()) {
        item["ok"] = true;
        item["values"] = ReplicaDescriptors(found[i], addresses);
      } else {
        item["ok"] = false;
        item["error"] =
            found[i].status.code() == StatusCode::kNotFound ? kObjectNotFound : "INVALID_KEY";
      }
      data[std::string(keys[i])] = std::move(item);
    }
    response.set_content(Dump({{"success", true}, {"data", std::move(data)}}), "application/json");
  });
  server.Get("/query_segment",
             [&state, auth](const httplib::Request& request, httplib::Response& response) {
               if (!AdminAllowed(auth, request, response)) return;
               const std::string name = request.get_param_value("segment");
               for (const SegmentView& segment : state.ListSegments({})) {
                 if (name.empty() || segment.name != name) continue;
                 response.set_content(
                     EscapeLine(segment.name) + "\nUsed(bytes): " + std::to_string(segment.used) +
                         "\nCapacity(bytes) : " + std::to_string(segment.size) + "\n",
                     kTextFormat);
                 return;
               }
               response.status = 500;
               response.set_content("Failed to query segment", kTextFormat);
             });
}

}  // namespace larder::master
