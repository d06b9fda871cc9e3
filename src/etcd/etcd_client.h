// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// A small client of etcd's v3 API (KV, leases), spoken over gRPC, and the records larder-master
// keeps there for leader election (docs/store.md, "High availability").
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "larder/status.h"

namespace larder::etcd {

struct EtcdOptions {
  // "host:port" of etcd members; calls go to the first that answers, in order.
  std::vector<std::string> endpoints;
  // Deadline of each call to one member.
  std::chrono::milliseconds timeout{2000};
};

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

struct Lease {
  int64_t id = 0;
  std::chrono::milliseconds ttl{0};  // as granted (etcd may raise a TTL below its minimum)
};

// Thread-safe. Every error is Unavailable ("etcd <endpoints> unreachable: ...") when no member
// answers, or the member's status otherwise, with the call's name as context.
class EtcdClient {
 public:
  static Result<std::unique_ptr<EtcdClient>> Create(EtcdOptions options);
  virtual ~EtcdClient() = default;

  virtual Result<std::optional<KeyValue>> Get(std::string_view key) = 0;
  // Stores `value` at `key`, attached to `lease` (0: none).
  virtual Status Put(std::string_view key, std::string_view value, int64_t lease = 0) = 0;
  // Creates `key` only where it does not exist (a transaction on its create revision). True when
  // this call created it.
  virtual Result<bool> PutIfAbsent(std::string_view key, std::string_view value, int64_t lease) = 0;
  // Deletes `key` only while it is attached to `lease` (so a lapsed holder never deletes its
  // successor's record). True when deleted.
  virtual Result<bool> DeleteIfLease(std::string_view key, int64_t lease) = 0;
  virtual Result<Lease> GrantLease(std::chrono::milliseconds ttl) = 0;
  // One keep-alive round trip. Returns the lease's TTL from now; NotFound when the lease expired
  // (or was revoked).
  virtual Result<std::chrono::milliseconds> KeepAlive(int64_t lease) = 0;
  virtual Status RevokeLease(int64_t lease) = 0;

  virtual const std::vector<std::string>& endpoints() const = 0;
};
// Notes on the calls above:
// - Create: InvalidArgument when `options` has no endpoint, a malformed one (see
//   ParseEtcdEndpoints) or a timeout below 1 ms. Connects lazily: Create never waits for etcd.
// - Members are tried starting with the one that answered last; a member that is unreachable
//   (or does not answer within `timeout`) passes the call to the next. After Unavailable a write
//   may or may not have been applied.
// - PutIfAbsent is safe to retry: it also returns true when `key` already holds `value` under
//   the same (non-zero) `lease`, i.e. an earlier attempt whose reply was lost created it.
// - DeleteIfLease, PutIfAbsent: InvalidArgument for lease 0.
// - Keys are at most kMaxEtcdKeyBytes and values at most kMaxEtcdValueBytes (InvalidArgument
//   beyond); what etcd returns is held to the same bounds (Internal beyond, naming the key).
// - KeepAlive keeps one LeaseKeepAlive stream open between calls (one call at a time; others
//   wait for it) and reopens it, on the next member if need be, after an error.
// - RevokeLease: NotFound when the lease no longer exists.

inline constexpr size_t kMaxEtcdKeyBytes = 4096;
inline constexpr size_t kMaxEtcdValueBytes = 1 << 20;

// Parses "HOST:PORT[,HOST:PORT...]" (the --etcd flag): each HOST a name, an IPv4 address or a
// bracketed IPv6 address, each PORT 1..65535; a leading "http://" is accepted and dropped.
// Errors: InvalidArgument naming the bad endpoint (and "https://": TLS to etcd is not supported).
Result<std::vector<std::string>> ParseEtcdEndpoints(std::string_view list);

// `etcd://HOST:PORT[,HOST:PORT...]/CLUSTER_ID`, as LARDER_MASTER takes it.
struct EtcdTarget {
  std::vector<std::string> endpoints;
  std::string cluster_id;
};
// True when `address` starts with "etcd://".
bool IsEtcdAddress(std::string_view address);
// Errors: InvalidArgument naming what is wrong (no endpoint, a bad host:port, an empty or
// malformed cluster id).
Result<EtcdTarget> ParseEtcdAddress(std::string_view address);
// Cluster ids: 1..128 characters of [A-Za-z0-9._-]. InvalidArgument otherwise.
Status ValidateClusterId(std::string_view cluster_id);

// A lease id as etcd and etcdctl print it: lowercase hex, no prefix.
std::string LeaseIdText(int64_t lease);

// What the leader of a cluster publishes at LeaderKey(cluster_id), attached to its lease.
struct LeaderRecord {
  std::string address;  // "host:port" of its gRPC service, as clients dial it
  uint64_t incarnation = 0;
  int http_port = -1;
};
std::string LeaderKey(std::string_view cluster_id);          // "/larder/clusters/<id>/leader"
std::string EncodeLeaderRecord(const LeaderRecord& record);  // JSON
Result<LeaderRecord> DecodeLeaderRecord(std::string_view json);
// DecodeLeaderRecord's errors: InvalidArgument for a record over kMaxLeaderRecordBytes, that is
// not JSON, or whose fields are missing or out of range (an address of 1..255 bytes, an http
// port of -1..65535).
inline constexpr size_t kMaxLeaderRecordBytes = 4096;

// The current leader of `cluster_id`. Errors: Unavailable ("no leader of cluster X yet") when
// none is published, or when etcd cannot be reached; Internal for a record that does not parse.
Result<LeaderRecord> FindLeader(EtcdClient& etcd, std::string_view cluster_id);

}  // namespace larder::etcd
