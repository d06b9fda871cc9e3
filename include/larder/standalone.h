// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Attaching to larder-client, the per-host standalone daemon (docs/standalone.md).
//
// larder-client owns a StoreClient: it contributes the host's global segment, talks to the
// master and heartbeats. Inference processes on the host attach to it over a Unix socket and get
// a StoreClient that contributes nothing and owns nothing, so restarting an inference process
// loses no cache (ARCHITECTURE.md §5.3).
//
// Bytes never travel over the socket. The zero-copy API works on memory shared with the daemon:
// memory from AllocateShared (a sealed memfd this process maps and hands to the daemon), or a
// caller's own sealed memfd mapping given to RegisterSharedBuffer. The daemon maps the same pages
// and moves bytes between them and the segments with its own StoreClient's zero-copy calls. The
// copying API (Put, Get, BatchPut, BatchGet, BatchGetAllocated) stages values through a shared
// area of AttachOptions::staging_bytes, one memcpy on this side.
//
// Typical use:
//   LARDER_ASSIGN_OR_RETURN(auto store, AttachedStoreClient::Attach({.socket =
//   "@larder-client-50052"})); LARDER_ASSIGN_OR_RETURN(void* pool, store->AllocateShared(1 << 30));
//   ... write a KV page at pool ...
//   LARDER_RETURN_IF_ERROR(store->PutFrom("page-17", pool, 65536));
//
// When the daemon exits or the connection breaks, every call fails at once with Unavailable
// "larder-client at <socket> is gone: <why>"; a daemon that stops answering fails the call after
// AttachOptions::timeout the same way. Attach again once a daemon serves the socket.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "larder/export.h"
#include "larder/status.h"
#include "larder/store_client.h"

namespace larder {

// Every field has its default here and in docs/standalone.md.
struct LARDER_EXPORT AttachOptions {
  // The daemon's socket: "@name" (an abstract Unix socket), a filesystem path (anything with a
  // '/'), or "host:port" (Mooncake's client_server_address), which names "@larder-client-<port>".
  // Empty: LARDER_CLIENT_SOCKET, else "@larder-client-50052".
  std::string socket;
  // Bytes of shared memory the copying API stages values through (Mooncake's
  // local_buffer_size). A value larger than this fails with InvalidArgument naming the limit; 0
  // turns the copying API off. The memory is sparse: only bytes staged cost memory.
  uint64_t staging_bytes = 16ull << 20;
  // Longest wait for connecting and for each reply of the daemon. Past it the daemon is taken
  // for gone (see above).
  std::chrono::milliseconds timeout{60000};
  // How the daemon's log names this process. Empty: "pid <pid>".
  std::string client_name;

  // The defaults, overridden by LARDER_CLIENT_SOCKET and LARDER_LOCAL_BUFFER_SIZE (a size such as
  // "64MiB"). Errors: InvalidArgument naming the variable that does not parse.
  static Result<AttachOptions> FromEnvironment();
};

// A StoreClient served by larder-client. Objects, tenant and segment are the daemon's: two
// attached processes see each other's objects, segment_name() is the daemon's segment and
// client_id() the id the master knows the daemon by.
//
// Differences from StoreClient::Create's client:
//   - RegisterBuffer(ptr, size) succeeds only for ranges inside shared memory (AllocateShared or
//     RegisterSharedBuffer); elsewhere it fails with FailedPrecondition. Shared memory is
//     registered as a whole already, so RegisterBuffer is optional for it.
//   - The zero-copy calls fail per item with FailedPrecondition for a buffer outside shared
//     memory.
//   - engine() is a local-only TransferEngine of this process (protocol "local"): it moves no
//     store bytes; the daemon's engine does.
//   - RouteTo fails with Unimplemented: the daemon chooses routes.
//
// Thread-safety: every method may be called from any number of threads at once. Calls travel
// over one connection and the daemon serves several of them at a time; the copying API takes
// turns on the staging area.
class LARDER_EXPORT AttachedStoreClient : public StoreClient {
 public:
  // Connects to the daemon, checks that it runs as this process's uid or as root (else
  // PermissionDenied: another user could be impersonating it), says hello and maps the staging
  // area. Errors: Unavailable (no daemon serves the socket), PermissionDenied (the daemon refused
  // this uid, or runs as another), ResourceExhausted (it serves its --max-clients already),
  // InvalidArgument (bad socket address), FailedPrecondition (protocol version mismatch).
  static Result<std::unique_ptr<AttachedStoreClient>> Attach(const AttachOptions& options);

  // The socket as displayed: "@name" or a path.
  virtual const std::string& socket_address() const = 0;

  // Creates a sealed memfd of `size` bytes (rounded up to the page size), maps it here and in
  // the daemon, and returns its address: memory every zero-copy call accepts (Mooncake's
  // alloc_from_mem_pool). It is zeroed and sparse. The client owns it until FreeShared or its
  // destruction. Errors: InvalidArgument (size 0), ResourceExhausted, and the daemon's errors
  // (e.g. ResourceExhausted past its limit of shared regions per client).
  virtual Result<void*> AllocateShared(size_t size) = 0;
  // Unmaps memory from AllocateShared, here and in the daemon. REQUIRES: no call that uses it is
  // running. Errors: NotFound (ptr is not what AllocateShared returned).
  virtual Status FreeShared(void* ptr) = 0;

  // Shares [ptr, ptr + size) with the daemon: this process maps `fd` at `fd_offset` there, and
  // the daemon maps the same range of `fd`. `fd` must be a memfd sealed with F_SEAL_SHRINK (so
  // that its size cannot drop under the daemon's mapping), at least fd_offset + size bytes long,
  // not sealed against writes; fd_offset must be a multiple of the page size. The fd stays the
  // caller's (it may be closed once this returns). UnregisterBuffer(ptr) undoes it.
  // Errors: InvalidArgument (null, empty, overlapping shared memory, misaligned offset; from the
  // daemon: not a memfd, unsealed, too small), and the daemon's mmap errors.
  // REQUIRES: the mapping at ptr stays until UnregisterBuffer(ptr) or destruction.
  virtual Status RegisterSharedBuffer(void* ptr, size_t size, int fd, uint64_t fd_offset) = 0;
};

// AttachedStoreClient::Attach, as a plain StoreClient.
LARDER_EXPORT Result<std::unique_ptr<StoreClient>> AttachStoreClient(const AttachOptions& options);

}  // namespace larder
