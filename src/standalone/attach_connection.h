// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The daemon's side of one attached client: the shared regions it registered, and the handling
// of its requests on the daemon's StoreClient.
//
// Every request field is hostile. A client address becomes a daemon pointer only through
// Translate, which finds the region of this connection that holds the whole range (overflow-safe)
// and pins it for the request; anything else fails that item with FailedPrecondition. A fd
// becomes a mapping only when it is a memfd sealed against shrinking (so the client cannot make
// the daemon's mapping SIGBUS) and long enough for the range.
//
// Thread-safety: Handle may run on several threads at once; regions_ is guarded by mu_. A
// region unregistered while a request uses it stays mapped until that request ends.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/mutex.h"
#include "common/net.h"
#include "larder/store_client.h"
#include "standalone/protocol.h"

namespace larder::standalone {

struct AttachConnectionOptions {
  std::string tenant_id;      // the daemon's tenant, announced in Hello
  size_t max_regions = 1024;  // shared regions one client may register
  size_t max_in_flight = 8;   // announced in Hello: requests served at once
};

// A client's memfd range, mapped MAP_SHARED here and registered with the daemon's StoreClient.
// Unregisters and unmaps on destruction.
class SharedMapping {
 public:
  SharedMapping(StoreClient* store, uint64_t client_begin, uint64_t size, void* local)
      : store_(store), client_begin_(client_begin), size_(size), local_(local) {}
  ~SharedMapping();
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;

  uint64_t client_begin() const { return client_begin_; }
  uint64_t size() const { return size_; }
  char* local() const { return static_cast<char*>(local_); }

 private:
  StoreClient* store_;
  uint64_t client_begin_;
  uint64_t size_;
  void* local_;
};

// The mappings one request uses, kept alive until it ends.
class RegionPins {
 public:
  void Add(const std::shared_ptr<SharedMapping>& mapping) {
    if (!pins_.empty() && pins_.back() == mapping) return;
    for (const auto& pin : pins_) {
      if (pin == mapping) return;
    }
    pins_.push_back(mapping);
  }

 private:
  std::vector<std::shared_ptr<SharedMapping>> pins_;
};

class AttachConnection {
 public:
  // `store` outlives the connection. `peer` names the client in logs and errors.
  AttachConnection(StoreClient* store, AttachConnectionOptions options, std::string peer);
  ~AttachConnection();

  const std::string& peer() const { return peer_; }

  // Handles one request of `type` (IsRequestType) and returns the reply payload: a status, and
  // when it is OK the type's reply body. Malformed payloads get InvalidArgument. `fd` is the one
  // that came with the frame (only RegisterShared takes one; others refuse it).
  std::string Handle(uint16_t type, std::string_view payload, Fd fd);

  // The client address range [address, address + size) in this daemon, pinned in `pins`.
  // Errors: FailedPrecondition naming the range when no region of this connection holds it.
  Result<void*> Translate(uint64_t address, uint64_t size, RegionPins* pins) const;

  size_t region_count() const;

 private:
  Status Hello(PayloadReader* in, PayloadWriter* out);
  Status RegisterShared(PayloadReader* in, Fd fd);
  Status UnregisterShared(PayloadReader* in);
  Status BatchPutFrom(PayloadReader* in, PayloadWriter* out);
  Status BatchPutFromSlices(PayloadReader* in, PayloadWriter* out);
  Status BatchGetInto(PayloadReader* in, PayloadWriter* out);
  Status BatchGetIntoSlices(PayloadReader* in, PayloadWriter* out);
  Status BatchGetRanges(PayloadReader* in, PayloadWriter* out);
  Status BatchGetStaged(PayloadReader* in, PayloadWriter* out);
  Status BatchExist(PayloadReader* in, PayloadWriter* out);
  Status GetSize(PayloadReader* in, PayloadWriter* out);
  Status BatchRemove(PayloadReader* in, PayloadWriter* out, MessageType type);
  Status RemoveAll(PayloadReader* in, PayloadWriter* out);
  Status RemoveByRegex(PayloadReader* in, PayloadWriter* out);
  Status BatchGetObjectInfo(PayloadReader* in, PayloadWriter* out);

  StoreClient* const store_;
  const AttachConnectionOptions options_;
  const std::string peer_;
  mutable Mutex mu_;
  // By the client address of their first byte; never overlapping.
  std::map<uint64_t, std::shared_ptr<SharedMapping>> regions_ LARDER_GUARDED_BY(mu_);
};

}  // namespace larder::standalone
