// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "standalone/attach_connection.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <span>
#include <type_traits>
#include <utility>

#include "client/store_client_internal.h"
#include "common/env.h"
#include "common/logging.h"

namespace larder::standalone {
namespace {

// Staged values start on this boundary, so that the client copies them out aligned.
constexpr uint64_t kStagingAlignment = 64;

std::string RangeText(uint64_t address, uint64_t size) {
  // Appended piece by piece: GCC 12 at -O3 warns (-Wrestrict) about `"[" + std::string`.
  std::string text = "[";
  text += FormatHex(address);
  text += ", +";
  text += std::to_string(size);
  text += ")";
  return text;
}

uint64_t MappingLength(const std::shared_ptr<SharedMapping>& mapping) { return mapping->size(); }

}  // namespace

SharedMapping::~SharedMapping() {
  store_->UnregisterBuffer(local_).IgnoreError();
  munmap(local_, size_);
}

AttachConnection::AttachConnection(StoreClient* store, AttachConnectionOptions options,
                                   std::string peer)
    : store_(store), options_(std::move(options)), peer_(std::move(peer)) {}

AttachConnection::~AttachConnection() {
  MutexLock lock(mu_);
  regions_.clear();
}

size_t AttachConnection::region_count() const {
  MutexLock lock(mu_);
  return regions_.size();
}

Result<void*> AttachConnection::Translate(uint64_t address, uint64_t size, RegionPins* pins) const {
  MutexLock lock(mu_);
  auto it = client::FindEnclosingRange(regions_, address, size, MappingLength);
  if (it != regions_.end()) {
    pins->Add(it->second);
    return static_cast<void*>(it->second->local() + (address - it->first));
  }
  return FailedPreconditionError("buffer " + RangeText(address, size) +
                                 " is not inside memory this client shares with larder-client; "
                                 "allocate it with AllocateShared or register it with "
                                 "RegisterSharedBuffer");
}

std::string AttachConnection::Handle(uint16_t type, std::string_view payload, Fd fd) {
  PayloadReader in(payload);
  PayloadWriter body;
  Status status;
  const auto message = static_cast<MessageType>(type);
  if (fd.valid() && message != MessageType::kRegisterShared) {
    status = InvalidArgumentError(MessageTypeName(type) +
                                  " carries a file descriptor; only "
                                  "RegisterShared may");
  } else {
    switch (message) {
      case MessageType::kHello:
        status = Hello(&in, &body);
        break;
      case MessageType::kRegisterShared:
        status = RegisterShared(&in, std::move(fd));
        break;
      case MessageType::kUnregisterShared:
        status = UnregisterShared(&in);
        break;
      case MessageType::kBatchPutFrom:
        status = BatchPutFrom(&in, &body);
        break;
      case MessageType::kBatchPutFromSlices:
        status = BatchPutFromSlices(&in, &body);
        break;
      case MessageType::kBatchGetInto:
        status = BatchGetInto(&in, &body);
        break;
      case MessageType::kBatchGetIntoSlices:
        status = BatchGetIntoSlices(&in, &body);
        break;
      case MessageType::kBatchGetRanges:
        status = BatchGetRanges(&in, &body);
        break;
      case MessageType::kBatchGetStaged:
        status = BatchGetStaged(&in, &body);
        break;
      case MessageType::kBatchExist:
        status = BatchExist(&in, &body);
        break;
      case MessageType::kGetSize:
        status = GetSize(&in, &body);
        break;
      case MessageType::kBatchRemove:
      case MessageType::kBatchRemoveReplicas:
      case MessageType::kBatchRemoveScoped:
        status = BatchRemove(&in, &body, static_cast<MessageType>(type));
        break;
      case MessageType::kRemoveAll:
        status = RemoveAll(&in, &body);
        break;
      case MessageType::kRemoveByRegex:
        status = RemoveByRegex(&in, &body);
        break;
      case MessageType::kBatchGetObjectInfo:
        status = BatchGetObjectInfo(&in, &body);
        break;
      default:
        status = InvalidArgumentError("unknown request " + MessageTypeName(type));
    }
  }
  PayloadWriter reply;
  if (status.ok() && sizeof(uint8_t) + body.data().size() > kMaxFrameBytes) {
    status = ResourceExhaustedError("the reply to " + MessageTypeName(type) + " would exceed " +
                                    std::to_string(kMaxFrameBytes) + " bytes; split the batch");
  }
  reply.PutStatus(status);
  if (!status.ok()) return reply.Take();
  std::string out = reply.Take();
  out += body.data();
  return out;
}

// Each handler decodes its whole request before acting on it, so that a malformed payload
// changes nothing.

Status AttachConnection::Hello(PayloadReader* in, PayloadWriter* out) {
  HelloRequest request = DecodeHelloRequest(in);
  LARDER_RETURN_IF_ERROR(in->Finish());
  if (request.version != kProtocolVersion) {
    return FailedPreconditionError("client speaks larder-client protocol version " +
                                   std::to_string(request.version) + "; this daemon speaks " +
                                   std::to_string(kProtocolVersion));
  }
  Log().info("larder-client: {} attached ({})", peer_,
             request.client_name.empty() ? "unnamed" : request.client_name);
  HelloReply reply;
  reply.segment_name = store_->segment_name();
  reply.tenant_id = options_.tenant_id;
  reply.client_id = store_->client_id();
  reply.max_regions = static_cast<uint32_t>(options_.max_regions);
  reply.max_in_flight = static_cast<uint32_t>(options_.max_in_flight);
  Encode(reply, out);
  return Status::Ok();
}

Status AttachConnection::RegisterShared(PayloadReader* in, Fd fd) {
  RegisterSharedRequest request = DecodeRegisterShared(in);
  LARDER_RETURN_IF_ERROR(in->Finish());
  const std::string range = RangeText(request.client_address, request.size);
  if (!fd.valid()) return InvalidArgumentError("RegisterShared " + range + " carries no fd");
  if (request.client_address == 0 || request.size == 0) {
    return InvalidArgumentError("RegisterShared: null or empty range " + range);
  }
  if (request.client_address > UINT64_MAX - request.size) {
    return InvalidArgumentError("RegisterShared: range " + range + " wraps around");
  }
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (request.fd_offset % page != 0) {
    return InvalidArgumentError("RegisterShared: fd offset " + std::to_string(request.fd_offset) +
                                " is not a multiple of the page size " + std::to_string(page));
  }
  if (request.fd_offset > UINT64_MAX - request.size ||
      request.fd_offset + request.size > static_cast<uint64_t>(INT64_MAX)) {
    return InvalidArgumentError("RegisterShared: fd offset + size overflows");
  }
  // Seals first: once F_SEAL_SHRINK is on, the size read next can only grow.
  int seals = fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0) {
    return InvalidArgumentError("RegisterShared " + range + ": the fd is not a memfd (" +
                                std::string(std::strerror(errno)) +
                                "); share memory from AllocateShared or a sealed memfd");
  }
  if ((seals & F_SEAL_SHRINK) == 0) {
    return InvalidArgumentError("RegisterShared " + range +
                                ": the memfd is not sealed with F_SEAL_SHRINK, so it could "
                                "shrink under larder-client's mapping; seal it first");
  }
  if ((seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0) {
    return InvalidArgumentError("RegisterShared " + range +
                                ": the memfd is sealed against writes; gets could not fill it");
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return ErrnoToStatus(errno, "RegisterShared: fstat");
  if (!S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) < request.fd_offset + request.size) {
    return InvalidArgumentError("RegisterShared " + range + ": the memfd holds " +
                                std::to_string(st.st_size) + " bytes, fewer than fd offset " +
                                std::to_string(request.fd_offset) + " + size " +
                                std::to_string(request.size));
  }
  {
    MutexLock lock(mu_);
    if (regions_.size() >= options_.max_regions) {
      return ResourceExhaustedError("RegisterShared: this client has " +
                                    std::to_string(regions_.size()) +
                                    " shared regions, the most larder-client allows");
    }
    if (client::OverlapsRange(regions_, request.client_address, request.size, MappingLength)) {
      return InvalidArgumentError("RegisterShared: " + range +
                                  " overlaps a region this client shared before");
    }
  }
  void* local = mmap(nullptr, request.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(),
                     static_cast<off_t>(request.fd_offset));
  if (local == MAP_FAILED) return ErrnoToStatus(errno, "RegisterShared " + range + ": mmap");
  Status registered = store_->RegisterBuffer(local, request.size);
  if (!registered.ok()) {
    munmap(local, request.size);
    return registered.WithContext("RegisterShared " + range);
  }
  auto mapping =
      std::make_shared<SharedMapping>(store_, request.client_address, request.size, local);
  MutexLock lock(mu_);
  // Checked again: another request of this client may have taken the range meanwhile.
  if (client::OverlapsRange(regions_, request.client_address, request.size, MappingLength) ||
      regions_.size() >= options_.max_regions) {
    return InvalidArgumentError("RegisterShared: " + range +
                                " overlaps a region this client shared meanwhile");
  }
  regions_.emplace(request.client_address, std::move(mapping));
  return Status::Ok();
}

Status AttachConnection::UnregisterShared(PayloadReader* in) {
  uint64_t address = in->U64();
  LARDER_RETURN_IF_ERROR(in->Finish());
  std::shared_ptr<SharedMapping> removed;  // unmapped outside the lock, once no request uses it
  MutexLock lock(mu_);
  auto it = regions_.find(address);
  if (it == regions_.end()) {
    return NotFoundError("UnregisterShared: no region of this client starts at " +
                         FormatHex(address));
  }
  removed = std::move(it->second);
  regions_.erase(it);
  return Status::Ok();
}

namespace {

// The items of a request whose client buffers all translated, gathered for one store call: their
// places in the request, their keys, their buffers in this process, and the regions those lie in
// (kept mapped while the subset lives).
template <typename Local>
struct Subset {
  std::vector<size_t> index;
  std::vector<std::string> keys;
  std::vector<Local> locals;
  RegionPins pins;
};

Result<BufferSlice> LocalBuffer(const AttachConnection& connection, const WireSlice& buffer,
                                RegionPins* pins) {
  LARDER_ASSIGN_OR_RETURN(void* ptr, connection.Translate(buffer.address, buffer.size, pins));
  return BufferSlice{ptr, static_cast<size_t>(buffer.size)};
}

// An item's buffers in this process: the one buffer of a KeyedBuffer or a WireRange, every slice
// of a SlicedKey. Errors: the first that does not translate.
Result<BufferSlice> LocalBuffers(const AttachConnection& connection, const KeyedBuffer& item,
                                 RegionPins* pins) {
  return LocalBuffer(connection, item.buffer, pins);
}

Result<BufferSlice> LocalBuffers(const AttachConnection& connection, const WireRange& item,
                                 RegionPins* pins) {
  return LocalBuffer(connection, item.buffer, pins);
}

Result<std::vector<BufferSlice>> LocalBuffers(const AttachConnection& connection,
                                              const SlicedKey& item, RegionPins* pins) {
  std::vector<BufferSlice> local;
  local.reserve(item.slices.size());
  for (const WireSlice& slice : item.slices) {
    LARDER_ASSIGN_OR_RETURN(BufferSlice piece, LocalBuffer(connection, slice, pins));
    local.push_back(piece);
  }
  return local;
}

// Runs `call` (Subset& -> std::vector<R>, a result per subset item) once on the items whose
// buffers all translate, and returns a result per item of the request: the call's, or the item's
// translation error. Places start as `unset`. The keys move out of `items`.
template <typename R, typename Item, typename CallFn>
std::vector<R> CallOnShared(const AttachConnection& connection, std::vector<Item>& items, R unset,
                            CallFn call) {
  using Local = std::decay_t<decltype(*LocalBuffers(connection, items.front(), nullptr))>;
  std::vector<R> results(items.size(), std::move(unset));
  Subset<Local> valid;
  for (size_t i = 0; i < items.size(); ++i) {
    Result<Local> local = LocalBuffers(connection, items[i], &valid.pins);
    if (!local.ok()) {
      results[i] = local.status();
      continue;
    }
    valid.index.push_back(i);
    valid.keys.push_back(std::move(items[i].key));
    valid.locals.push_back(std::move(*local));
  }
  client::ScatterResults(valid.index, call(valid), &results);
  return results;
}

// Where a get's size goes until the store answers for it.
Result<size_t> NotRead() { return InternalError("not read"); }

// Single buffers as the pointer and size lists of BatchPutFrom and BatchGetInto.
struct SplitBuffers {
  explicit SplitBuffers(std::span<const BufferSlice> buffers) {
    ptrs.reserve(buffers.size());
    sizes.reserve(buffers.size());
    for (const BufferSlice& buffer : buffers) {
      ptrs.push_back(buffer.ptr);
      sizes.push_back(buffer.size);
    }
  }
  std::vector<void*> ptrs;
  std::vector<size_t> sizes;
};

}  // namespace

Status AttachConnection::BatchPutFrom(PayloadReader* in, PayloadWriter* out) {
  PutConfig config = in->PutConfig();
  std::vector<KeyedBuffer> items = DecodeKeyedBuffers(in);
  LARDER_RETURN_IF_ERROR(in->Finish());
  auto put = [&](Subset<BufferSlice>& valid) {
    SplitBuffers split(valid.locals);
    return store_->BatchPutFrom(valid.keys, split.ptrs, split.sizes, config);
  };
  EncodeStatuses(CallOnShared(*this, items, Status::Ok(), put), out);
  return Status::Ok();
}

Status AttachConnection::BatchPutFromSlices(PayloadReader* in, PayloadWriter* out) {
  PutConfig config = in->PutConfig();
  std::vector<SlicedKey> items = DecodeSlicedKeys(in);
  LARDER_RETURN_IF_ERROR(in->Finish());
  auto put = [&](Subset<std::vector<BufferSlice>>& valid) {
    return store_->BatchPutFromSlices(valid.keys, valid.locals, config);
  };
  EncodeStatuses(CallOnShared(*this, items, Status::Ok(), put), out);
  return Status::Ok();
}

Status AttachConnection::BatchGetInto(PayloadReader* in, PayloadWriter* out) {
  std::vector<KeyedBuffer> items = DecodeKeyedBuffers(in);
  LARDER_RETURN_IF_ERROR(in->Finish());
  auto get = [&](Subset<BufferSlice>& valid) {
    SplitBuffers split(valid.locals);
    return store_->BatchGetInto(valid.keys, split.ptrs, split.sizes);
  };
  EncodeSizes(CallOnShared(*this, items, NotRead(), get), out);
  return Status::Ok();
}

Status AttachConnection::BatchGetIntoSlices(PayloadReader* in, PayloadWriter* out) {
  std::vector<SlicedKey> items = DecodeSlicedKeys(in);
  LARDER_RETURN_IF_ERROR(in->Finish());
  auto get = [&](Subset<std::vector<BufferSlice>>& valid) {
    return store_->BatchGetIntoSlices(valid.keys, valid.locals);
  };
  EncodeSizes(CallOnShared(*this, items, NotRead(), get), out);
  return Status::Ok();
}

Status AttachConnection::BatchGetRanges(PayloadReader* in, PayloadWriter* out) {
  std::vector<WireRange> items = DecodeRanges(in);
  LARDER_RETURN_IF_ERROR(in->Finish());
  auto get = [&](Subset<BufferSlice>& valid) {
    std::vector<ObjectRange> ranges;
    ranges.reserve(valid.index.size());
    for (size_t j = 0; j < valid.index.size(); ++j) {
      ranges.push_back(ObjectRange{std::move(valid.keys[j]), items[valid.index[j]].offset,
                                   valid.locals[j].ptr, valid.locals[j].size});
    }
    return store_->BatchGetRanges(ranges);
  };
  EncodeSizes(CallOnShared(*this, items, NotRead(), get), out);
  return Status::Ok();
}

Status AttachConnection::BatchGetStaged(PayloadReader* in, PayloadWriter* out) {
  StagedGetRequest request = DecodeStagedGet(in);
  LARDER_RETURN_IF_ERROR(in->Finish());
  RegionPins pins;
  LARDER_ASSIGN_OR_RETURN(void* base,
                          Translate(request.staging.address, request.staging.size, &pins));
  const uint64_t capacity = request.staging.size;
  std::vector<StagedItem> items(request.keys.size());
  uint64_t used = 0;
  // Values are placed one after another in the order their sizes become known; one that does not
  // fit in what is left is deferred to the client's next round, one larger than the whole
  // area fails.
  auto allocate = [&](size_t i, uint64_t size) -> Result<void*> {
    StagedItem& item = items[i];
    if (item.kind == StagedItem::kPlaced && item.size == size) {
      return static_cast<void*>(static_cast<char*>(base) + item.offset);  // a retried read
    }
    if (size > capacity) {
      item.kind = StagedItem::kFailed;
      return InvalidArgumentError("value of key '" + request.keys[i] + "' has " +
                                  std::to_string(size) + " bytes; the staging area holds " +
                                  std::to_string(capacity) +
                                  " (AttachOptions::staging_bytes); read it with GetInto");
    }
    uint64_t at = (used + kStagingAlignment - 1) / kStagingAlignment * kStagingAlignment;
    if (at > capacity || size > capacity - at) {
      item.kind = StagedItem::kDeferred;
      return AbortedError("deferred to the next round");
    }
    used = at + size;
    item.kind = StagedItem::kPlaced;
    item.size = size;
    item.offset = at;
    return static_cast<void*>(static_cast<char*>(base) + at);
  };
  std::vector<Result<size_t>> results = store_->BatchGetAllocated(request.keys, allocate);
  for (size_t i = 0; i < items.size(); ++i) {
    if (results[i].ok()) {
      items[i].size = *results[i];
      if (items[i].kind != StagedItem::kPlaced) {
        items[i].kind = StagedItem::kFailed;
        items[i].status = InternalError("read without a staging place");
      }
    } else if (items[i].kind != StagedItem::kDeferred) {
      items[i].kind = StagedItem::kFailed;
      items[i].status = results[i].status();
    }
  }
  EncodeStagedItems(items, out);
  return Status::Ok();
}

Status AttachConnection::BatchExist(PayloadReader* in, PayloadWriter* out) {
  std::vector<std::string> keys = in->Keys();
  LARDER_RETURN_IF_ERROR(in->Finish());
  EncodeBools(store_->BatchExist(keys), out);
  return Status::Ok();
}

Status AttachConnection::GetSize(PayloadReader* in, PayloadWriter* out) {
  std::string key = in->String(kMaxKeyBytes, "key");
  LARDER_RETURN_IF_ERROR(in->Finish());
  LARDER_ASSIGN_OR_RETURN(uint64_t size, store_->GetSize(key));
  out->U64(size);
  return Status::Ok();
}

Status AttachConnection::BatchRemove(PayloadReader* in, PayloadWriter* out, MessageType type) {
  RemoveScope scope;
  scope.force = in->Bool("force");
  if (type != MessageType::kBatchRemove) scope.segment = in->String(kMaxNameBytes, "segment");
  if (type == MessageType::kBatchRemoveScoped) {
    scope.unused_for = std::chrono::milliseconds(in->U32());
  }
  std::vector<std::string> keys = in->Keys();
  LARDER_RETURN_IF_ERROR(in->Finish());
  if (type == MessageType::kBatchRemoveReplicas && scope.segment.empty()) {
    return InvalidArgumentError("BatchRemoveReplicas names no segment");
  }
  LARDER_RETURN_IF_ERROR(scope.Validate());
  EncodeStatuses(store_->BatchRemoveReplicas(keys, scope), out);
  return Status::Ok();
}

Status AttachConnection::RemoveAll(PayloadReader* in, PayloadWriter* out) {
  bool force = in->Bool("force");
  LARDER_RETURN_IF_ERROR(in->Finish());
  LARDER_ASSIGN_OR_RETURN(uint64_t removed, store_->RemoveAll(force));
  out->U64(removed);
  return Status::Ok();
}

Status AttachConnection::RemoveByRegex(PayloadReader* in, PayloadWriter* out) {
  bool force = in->Bool("force");
  std::string pattern = in->String(kMaxPatternBytes, "pattern");
  LARDER_RETURN_IF_ERROR(in->Finish());
  LARDER_ASSIGN_OR_RETURN(uint64_t removed, store_->RemoveByRegex(pattern, force));
  out->U64(removed);
  return Status::Ok();
}

Status AttachConnection::BatchGetObjectInfo(PayloadReader* in, PayloadWriter* out) {
  std::vector<std::string> keys = in->Keys();
  LARDER_RETURN_IF_ERROR(in->Finish());
  EncodeObjectInfos(store_->BatchGetObjectInfo(keys), out);
  return Status::Ok();
}

}  // namespace larder::standalone
