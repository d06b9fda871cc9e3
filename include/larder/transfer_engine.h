// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// larder::TransferEngine moves bytes between a process's local memory and segments exported by
// engines in this process, in other processes on this host, or on other hosts, over the fastest
// route that reaches the owner:
//
//   local   the segment belongs to this engine: memcpy.
//   shm     same host, other process: the owner's memfd is handed over a Unix socket
//           (SCM_RIGHTS), mapped MAP_SHARED here, then memcpy.
//   ucx     other hosts over an RDMA fabric, through UCX (builds with libucx; chosen by "auto" only
//           where UCX has an RDMA lane to the peer).
//   tcp     anything else (or when forced): the owner's data server (its engine's address).
//   device  device memory, through a registration-aware device transport: engines of one host
//           (the owner's allocation imported by handle; see docs/devices.md). Device memory on
//           other hosts, or where the device route cannot reach it, moves over tcp through pinned
//           staging buffers on each side (route "tcp-staged" in the counters).
//
// Routes are transports, registered by name (transfer/transport_registry.h); each publishes how
// it is reached in the segment descriptors. An engine's own address is its bootstrap service,
// which answers descriptor queries and belongs to no transport.
//
// Segments are addressed as (segment, offset), never by raw remote address, so every access is
// bounds-checked against the segment's size on both ends.
//
// Typical use (initiator):
//   LARDER_ASSIGN_OR_RETURN(auto engine, TransferEngine::Create({}));
//   LARDER_ASSIGN_OR_RETURN(SegmentHandle seg, engine->OpenSegment("10.0.0.7:17001", "kv"));
//   TransferRequest req{TransferOp::kRead, buf, seg, /*offset=*/0, /*length=*/4096};
//   LARDER_ASSIGN_OR_RETURN(BatchId batch, engine->Submit({&req, 1}));
//   LARDER_RETURN_IF_ERROR(engine->Wait(batch, std::chrono::seconds(1)));
//   TransferResult result = engine->Results(batch).value()[0];
//   LARDER_RETURN_IF_ERROR(engine->Release(batch));
//
// Typical use (target):
//   auto memory = engine->AllocateSegmentMemory(1 << 30).value();   // memfd when shm is enabled
//   SegmentId id = engine->RegisterSegment("kv", memory).value();
//   // peers now open "<engine->address()>" / "kv".
//
// Thread safety: every method of TransferEngine may be called concurrently from any thread.
#pragma once

#include <chrono>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "larder/export.h"
#include "larder/memory_region.h"
#include "larder/status.h"

namespace larder {

// Which engine a process is creating; selects the protocol variable that applies.
enum class EngineRole {
  kPd,     // PD transfers and other engines of the application's own: LARDER_PROTOCOL.
  kStore,  // The store client's engine: LARDER_STORE_PROTOCOL, else LARDER_PROTOCOL.
};

// How a batch shares the host with other transfer work (docs/transfer-engine.md, "Traffic
// classes"). Latency work is what a request waits on (PD pulls); bulk work is throughput (the
// store's puts and gets). Bulk work yields to latency work: the two never share a tcp connection
// (so a PD request never waits behind a store window), the threads that serve and copy bulk work
// run at a lower scheduling priority (nice +10), latency threads at a higher one where the process
// may (nice -5), and bulk copies on the CPU routes run in bounded chunks that step aside while
// latency work of the process is running.
enum class TrafficClass : uint8_t {
  kDefault,  // the engine's class: TransferEngineOptions::traffic_class
  kLatency,
  kBulk,
};
// "default", "latency", "bulk".
LARDER_EXPORT std::string_view TrafficClassName(TrafficClass traffic_class);
// Parses "latency" or "bulk". InvalidArgument otherwise.
LARDER_EXPORT Result<TrafficClass> ParseTrafficClass(std::string_view name);

// A route is named by the transport that carries it: "local", "shm", "tcp", "device", "ucx", or
// whatever transport a build registers (docs/transfer-engine.md lists them). A default-constructed
// route is "none". Names are at most 15 bytes and stored inline, so a RouteKind is as cheap to
// copy and compare as an integer. The constants name the transports that every build has; other
// transports are named by string, e.g. RouteKind("ucx").
class LARDER_EXPORT RouteKind {
 public:
  static constexpr size_t kMaxNameBytes = 15;

  constexpr RouteKind() = default;
  // Names longer than kMaxNameBytes are cut there (the registry refuses such transport names).
  constexpr explicit RouteKind(std::string_view name)
      : size_(static_cast<uint8_t>(name.size() < kMaxNameBytes ? name.size() : kMaxNameBytes)) {
    for (size_t i = 0; i < kMaxNameBytes; ++i) name_[i] = i < size_ ? name[i] : '\0';
  }

  // "none" for the default route. Points into this object.
  constexpr std::string_view name() const {
    return size_ == 0 ? std::string_view("none") : std::string_view(name_, size_);
  }
  constexpr bool none() const { return size_ == 0; }

  friend constexpr bool operator==(const RouteKind& a, const RouteKind& b) {
    if (a.size_ != b.size_) return false;
    for (size_t i = 0; i < kMaxNameBytes; ++i) {
      if (a.name_[i] != b.name_[i]) return false;
    }
    return true;
  }
  friend constexpr auto operator<=>(const RouteKind& a, const RouteKind& b) {
    return a.name() <=> b.name();
  }

  static const RouteKind kNone;
  static const RouteKind kLocal;        // the segment belongs to this engine: memcpy
  static const RouteKind kSameHostShm;  // "shm": a same-host peer's memfd, mapped here
  static const RouteKind kTcp;          // the owner's tcp data server
  static const RouteKind kDevice;       // device memory through the device transport

 private:
  uint8_t size_ = 0;
  char name_[kMaxNameBytes] = {};
};

inline constexpr RouteKind RouteKind::kNone{};
inline constexpr RouteKind RouteKind::kLocal{"local"};
inline constexpr RouteKind RouteKind::kSameHostShm{"shm"};
inline constexpr RouteKind RouteKind::kTcp{"tcp"};
inline constexpr RouteKind RouteKind::kDevice{"device"};

// route.name() as a string: "local", "shm", "tcp", "device", "ucx", ... or "none". (A copy, so
// that it outlives a temporary route.)
inline std::string RouteKindName(const RouteKind& route) { return std::string(route.name()); }

// Identifies a segment inside its owner engine. Never reused by that engine.
using SegmentId = uint64_t;
// A segment opened by this engine (local view of a possibly remote segment).
using SegmentHandle = uint64_t;
// A submitted batch.
using BatchId = uint64_t;

// Everything a peer needs to reach a segment. Obtained from the owner (ListPeerSegments) or from
// a metadata service; serializable to JSON.
struct LARDER_EXPORT SegmentDescriptor {
  SegmentId segment_id = 0;
  std::string name;       // unique per owner engine
  uint64_t epoch = 0;     // changes whenever an id would be re-registered
  std::string engine_id;  // "<host_id>/<pid>/<fingerprint>"
  std::string host_id;    // kernel boot id or LARDER_HOST_ID
  std::string address;    // "ip:port" of the owner engine (its address(): descriptor queries)
  uint64_t size = 0;
  MemoryKind memory_kind = MemoryKind::kAnonymous;
  uint64_t page_size = 4096;  // of the memory behind it: 4 KiB, 2 MiB or 1 GiB
  // How each of the owner's transports is reached for this segment, by transport name: an opaque
  // blob that only that transport reads (tcp: its data server's endpoint; shm: the handoff
  // socket; ucx: the worker address and the segment's rkey). A transport with no entry does not
  // export the segment. At most kMaxTransports entries of at most kMaxBlobBytes each.
  std::map<std::string, std::string, std::less<>> transports;

  static constexpr size_t kMaxTransports = 16;
  static constexpr size_t kMaxBlobBytes = 64 * 1024;

  // The blob of transport `name`, or null.
  const std::string* TransportBlob(std::string_view name) const {
    auto it = transports.find(name);
    return it == transports.end() ? nullptr : &it->second;
  }

  // OK when what it says is within the bounds above: at most kMaxTransports blobs of at most
  // kMaxBlobBytes, transport names of 1 to RouteKind::kMaxNameBytes bytes, a page size that is a
  // power of two of at least 4 KiB. Both encodings (JSON here, the master's proto) check it.
  Status Validate() const;

  std::string ToJson() const;
  static Result<SegmentDescriptor> FromJson(std::string_view json);
};

struct LARDER_EXPORT TransferEngineOptions {
  // Which protocol variable applies when `protocol` is empty, and the default traffic class.
  EngineRole role = EngineRole::kPd;
  // The class of this engine's batches (see TrafficClass). kDefault: LARDER_TRAFFIC_CLASS
  // ("latency" or "bulk"), else latency for kPd (PD) engines and bulk for kStore engines.
  // Create fails with InvalidArgument for another LARDER_TRAFFIC_CLASS.
  TrafficClass traffic_class = TrafficClass::kDefault;
  // "auto" (local, then shm, then ucx where built, then tcp), one transport's name ("local", "shm",
  // "ucx", "tcp", "device"), or a comma list such as "shm,tcp" or "device,tcp". Routes are tried
  // in the registry's preference order whatever the order of the list. "auto" never includes
  // "device": ask for it by name. Empty: the role's environment variable (see
  // docs/configuration.md), else "auto". "tcp" forces the network even between processes on one
  // host; "ucx" forces UCX to every peer that exports through it.
  std::string protocol;
  // Address of this engine's server, which answers peers' descriptor queries and serves the tcp
  // route's frames (always runs; its address is address()): "ip:port", port 0 for a free one; a
  // host name in place of the ip is resolved to its IPv4 address.
  std::string listen_address = "127.0.0.1:0";
  // Cluster secret. Empty: LARDER_AUTH_TOKEN, else none. When set, both ends of every tcp
  // connection and shm handoff prove it to each other (HMAC over both nonces, both engine ids and
  // the connection), and this engine refuses peers that do not. See docs/security.md.
  std::string auth_token;
  // TLS on the tcp data plane (OpenSSL). tls_cert_file and tls_key_file (PEM): this engine's
  // certificate, which its data server presents; tls_ca_file (PEM): the CA that peers'
  // certificates must chain to. An engine with a CA speaks tcp only over TLS and refuses peers
  // that do not offer it. Empty: LARDER_TLS_CERT, LARDER_TLS_KEY, LARDER_TLS_CA, else no TLS.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_ca_file;
  // Make this process non-dumpable (prctl PR_SET_DUMPABLE 0) when the engine starts, so that other
  // processes of the same uid can neither open its memfds through /proc/PID/fd nor ptrace it;
  // peers still map its segments through the authenticated shm handoff. Also LARDER_NON_DUMPABLE=1.
  // It also turns off core dumps of this process. See docs/security.md.
  bool non_dumpable = false;
  // Host identity. Empty: LARDER_HOST_ID, else the kernel boot id.
  std::string host_id;
  // Threads that stripe large same-host copies. 0: min(4, hardware threads).
  size_t copy_threads = 0;
  // Same-host batches up to this many bytes are copied inside Submit.
  size_t inline_copy_bytes = 1024 * 1024;
  // TCP connections kept per peer and traffic class; slices are spread over them.
  size_t tcp_connections_per_peer = 4;
  // Requests are cut into slices of at most this size (pipelining and retry unit). Must be in
  // (0, 64 MiB]; Create fails with InvalidArgument otherwise.
  size_t slice_bytes = 4 * 1024 * 1024;
  // Deadline of a request when Submit is given none.
  std::chrono::milliseconds default_timeout = std::chrono::seconds(30);
  // Largest batch Submit accepts.
  size_t max_batch_requests = 65536;
  // Page size of AllocateSegmentMemory: "off", "2m", "1g" or "auto" (see HugePages). Empty:
  // LARDER_HUGE_PAGES, else "auto" when use_huge_pages, else "off". Create fails with
  // InvalidArgument for anything else.
  std::string huge_pages;
  // Shorthand for huge_pages = "auto".
  bool use_huge_pages = false;
  // Build the page tables of a whole peer segment when mapping it over shm (MAP_POPULATE). Off by
  // default: a peer's segment is mapped in O(1) whatever its size, and only the ranges that are
  // copied are faulted in (writes populate their range first, which is faster than faulting).
  // Populating a 1 TiB segment takes minutes and as much memory as the segment; do not.
  bool shm_prefault = false;
  // Uids allowed to map this engine's segments over shm. Empty: only this process's uid.
  std::vector<uint32_t> shm_allowed_uids;
  // When true, every local pointer must lie inside memory given to RegisterLocalMemory. (Transports
  // that need native registration require it regardless.)
  bool require_local_registration = false;
};

// Requests, bytes and failed requests, counted when a request finishes.
struct LARDER_EXPORT TransferCounters {
  uint64_t requests = 0;
  uint64_t bytes = 0;  // moved by requests that succeeded and by the parts of failed ones that did
  uint64_t failures = 0;
  TransferCounters& operator+=(const TransferCounters& other) {
    requests += other.requests;
    bytes += other.bytes;
    failures += other.failures;
    return *this;
  }
};

// What one route carried to and from one peer engine (this engine itself for kLocal).
struct LARDER_EXPORT PeerTransferStats {
  std::string engine_id;  // the peer: owner of the segments
  std::string host_id;    // its host identity
  std::string address;    // its engine address
  RouteKind route = RouteKind::kNone;
  TransferCounters reads;   // segment -> local
  TransferCounters writes;  // local -> segment
};

// Counters since the engine was created. Cheap to take: no transfer waits for it.
struct LARDER_EXPORT EngineStats {
  // One entry per (peer, route) that carried a request, sorted by engine_id then route.
  std::vector<PeerTransferStats> peers;
  // Peer segments mapped into this process over shm now, and their total size (address space;
  // resident memory is only what was copied).
  uint64_t mapped_segments = 0;
  uint64_t mapped_bytes = 0;
  // Mappings dropped because their owner's process exited.
  uint64_t mappings_dropped = 0;
  // Other processes' device allocations that the device route maps here now (imported from their
  // owners' handles) and their total size; imports made and refused since the engine was created,
  // and the time the made ones took in the device library.
  uint64_t device_imports = 0;
  uint64_t device_imported_bytes = 0;
  uint64_t device_import_calls = 0;
  uint64_t device_import_failures = 0;
  uint64_t device_import_ns = 0;
  // Device memory staged through pinned host memory for the CPU's routes (an engine with a device
  // transport): pinned buffers allocated (each of the staging chunk size) and leased now (0 when
  // nothing is being staged), times a transfer waited for a free one, bytes copied device -> host
  // and host -> device, and staging copies that failed.
  uint64_t staging_buffers = 0;
  uint64_t staging_buffers_in_use = 0;
  uint64_t staging_waits = 0;
  uint64_t staged_to_host_bytes = 0;
  uint64_t staged_to_device_bytes = 0;
  uint64_t staging_copy_failures = 0;

  // One of the values above, by name, with the transport that keeps it.
  struct Value {
    std::string_view transport;  // "shm", "device"
    std::string_view name;       // the field's name: "mapped_segments", "device_imports", ...
    uint64_t value = 0;
    bool gauge = false;  // a level now (true) or a count since the engine was created (false)
  };
  // Every value above, in declaration order: what ToJson writes and what a store client's
  // heartbeat reports of its gauges (the master's /metrics and /api/clients show each by its name),
  // so a transport's new value reaches all three by being listed here once.
  std::vector<Value> Values() const;

  // Reads and writes on `route` over every peer.
  TransferCounters ByRoute(RouteKind route) const;
  // Reads and writes with `engine_id` on `route`.
  TransferCounters ByPeer(std::string_view engine_id, RouteKind route) const;
  // {"peers":[{engine_id, host_id, address, route, reads:{requests,bytes,failures},
  //  writes:{...}}], "routes":{"shm":{requests,bytes,failures}, ...}, "mapped_segments":n, ...,
  //  "device_imports":n, ..., "staging_buffers":n, ...}
  std::string ToJson() const;
};

enum class TransferOp : uint8_t {
  kRead = 0,   // segment -> local
  kWrite = 1,  // local -> segment
};

struct LARDER_EXPORT TransferRequest {
  TransferOp op = TransferOp::kRead;
  void* local = nullptr;  // source (write) or destination (read); must stay valid until done
  SegmentHandle segment = 0;
  uint64_t offset = 0;  // inside the segment
  uint64_t length = 0;  // bytes; must be > 0 and offset + length <= segment size
};

struct LARDER_EXPORT TransferResult {
  Status status;                       // of this request alone
  uint64_t bytes = 0;                  // bytes moved; equals length when status is OK
  RouteKind route = RouteKind::kNone;  // route that moved the (last) bytes
};

class LARDER_EXPORT TransferEngine {
 public:
  // Creates an engine, starts its data server (and shm handoff server when shm is enabled).
  // Fails with InvalidArgument for an unknown protocol name or a bad listen address, and with the
  // OS error when the server cannot bind.
  static Result<std::unique_ptr<TransferEngine>> Create(const TransferEngineOptions& options);

  // Stops servers and transports. Slices still queued for a peer fail with Cancelled; slices
  // already on the wire finish or fail by their deadlines, which the destructor waits for.
  virtual ~TransferEngine() = default;

  // "<host_id>/<pid>/<fingerprint>": the fingerprint of the engine's key (identity_key()), so that
  // only this engine can prove the id.
  virtual const std::string& id() const = 0;
  // The engine's public key (Ed25519, 32 bytes), and its signature of `message`: what a master
  // session for this engine's id must show (docs/security.md). Empty for an engine without one.
  virtual std::string identity_key() const { return {}; }
  virtual std::string SignAsEngine(std::string_view message) const {
    (void)message;
    return {};
  }
  virtual const std::string& host_id() const = 0;
  // "ip:port" of the data server (the address peers use to open this engine's segments).
  virtual std::string address() const = 0;
  // Enabled routes in preference order, e.g. {kLocal, kSameHostShm, kTcp}.
  virtual std::vector<RouteKind> routes() const = 0;
  // Requests, bytes and failures by peer and route, and the peer mappings held.
  virtual EngineStats Stats() const = 0;

  // ---- Memory and segments (target side) ----

  // Allocates `size` bytes (rounded up to the page size) suited to export over the enabled routes:
  // a sealed memfd when shm is enabled, anonymous memory otherwise. The memory is zeroed and
  // sparse: it costs memory only where it is written, so a segment may be far larger than RAM.
  // Huge pages follow options.huge_pages. Fails with InvalidArgument for size 0 or a size the
  // address space cannot hold, and ResourceExhausted when memory or huge pages are short.
  virtual Result<std::shared_ptr<MemoryRegion>> AllocateSegmentMemory(size_t size) = 0;

  // Exports `memory` as segment `name`; the engine keeps a reference until unregistered.
  // Fails with AlreadyExists when `name` is taken.
  virtual Result<SegmentId> RegisterSegment(std::string name,
                                            std::shared_ptr<MemoryRegion> memory) = 0;
  // Exports caller-owned memory (not mappable by same-host peers: they use tcp).
  // REQUIRES: [base, base + size) stays valid until UnregisterSegment returns.
  virtual Result<SegmentId> RegisterSegment(std::string name, void* base, size_t size) = 0;
  // After this returns, no transfer touches the segment's memory. NotFound for unknown ids.
  // Peers that mapped it keep valid (but no longer updated by new writers) memory.
  virtual Status UnregisterSegment(SegmentId id) = 0;
  // Descriptors of this engine's exported segments.
  virtual std::vector<SegmentDescriptor> ListSegments() const = 0;

  // ---- Local buffers (initiator side) ----

  // Registers [ptr, ptr + size) as a source/destination of transfers. Overlapping registrations
  // fail with AlreadyExists. Only required with require_local_registration or by transports that
  // need native registration.
  virtual Status RegisterLocalMemory(void* ptr, size_t size) = 0;
  // NotFound when `ptr` does not start a registration.
  virtual Status UnregisterLocalMemory(void* ptr) = 0;

  // ---- Peers (initiator side) ----

  // Fetches the segment descriptors that the engine at `address` ("ip:port") exports, from that
  // engine itself. Unavailable when it cannot be reached; PermissionDenied on a token mismatch.
  virtual Result<std::vector<SegmentDescriptor>> ListPeerSegments(
      const std::string& address, std::chrono::milliseconds timeout) = 0;
  // Opens a segment and picks its route: local (this engine's own segments), then shm (confirmed
  // by the fd handoff), then tcp, restricted to the enabled protocols. A failed shm handoff falls
  // back to tcp (logged once per peer). When no enabled route can reach the segment at all:
  // NotFound; when routes could but all failed to open: the last route's error (e.g.
  // PermissionDenied from a refused handoff with protocol "shm").
  // A second engine in the same process is reached over shm (one mapping, then memcpy).
  virtual Result<SegmentHandle> OpenSegment(const SegmentDescriptor& descriptor) = 0;
  // ListPeerSegments(address) then OpenSegment of the one named `name`.
  virtual Result<SegmentHandle> OpenSegment(const std::string& address,
                                            const std::string& name) = 0;
  virtual Status CloseSegment(SegmentHandle handle) = 0;
  // The route requests to this segment take (fallbacks may still move a slice elsewhere).
  virtual Result<RouteKind> SegmentRoute(SegmentHandle handle) const = 0;
  virtual Result<SegmentDescriptor> SegmentInfo(SegmentHandle handle) const = 0;

  // ---- Transfers ----

  // Starts every request of the batch. Requests that are malformed (unknown segment, length 0,
  // out-of-range or overflowing offsets, null pointer, unregistered local memory where required)
  // complete at once with their own error; the others proceed. Small same-host batches complete
  // before Submit returns. Each request must finish within `timeout` (0: default_timeout).
  // Fails as a whole only for an empty or oversized batch (InvalidArgument) or when
  // BatchTable's limit of 65536 unreleased batches is reached (ResourceExhausted).
  // REQUIRES: local buffers stay valid and untouched until the batch is complete.
  Result<BatchId> Submit(std::span<const TransferRequest> requests,
                         std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
    return Submit(requests, timeout, TrafficClass::kDefault);
  }
  // The same, as `traffic_class` work (kDefault: the engine's class).
  virtual Result<BatchId> Submit(std::span<const TransferRequest> requests,
                                 std::chrono::milliseconds timeout, TrafficClass traffic_class) = 0;
  // The class of this engine's batches, resolved (never kDefault).
  virtual TrafficClass traffic_class() const = 0;
  // True when every request of the batch has finished. NotFound for unknown ids.
  virtual Result<bool> Poll(BatchId batch) = 0;
  // Blocks until the batch is complete (OK) or `timeout` passes (DeadlineExceeded; the batch keeps
  // running and ends by its requests' deadlines). Inspect Results for per-request outcomes.
  virtual Status Wait(BatchId batch, std::chrono::milliseconds timeout) = 0;
  // Per-request outcomes, in submission order. FailedPrecondition while the batch is running.
  virtual Result<std::vector<TransferResult>> Results(BatchId batch) = 0;
  // OK when every request of the finished batch succeeded, else the first failed request's status
  // (prefixed with its index). FailedPrecondition while running; NotFound for unknown ids.
  virtual Status BatchStatus(BatchId batch) = 0;
  // Frees the batch. FailedPrecondition while it is running; NotFound for unknown ids.
  virtual Status Release(BatchId batch) = 0;

  // Submit, wait for completion (bounded by the requests' deadlines), Results, Release. Returns
  // the per-request results, or the Submit error.
  Result<std::vector<TransferResult>> TransferSync(
      std::span<const TransferRequest> requests,
      std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
};

// The protocol string that applies to `role` given explicit config `configured` (wins when
// non-empty) and the environment: LARDER_STORE_PROTOCOL (store role only, when non-empty), then
// LARDER_PROTOCOL, then "auto". Never modifies the environment.
LARDER_EXPORT std::string ResolveProtocol(EngineRole role, const std::string& configured);

// Parses a protocol string into routes in preference order. InvalidArgument for unknown names
// (the message lists the transports this build has).
LARDER_EXPORT Result<std::vector<RouteKind>> ParseProtocol(std::string_view protocol);

// How close a route is, from the transport registry: lower is closer (local, then device and shm,
// then ucx, then tcp). Routes this build does not have rank last.
LARDER_EXPORT int RoutePreference(RouteKind route);

}  // namespace larder
