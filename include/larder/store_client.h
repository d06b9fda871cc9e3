// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// larder::StoreClient: a process's handle on the Larder store, the shared KV-cache pool.
//
// A client contributes a *global segment* of its host memory to the pool (memory allocated by its
// store engine's transport: a memfd when shm is enabled, so same-host peers can map it), mounts it
// with larder-master, heartbeats, and puts and gets objects. Bytes move directly between
// processes through the client's TransferEngine (role kStore): memcpy inside the process, a
// mapped memfd between processes of one host, TCP between hosts. The master only says where
// replicas are.
//
// Objects are immutable byte strings addressed by keys. A put of a key that exists succeeds
// without rewriting it. A get holds a lease from the master that keeps the object from being
// evicted or removed while the bytes are copied, and releases it when the copy has ended; if the
// lease runs out (the master's lease TTL) before the copy completes, the get fails with
// Unavailable (retry) rather than return bytes that may belong to another object by then.
//
// Thread-safety: every method may be called from any number of threads at once.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "larder/export.h"
#include "larder/soft_pin.h"
#include "larder/status.h"
#include "larder/transfer_engine.h"

namespace larder {

// Every field has its default here and in docs/configuration.md.
struct LARDER_EXPORT StoreClientOptions {
  // larder-master's gRPC address "host:port", or "etcd://HOST:PORT[,HOST:PORT...]/CLUSTER_ID"
  // to follow the leader of a highly available cluster (docs/store.md, "High availability").
  std::string master_address = "127.0.0.1:50051";
  // Address this process's data server listens on (other hosts reach its segment there): "ip"
  // (a free port) or "ip:port".
  std::string local_hostname = "127.0.0.1";
  // Name of this client's global segment in the cluster; other clients name it in
  // PutConfig::preferred_segments. Empty: "<local_hostname>:<data port>", unique per process.
  std::string segment_name;
  // Bytes this client contributes to the pool. 0: contribute nothing (a pure reader/writer).
  uint64_t global_segment_size = 256ull << 20;
  // The global segment may be larger than the memory this process can fill (the host's RAM or
  // its cgroup's limit); else such a segment is refused, since the kernel would kill the process
  // once the store filled it. Segments are sparse (only pages written use memory), so a segment
  // that will never be filled, as in a benchmark of the RFC's 700 GB segments on a small
  // machine, works. LARDER_SPARSE_SEGMENT=1 sets it.
  bool sparse_segment = false;
  // Bytes of registered local memory the copying API (Put/Get) may stage through. Larder's
  // transports read and write the caller's memory directly, so this is only reserved when the
  // store protocol requires registered local memory; 0 is a valid setting. Accepted for
  // compatibility with Mooncake configurations.
  uint64_t local_buffer_size = 0;
  // Transports of the store engine ("auto", "shm,tcp", "tcp", "device", ...). Empty:
  // LARDER_STORE_PROTOCOL, else LARDER_PROTOCOL, else "auto".
  std::string protocol;
  // Replicas per object when a put does not say.
  uint32_t replica_num = 1;
  // Cluster token: every call to the master and every shm handoff and tcp connection between
  // clients proves it, in both directions (docs/security.md). Empty: LARDER_AUTH_TOKEN, else none.
  std::string auth_token;
  // Operator token, needed by RemoveAll on a master with a cluster token. Empty:
  // LARDER_ADMIN_TOKEN, else none.
  std::string admin_token;
  // TLS (PEM files). tls_ca_file: the CA that the master's and peers' certificates must chain to
  // (gRPC and the tcp data plane then use TLS); tls_cert_file / tls_key_file: this client's data
  // server certificate. Empty: LARDER_TLS_CA, LARDER_TLS_CERT, LARDER_TLS_KEY, else no TLS.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  // Host identity (same host = same id). Empty: LARDER_HOST_ID, else the kernel boot id.
  std::string host_id;
  // Key namespace: a tenant's keys are invisible to clients of other tenants, and its bulk
  // removals (RemoveAll, RemoveByRegex) never reach them. At most 128 bytes, no NUL byte. Empty:
  // LARDER_TENANT, else the default tenant. Tenants are namespaces, not a security boundary: the
  // cluster token is (docs/security.md).
  std::string tenant_id;
  // Page size of the global segment: "off", "2m", "1g" or "auto" (see TransferEngineOptions).
  // Empty: LARDER_HUGE_PAGES, else "off".
  std::string huge_pages;
  // Longest time between heartbeats; shortened to a third of the master's client TTL.
  std::chrono::milliseconds heartbeat_interval{1000};
  // Deadline of each call to the master.
  std::chrono::milliseconds rpc_timeout{10000};
  // How long creation waits for a master (or, with an etcd:// address, its cluster's leader)
  // to answer, logging what it waits for, before it fails with Unavailable. A serving process
  // started beside its master (as orchestrators start them) then does not crash.
  std::chrono::milliseconds master_connect_timeout{30000};
  // Deadline of the data movement of one batch.
  std::chrono::milliseconds transfer_timeout{10000};
  // A get releases its lease when its copy has ended. The release rides on the client's next
  // call to the master; if none comes within this delay, it is sent on its own.
  std::chrono::microseconds lease_release_delay{2000};
  // The disk tier (docs/disk-tier.md): a directory makes this client its host's disk holder.
  // Objects of this host that memory evicts are kept there and read back from there, by any
  // client. One process per directory. Empty: no disk. LARDER_DISK_PATH; the other settings
  // (watermarks, queue depth, region size, direct I/O) come from LARDER_DISK_*.
  std::string disk_path;
  // The most the disk tier may take: bytes ("200G") or a percentage of the file system ("40%").
  // Empty: 50% of the file system. LARDER_DISK_CAPACITY.
  std::string disk_capacity;

  // The defaults, overridden by the environment: LARDER_MASTER, LARDER_LOCAL_HOSTNAME,
  // LARDER_SEGMENT_NAME, LARDER_GLOBAL_SEGMENT_SIZE and LARDER_LOCAL_BUFFER_SIZE (sizes such as
  // "4gb", "512MiB"), LARDER_REPLICA_NUM, LARDER_AUTH_TOKEN, LARDER_ADMIN_TOKEN, LARDER_TLS_CA,
  // LARDER_TLS_CERT, LARDER_TLS_KEY, LARDER_HOST_ID, LARDER_TENANT,
  // LARDER_LEASE_RELEASE_DELAY ("1ms", "2s"), LARDER_MASTER_CONNECT_TIMEOUT ("30s"). The protocol
  // is left empty, so the engine resolves LARDER_STORE_PROTOCOL / LARDER_PROTOCOL itself. Errors:
  // InvalidArgument naming the variable that does not parse.
  static Result<StoreClientOptions> FromEnvironment();
};

// Per-put placement settings.
struct LARDER_EXPORT PutConfig {
  uint32_t replica_num = 0;  // 0: StoreClientOptions::replica_num
  // Segment names to place replicas in first, in order (see StoreClient::segment_name()).
  std::vector<std::string> preferred_segments;
  // Pinned objects are never evicted; only Remove deletes them.
  bool pin = false;
  // Soft-pinned objects are evicted only when no unpinned object is left to evict, until their
  // deadline passes. A TTL is valid only with kEnable (InvalidArgument otherwise); 0 means no pin.
  SoftPinAction soft_pin_action = SoftPinAction::kPreserve;
  std::optional<std::chrono::milliseconds> soft_pin_ttl;
  // Upsert: replace the value of a stored key (readers that hold the old value finish reading
  // it) instead of leaving it unchanged. A key another client is writing: Unavailable.
  bool overwrite = false;
  // The disk tier (docs/disk-tier.md): write the object to its host's disk as soon as its put
  // ends, whatever the master's demotion watermark, so that it survives eviction from the moment
  // the put returns plus one disk write. No holder on the host: as without it.
  bool disk_write_through = false;
};

// A piece of caller memory that holds (or receives) part of an object's bytes.
struct LARDER_EXPORT BufferSlice {
  void* ptr = nullptr;
  size_t size = 0;
};

// `size` bytes of object `key` from byte `offset` of its value, read into `ptr`.
struct LARDER_EXPORT ObjectRange {
  std::string key;
  uint64_t offset = 0;
  void* ptr = nullptr;
  size_t size = 0;
};

// Where one replica of an object lives.
struct LARDER_EXPORT ReplicaInfo {
  std::string segment_name;
  uint64_t offset = 0;   // inside the segment
  uint64_t address = 0;  // the segment owner's address of the replica's first byte
  std::string endpoint;  // the owner engine's address ("ip:port"); empty for a segment without one
};

// An object's size and replicas, as the master knows them.
struct LARDER_EXPORT ObjectInfo {
  uint64_t size = 0;
  std::vector<ReplicaInfo> replicas;
};

// What StoreClient::BatchRemoveReplicas removes.
struct LARDER_EXPORT RemoveScope {
  // Only each object's replica on the segment of this name (ListSegments' names); "": the whole
  // object.
  std::string segment;
  // Objects put or read within this long stay, as Mooncake's batch_replica_clear keeps objects
  // in their KV lease (the master counts it from its sweeps: up to one sweep interval longer).
  // Zero: no such rule; at most 24 h. `force` does not override it.
  std::chrono::milliseconds unused_for{0};
  // Objects leased to a reader go too (the reader finishes reading the old bytes).
  bool force = false;

  // InvalidArgument when `unused_for` is negative or above 24 h.
  Status Validate() const;
};

// The calls that implementations differ in are the virtual ones, batch forms all; each single-key
// form is the batch form of one key (store_client_forms.cc), so it behaves exactly as that.
// Implementations: the store client of this process (Create), a process attached to larder-client
// (AttachStoreClient, standalone.h); each passes the StoreClient conformance suite.
class LARDER_EXPORT StoreClient {
 public:
  // Creates the store engine, allocates and mounts the global segment, and starts heartbeats.
  // Errors: Unavailable (master unreachable), InvalidArgument (bad options), and whatever the
  // engine or the mount reports (e.g. ResourceExhausted when memory cannot be allocated).
  static Result<std::unique_ptr<StoreClient>> Create(const StoreClientOptions& options);

  // Unmounts the segment (objects with no replica elsewhere are gone from the pool) and stops.
  virtual ~StoreClient() = default;

  // The global segment's name ("" when global_segment_size is 0).
  virtual const std::string& segment_name() const = 0;
  // The client id the master knows this process by.
  virtual const std::string& client_id() const = 0;
  // The store engine (role kStore).
  virtual TransferEngine& engine() = 0;

  // ---- copying API: values are copied from / into memory Larder manages for the caller ----

  // Stores `value` under `key`. OK also when the key already exists (not rewritten).
  // Errors: InvalidArgument (empty or oversize key, empty value, value larger than any segment),
  // ResourceExhausted (no space and nothing evictable), Unavailable (master or peer unreachable;
  // retry), and transfer errors.
  Status Put(std::string_view key, std::span<const std::byte> value, const PutConfig& config = {});
  // The value of `key`. Errors: NotFound, Unavailable (being written, lease expired, or
  // unreachable).
  Result<std::string> Get(std::string_view key);
  // One master RPC and one transfer batch for all keys. Results are in the order of `keys`.
  // REQUIRES: keys.size() == values.size().
  virtual std::vector<Status> BatchPut(std::span<const std::string> keys,
                                       std::span<const std::span<const std::byte>> values,
                                       const PutConfig& config = {}) = 0;
  virtual std::vector<Result<std::string>> BatchGet(std::span<const std::string> keys) = 0;

  // ---- zero-copy API: values move straight between registered buffers and segments ----

  // Registers [ptr, ptr + size) for PutFrom/GetInto (and with the engine, for transports that need
  // registration). Errors: InvalidArgument (null or empty, or overlapping a registered buffer).
  virtual Status RegisterBuffer(void* ptr, size_t size) = 0;
  // Errors: NotFound (no buffer registered at ptr).
  virtual Status UnregisterBuffer(void* ptr) = 0;
  // Stores the `size` bytes at `ptr`. REQUIRES: the range lies in a registered buffer and stays
  // unchanged until the call returns. Errors as Put, plus FailedPrecondition (not registered).
  Status PutFrom(std::string_view key, const void* ptr, size_t size, const PutConfig& config = {});
  // Copies the value of `key` into [ptr, ptr + capacity) and returns its size. Errors as Get, plus
  // FailedPrecondition (not registered) and InvalidArgument (capacity smaller than the value).
  Result<size_t> GetInto(std::string_view key, void* ptr, size_t capacity);
  // REQUIRES: keys, ptrs and sizes have the same length.
  virtual std::vector<Status> BatchPutFrom(std::span<const std::string> keys,
                                           std::span<void* const> ptrs,
                                           std::span<const size_t> sizes,
                                           const PutConfig& config = {}) = 0;
  virtual std::vector<Result<size_t>> BatchGetInto(std::span<const std::string> keys,
                                                   std::span<void* const> ptrs,
                                                   std::span<const size_t> capacities) = 0;
  // Scatter-gather: object i is the concatenation of slices[i] (each inside a registered buffer),
  // as a layer-first KV pool keeps one page in one slice per layer. REQUIRES: keys.size() ==
  // slices.size(). Errors as BatchPutFrom.
  virtual std::vector<Status> BatchPutFromSlices(std::span<const std::string> keys,
                                                 std::span<const std::vector<BufferSlice>> slices,
                                                 const PutConfig& config = {}) = 0;
  // Reads object i across slices[i], in order, and returns its size. Errors as BatchGetInto;
  // InvalidArgument when the slices together hold fewer bytes than the value.
  virtual std::vector<Result<size_t>> BatchGetIntoSlices(
      std::span<const std::string> keys, std::span<const std::vector<BufferSlice>> slices) = 0;
  // As BatchGet, but each value is read straight into the memory `allocate(i, size)` returns once
  // the size of keys[i] is known (at least `size` bytes; registration not required); an error it
  // returns fails that key. Returns each value's size.
  using Allocator = std::function<Result<void*>(size_t index, uint64_t size)>;
  virtual std::vector<Result<size_t>> BatchGetAllocated(std::span<const std::string> keys,
                                                        const Allocator& allocate) = 0;
  // Reads parts of objects (each range inside a registered buffer); one result per range: the
  // bytes read, NotFound, OutOfRange (the range runs past the value), or the read's error. Ranges
  // of one key are read under one lease.
  virtual std::vector<Result<size_t>> BatchGetRanges(std::span<const ObjectRange> ranges) = 0;

  // ---- metadata ----

  // True when the object is stored and complete. Takes no lease.
  Result<bool> Exist(std::string_view key);
  virtual std::vector<Result<bool>> BatchExist(std::span<const std::string> keys) = 0;
  // The value's size in bytes. Takes no lease. Errors: NotFound.
  virtual Result<uint64_t> GetSize(std::string_view key) = 0;
  // Errors: NotFound, Unavailable (leased by a reader or being written: retry later). With
  // `force`, a leased object is removed too (readers holding it finish reading the old bytes).
  Status Remove(std::string_view key, bool force = false);
  // BatchRemoveReplicas with the whole objects in scope.
  std::vector<Status> BatchRemove(std::span<const std::string> keys, bool force = false);
  // BatchRemove narrowed by `scope`: with a segment name, only each key's replica there (an
  // object whose last replica that was goes as BatchRemove removes it, the others stay readable
  // from their other replicas); with `unused_for`, only objects not put or read for that long.
  // Per item as BatchRemove, and NotFound when the key has no replica on the segment (or no such
  // segment is mounted), Unavailable with ErrorDetail::kLeased when it was used too recently.
  virtual std::vector<Status> BatchRemoveReplicas(std::span<const std::string> keys,
                                                  const RemoveScope& scope) = 0;
  // Removes every object of this client's tenant that no reader holds a lease on (with `force`,
  // leased ones too); returns how many were removed. Needs the admin token on a master with a
  // cluster token.
  virtual Result<uint64_t> RemoveAll(bool force = false) = 0;
  // Removes the objects of this client's tenant whose whole key matches `pattern` (RE2 syntax);
  // returns how many. Errors: InvalidArgument (bad pattern).
  virtual Result<uint64_t> RemoveByRegex(std::string_view pattern, bool force = false) = 0;
  // Size and replica locations of each key, without a lease. Per item: NotFound, Unavailable
  // (being written).
  virtual std::vector<Result<ObjectInfo>> BatchGetObjectInfo(std::span<const std::string> keys) = 0;

  // The route this client's transfers to the named segment take (kLocal in the same process,
  // kSameHostShm on the same host when shm is enabled, kTcp otherwise). Errors: NotFound (no such
  // segment is mounted), Unavailable (it cannot be reached).
  virtual Result<RouteKind> RouteTo(std::string_view segment_name) = 0;

  // Objects this client's catalog holds: those committed in its own segment, as the master last
  // reported them. A new master incarnation rebuilds them from it (docs/store.md, "High
  // availability"). 0 for a client without a segment.
  virtual uint64_t CatalogSize() const { return 0; }
};

}  // namespace larder
