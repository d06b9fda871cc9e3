// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "standalone/protocol.h"

#include <cstring>
#include <limits>

#include "common/error_detail_wire.h"

namespace larder::standalone {
namespace {

constexpr uint8_t kMaxStatusCode = static_cast<uint8_t>(StatusCode::kUnauthenticated);
// Smallest encodings, for PayloadReader::Count.
constexpr size_t kStringMin = 4;
constexpr size_t kSliceBytes = 16;

}  // namespace

std::string MessageTypeName(uint16_t type) {
  if ((type & kReplyBit) != 0) return MessageTypeName(type & ~kReplyBit) + " reply";
  switch (static_cast<MessageType>(type)) {
    case MessageType::kHello:
      return "Hello";
    case MessageType::kRegisterShared:
      return "RegisterShared";
    case MessageType::kUnregisterShared:
      return "UnregisterShared";
    case MessageType::kBatchPutFrom:
      return "BatchPutFrom";
    case MessageType::kBatchPutFromSlices:
      return "BatchPutFromSlices";
    case MessageType::kBatchGetInto:
      return "BatchGetInto";
    case MessageType::kBatchGetIntoSlices:
      return "BatchGetIntoSlices";
    case MessageType::kBatchGetRanges:
      return "BatchGetRanges";
    case MessageType::kBatchGetStaged:
      return "BatchGetStaged";
    case MessageType::kBatchExist:
      return "BatchExist";
    case MessageType::kGetSize:
      return "GetSize";
    case MessageType::kBatchRemove:
      return "BatchRemove";
    case MessageType::kRemoveAll:
      return "RemoveAll";
    case MessageType::kRemoveByRegex:
      return "RemoveByRegex";
    case MessageType::kBatchGetObjectInfo:
      return "BatchGetObjectInfo";
    case MessageType::kBatchRemoveReplicas:
      return "BatchRemoveReplicas";
    case MessageType::kBatchRemoveScoped:
      return "BatchRemoveScoped";
    case MessageType::kGoodbye:
      return "Goodbye";
  }
  return "type " + std::to_string(type);
}

bool IsRequestType(uint16_t type) {
  return type >= static_cast<uint16_t>(MessageType::kHello) &&
         type <= static_cast<uint16_t>(MessageType::kBatchRemoveScoped);
}

Status CheckHeader(const MessageHeader& header, uint32_t max_length) {
  if (header.magic != kMessageMagic) {
    return InvalidArgumentError("bad frame magic " + std::to_string(header.magic) +
                                " (not a larder-client protocol LSC1 peer)");
  }
  if (header.flags != 0 || header.reserved != 0) {
    return InvalidArgumentError("frame header has unknown flags or a non-zero reserved field");
  }
  if (header.length > max_length) {
    return InvalidArgumentError("frame of " + std::to_string(header.length) +
                                " payload bytes exceeds the limit of " +
                                std::to_string(max_length));
  }
  return Status::Ok();
}

// ---- PayloadWriter ----

void PayloadWriter::String(std::string_view value) {
  U32(static_cast<uint32_t>(value.size()));
  Raw(value.data(), value.size());
}

void PayloadWriter::PutStatus(const Status& status) {
  U8(static_cast<uint8_t>(status.code()));
  if (status.ok()) return;
  std::string_view message = status.message();
  String(message.substr(0, kMaxMessageBytes));
  U8(static_cast<uint8_t>(status.detail()));
}

void PayloadWriter::PutConfig(const larder::PutConfig& config) {
  U32(config.replica_num);
  U32(static_cast<uint32_t>(config.preferred_segments.size()));
  for (const std::string& segment : config.preferred_segments) String(segment);
  U8(config.pin ? 1 : 0);
  U8(static_cast<uint8_t>(config.soft_pin_action));
  U8(config.soft_pin_ttl.has_value() ? 1 : 0);
  U64(config.soft_pin_ttl
          ? static_cast<uint64_t>(std::max<int64_t>(0, config.soft_pin_ttl->count()))
          : 0);
  U8(config.overwrite ? 1 : 0);
  U8(config.disk_write_through ? 1 : 0);
}

void PayloadWriter::Keys(std::span<const std::string> keys) {
  U32(static_cast<uint32_t>(keys.size()));
  for (const std::string& key : keys) String(key);
}

// ---- PayloadReader ----

bool PayloadReader::Take(void* out, size_t n) {
  if (!ok()) {
    std::memset(out, 0, n);
    return false;
  }
  if (data_.size() - pos_ < n) {
    Fail("payload ends early (at byte " + std::to_string(pos_) + " of " +
         std::to_string(data_.size()) + ")");
    std::memset(out, 0, n);
    return false;
  }
  std::memcpy(out, data_.data() + pos_, n);
  pos_ += n;
  return true;
}

uint8_t PayloadReader::U8() {
  uint8_t v;
  Take(&v, sizeof(v));
  return v;
}
uint16_t PayloadReader::U16() {
  uint16_t v;
  Take(&v, sizeof(v));
  return v;
}
uint32_t PayloadReader::U32() {
  uint32_t v;
  Take(&v, sizeof(v));
  return v;
}
uint64_t PayloadReader::U64() {
  uint64_t v;
  Take(&v, sizeof(v));
  return v;
}

bool PayloadReader::Bool(const char* what) {
  uint8_t v = U8();
  if (v > 1) Fail(std::string(what) + " is " + std::to_string(v) + ", not 0 or 1");
  return v == 1;
}

std::string PayloadReader::String(uint32_t max, const char* what) {
  uint32_t n = U32();
  if (!ok()) return {};
  if (n > max) {
    Fail(std::string(what) + " of " + std::to_string(n) + " bytes exceeds the limit of " +
         std::to_string(max));
    return {};
  }
  if (data_.size() - pos_ < n) {
    Fail(std::string(what) + " of " + std::to_string(n) + " bytes runs past the payload");
    return {};
  }
  std::string out(data_.substr(pos_, n));
  pos_ += n;
  return out;
}

uint32_t PayloadReader::Count(uint32_t max, size_t min_item_bytes, const char* what) {
  uint32_t n = U32();
  if (!ok()) return 0;
  if (n > max) {
    Fail(std::to_string(n) + " " + what + " exceed the limit of " + std::to_string(max) +
         "; split the batch");
    return 0;
  }
  if (min_item_bytes > 0 && (data_.size() - pos_) / min_item_bytes < n) {
    Fail(std::to_string(n) + " " + what + " cannot fit in the " +
         std::to_string(data_.size() - pos_) + " bytes left");
    return 0;
  }
  return n;
}

Status PayloadReader::GetStatus() {
  uint8_t code = U8();
  if (!ok() || code == 0) return Status::Ok();
  if (code > kMaxStatusCode) {
    Fail("unknown status code " + std::to_string(code));
    return Status::Ok();
  }
  std::string message = String(kMaxMessageBytes, "status message");
  // A detail this build does not know reads as none: the code still holds.
  const ErrorDetail detail = ErrorDetailFromNumber(U8());
  if (!ok()) return Status::Ok();
  return Status(static_cast<StatusCode>(code), std::move(message)).WithDetail(detail);
}

larder::PutConfig PayloadReader::PutConfig() {
  larder::PutConfig config;
  config.replica_num = U32();
  uint32_t preferred = Count(kMaxPreferredSegments, kStringMin, "preferred segments");
  for (uint32_t i = 0; i < preferred && ok(); ++i) {
    config.preferred_segments.push_back(String(kMaxNameBytes, "preferred segment name"));
  }
  config.pin = Bool("pin");
  uint8_t action = U8();
  if (action > static_cast<uint8_t>(kLastSoftPinAction)) {
    Fail("unknown soft pin action " + std::to_string(action));
  }
  config.soft_pin_action = static_cast<SoftPinAction>(action);
  bool has_ttl = Bool("has_soft_pin_ttl");
  uint64_t ttl_ms = U64();
  if (ttl_ms > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    Fail("soft pin TTL out of range");
  } else if (has_ttl) {
    config.soft_pin_ttl = std::chrono::milliseconds(static_cast<int64_t>(ttl_ms));
  }
  config.overwrite = Bool("overwrite");
  config.disk_write_through = Bool("disk_write_through");
  return config;
}

std::vector<std::string> PayloadReader::Keys() {
  std::vector<std::string> keys;
  uint32_t n = Count(kMaxBatchKeys, kStringMin, "keys");
  keys.reserve(n);
  for (uint32_t i = 0; i < n && ok(); ++i) keys.push_back(String(kMaxKeyBytes, "key"));
  return keys;
}

void PayloadReader::Fail(std::string message) {
  if (error_.empty()) error_ = std::move(message);
}

Status PayloadReader::Finish() const {
  if (!ok()) return InvalidArgumentError("malformed payload: " + error_);
  if (pos_ != data_.size()) {
    return InvalidArgumentError("malformed payload: " + std::to_string(data_.size() - pos_) +
                                " trailing bytes");
  }
  return Status::Ok();
}

// ---- requests ----

void Encode(const HelloRequest& request, PayloadWriter* out) {
  out->U32(request.version);
  out->String(request.client_name);
}

HelloRequest DecodeHelloRequest(PayloadReader* in) {
  HelloRequest request;
  request.version = in->U32();
  request.client_name = in->String(kMaxNameBytes, "client name");
  return request;
}

void Encode(const HelloReply& reply, PayloadWriter* out) {
  out->U32(reply.version);
  out->String(reply.segment_name);
  out->String(reply.tenant_id);
  out->String(reply.client_id);
  out->U32(reply.max_frame_bytes);
  out->U32(reply.max_batch_keys);
  out->U32(reply.max_key_bytes);
  out->U32(reply.max_regions);
  out->U32(reply.max_in_flight);
}

HelloReply DecodeHelloReply(PayloadReader* in) {
  HelloReply reply;
  reply.version = in->U32();
  reply.segment_name = in->String(kMaxNameBytes, "segment name");
  reply.tenant_id = in->String(kMaxNameBytes, "tenant");
  reply.client_id = in->String(kMaxNameBytes, "client id");
  reply.max_frame_bytes = in->U32();
  reply.max_batch_keys = in->U32();
  reply.max_key_bytes = in->U32();
  reply.max_regions = in->U32();
  reply.max_in_flight = in->U32();
  return reply;
}

void Encode(const RegisterSharedRequest& request, PayloadWriter* out) {
  out->U64(request.client_address);
  out->U64(request.size);
  out->U64(request.fd_offset);
}

RegisterSharedRequest DecodeRegisterShared(PayloadReader* in) {
  RegisterSharedRequest request;
  request.client_address = in->U64();
  request.size = in->U64();
  request.fd_offset = in->U64();
  return request;
}

void EncodeKeyedBuffers(std::span<const KeyedBuffer> items, PayloadWriter* out) {
  out->U32(static_cast<uint32_t>(items.size()));
  for (const KeyedBuffer& item : items) {
    out->String(item.key);
    out->U64(item.buffer.address);
    out->U64(item.buffer.size);
  }
}

std::vector<KeyedBuffer> DecodeKeyedBuffers(PayloadReader* in) {
  std::vector<KeyedBuffer> items(in->Count(kMaxBatchKeys, kStringMin + kSliceBytes, "keys"));
  for (KeyedBuffer& item : items) {
    item.key = in->String(kMaxKeyBytes, "key");
    item.buffer.address = in->U64();
    item.buffer.size = in->U64();
    if (!in->ok()) break;
  }
  return items;
}

void EncodeSlicedKeys(std::span<const SlicedKey> items, PayloadWriter* out) {
  out->U32(static_cast<uint32_t>(items.size()));
  for (const SlicedKey& item : items) {
    out->String(item.key);
    out->U32(static_cast<uint32_t>(item.slices.size()));
    for (const WireSlice& slice : item.slices) {
      out->U64(slice.address);
      out->U64(slice.size);
    }
  }
}

std::vector<SlicedKey> DecodeSlicedKeys(PayloadReader* in) {
  std::vector<SlicedKey> items(in->Count(kMaxBatchKeys, kStringMin + 4, "keys"));
  size_t total = 0;
  for (SlicedKey& item : items) {
    item.key = in->String(kMaxKeyBytes, "key");
    uint32_t n = in->Count(kMaxSlicesPerKey, kSliceBytes, "slices of one key");
    total += n;
    if (total > kMaxSlicesPerBatch) {
      in->Fail("more than " + std::to_string(kMaxSlicesPerBatch) + " slices in one batch");
    }
    if (!in->ok()) break;
    item.slices.resize(n);
    for (WireSlice& slice : item.slices) {
      slice.address = in->U64();
      slice.size = in->U64();
    }
  }
  return items;
}

void EncodeRanges(std::span<const WireRange> items, PayloadWriter* out) {
  out->U32(static_cast<uint32_t>(items.size()));
  for (const WireRange& item : items) {
    out->String(item.key);
    out->U64(item.offset);
    out->U64(item.buffer.address);
    out->U64(item.buffer.size);
  }
}

std::vector<WireRange> DecodeRanges(PayloadReader* in) {
  std::vector<WireRange> items(in->Count(kMaxBatchKeys, kStringMin + 24, "ranges"));
  for (WireRange& item : items) {
    item.key = in->String(kMaxKeyBytes, "key");
    item.offset = in->U64();
    item.buffer.address = in->U64();
    item.buffer.size = in->U64();
    if (!in->ok()) break;
  }
  return items;
}

void Encode(const StagedGetRequest& request, PayloadWriter* out) {
  out->U64(request.staging.address);
  out->U64(request.staging.size);
  out->Keys(request.keys);
}

StagedGetRequest DecodeStagedGet(PayloadReader* in) {
  StagedGetRequest request;
  request.staging.address = in->U64();
  request.staging.size = in->U64();
  request.keys = in->Keys();
  return request;
}

// ---- replies ----

void EncodeStatuses(std::span<const Status> statuses, PayloadWriter* out) {
  out->U32(static_cast<uint32_t>(statuses.size()));
  for (const Status& status : statuses) out->PutStatus(status);
}

namespace {

uint32_t ExpectCount(PayloadReader* in, size_t expected, size_t min_item_bytes) {
  uint32_t n = in->Count(kMaxBatchKeys, min_item_bytes, "results");
  if (in->ok() && n != expected) {
    in->Fail(std::to_string(n) + " results for " + std::to_string(expected) + " items");
    return 0;
  }
  return n;
}

}  // namespace

std::vector<Status> DecodeStatuses(PayloadReader* in, size_t expected) {
  uint32_t n = ExpectCount(in, expected, 1);
  std::vector<Status> statuses;
  statuses.reserve(n);
  for (uint32_t i = 0; i < n && in->ok(); ++i) statuses.push_back(in->GetStatus());
  return statuses;
}

void EncodeSizes(std::span<const Result<size_t>> sizes, PayloadWriter* out) {
  out->U32(static_cast<uint32_t>(sizes.size()));
  for (const Result<size_t>& size : sizes) {
    out->PutStatus(size.status());
    if (size.ok()) out->U64(*size);
  }
}

std::vector<Result<size_t>> DecodeSizes(PayloadReader* in, size_t expected) {
  uint32_t n = ExpectCount(in, expected, 1);
  std::vector<Result<size_t>> sizes;
  sizes.reserve(n);
  for (uint32_t i = 0; i < n && in->ok(); ++i) {
    Status status = in->GetStatus();
    if (status.ok()) {
      sizes.emplace_back(static_cast<size_t>(in->U64()));
    } else {
      sizes.emplace_back(status);
    }
  }
  return sizes;
}

void EncodeBools(std::span<const Result<bool>> values, PayloadWriter* out) {
  out->U32(static_cast<uint32_t>(values.size()));
  for (const Result<bool>& value : values) {
    out->PutStatus(value.status());
    if (value.ok()) out->U8(*value ? 1 : 0);
  }
}

std::vector<Result<bool>> DecodeBools(PayloadReader* in, size_t expected) {
  uint32_t n = ExpectCount(in, expected, 1);
  std::vector<Result<bool>> values;
  values.reserve(n);
  for (uint32_t i = 0; i < n && in->ok(); ++i) {
    Status status = in->GetStatus();
    if (status.ok()) {
      values.emplace_back(in->Bool("exists"));
    } else {
      values.emplace_back(status);
    }
  }
  return values;
}

void EncodeObjectInfos(std::span<const Result<ObjectInfo>> infos, PayloadWriter* out) {
  out->U32(static_cast<uint32_t>(infos.size()));
  for (const Result<ObjectInfo>& info : infos) {
    out->PutStatus(info.status());
    if (!info.ok()) continue;
    out->U64(info->size);
    out->U32(static_cast<uint32_t>(info->replicas.size()));
    for (const ReplicaInfo& replica : info->replicas) {
      out->String(replica.segment_name);
      out->U64(replica.offset);
      out->U64(replica.address);
      out->String(replica.endpoint);
    }
  }
}

std::vector<Result<ObjectInfo>> DecodeObjectInfos(PayloadReader* in, size_t expected) {
  uint32_t n = ExpectCount(in, expected, 1);
  std::vector<Result<ObjectInfo>> infos;
  infos.reserve(n);
  for (uint32_t i = 0; i < n && in->ok(); ++i) {
    Status status = in->GetStatus();
    if (!status.ok()) {
      infos.emplace_back(status);
      continue;
    }
    ObjectInfo info;
    info.size = in->U64();
    uint32_t replicas = in->Count(kMaxReplicasPerKey, 2 * kStringMin + 16, "replicas");
    for (uint32_t r = 0; r < replicas && in->ok(); ++r) {
      ReplicaInfo replica;
      replica.segment_name = in->String(kMaxNameBytes, "segment name");
      replica.offset = in->U64();
      replica.address = in->U64();
      replica.endpoint = in->String(kMaxNameBytes, "endpoint");
      info.replicas.push_back(std::move(replica));
    }
    infos.emplace_back(std::move(info));
  }
  return infos;
}

void EncodeStagedItems(std::span<const StagedItem> items, PayloadWriter* out) {
  out->U32(static_cast<uint32_t>(items.size()));
  for (const StagedItem& item : items) {
    out->U8(item.kind);
    if (item.kind == StagedItem::kFailed) out->PutStatus(item.status);
    if (item.kind == StagedItem::kPlaced) {
      out->U64(item.size);
      out->U64(item.offset);
    }
  }
}

std::vector<StagedItem> DecodeStagedItems(PayloadReader* in, size_t expected) {
  uint32_t n = ExpectCount(in, expected, 1);
  std::vector<StagedItem> items(n);
  for (StagedItem& item : items) {
    item.kind = in->U8();
    if (item.kind == StagedItem::kFailed) {
      item.status = in->GetStatus();
      if (item.status.ok()) in->Fail("a failed staged item carries an OK status");
    } else if (item.kind == StagedItem::kPlaced) {
      item.size = in->U64();
      item.offset = in->U64();
    } else if (item.kind != StagedItem::kDeferred) {
      in->Fail("unknown staged item kind " + std::to_string(item.kind));
    }
    if (!in->ok()) break;
  }
  return items;
}

}  // namespace larder::standalone
