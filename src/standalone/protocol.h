// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The larder-client socket protocol "LSC1" (docs/standalone.md): length-prefixed frames carrying
// a small binary encoding, shared by the daemon (daemon.cc, attach_connection.cc) and the attach
// side (attach.cc).
//
// Every frame is a 24-byte MessageHeader and `length` payload bytes. Integers are little-endian
// (host order; both ends are on one host). A payload is a sequence of fields: u8/u16/u32/u64, and
// strings as a u32 length and the bytes. Requests are decoded with PayloadReader, which checks
// every length against what is left and against a limit before it allocates, and fails for a
// missing or trailing byte: a decoder never trusts the peer.
//
// Thread-safety: the types here are values; PayloadReader and PayloadWriter are used by one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/limits.h"
#include "larder/status.h"
#include "larder/store_client.h"

namespace larder::standalone {

inline constexpr uint32_t kMessageMagic = 0x3143534c;  // "LSC1"
// 2: a status carries its ErrorDetail after the message.
// 3: kBatchRemoveReplicas. 4: kBatchRemoveScoped. 5: PutConfig::disk_write_through.
inline constexpr uint32_t kProtocolVersion = 5;

// Limits both ends enforce; the daemon announces them in its Hello reply.
inline constexpr uint32_t kMaxFrameBytes = 64u << 20;  // payload of one frame
inline constexpr uint32_t kMaxKeyBytes = 65535;        // the master's own ceiling
inline constexpr uint32_t kMaxSlicesPerKey = 65536;
inline constexpr uint32_t kMaxSlicesPerBatch = 1u << 20;
inline constexpr uint32_t kMaxPreferredSegments = 1024;
inline constexpr uint32_t kMaxNameBytes = 4096;      // segment names, tenant, client name
inline constexpr uint32_t kMaxPatternBytes = 65536;  // RemoveByRegex
inline constexpr uint32_t kMaxMessageBytes = 4096;   // error messages (longer ones are cut)
inline constexpr uint32_t kMaxReplicasPerKey = 1024;

enum class MessageType : uint16_t {
  kHello = 1,
  kRegisterShared = 2,  // carries one fd (SCM_RIGHTS)
  kUnregisterShared = 3,
  kBatchPutFrom = 4,
  kBatchPutFromSlices = 5,
  kBatchGetInto = 6,
  kBatchGetIntoSlices = 7,
  kBatchGetRanges = 8,
  kBatchGetStaged = 9,  // the copying API's gets: the daemon places values in a staging region
  kBatchExist = 10,
  kGetSize = 11,
  kBatchRemove = 12,
  kRemoveAll = 13,
  kRemoveByRegex = 14,
  kBatchGetObjectInfo = 15,
  kBatchRemoveReplicas = 16,  // BatchRemove's payload with the segment's name after `force`
  // BatchRemove's payload with the segment's name ("" for whole objects) and unused_for in ms
  // (u32) after `force`.
  kBatchRemoveScoped = 17,
  // Daemon -> client, request_id 0, unsolicited: why the daemon closes the connection (refused
  // uid, too many clients, malformed frame, shutting down). Payload: a status.
  kGoodbye = 0x7fff,
};
// A reply's type is its request's type with this bit set.
inline constexpr uint16_t kReplyBit = 0x8000;

// "Hello", "BatchPutFrom", ..., "Hello reply"; "type <n>" for unknown values.
std::string MessageTypeName(uint16_t type);
// True for the request types above (not kGoodbye, not replies).
bool IsRequestType(uint16_t type);

struct MessageHeader {
  uint32_t magic = kMessageMagic;
  uint16_t type = 0;
  uint16_t flags = 0;  // none defined: must be 0
  uint64_t request_id = 0;
  uint32_t length = 0;    // payload bytes
  uint32_t reserved = 0;  // must be 0
};
static_assert(sizeof(MessageHeader) == 24);

// OK when the header is well formed for a frame of at most `max_length` payload bytes; otherwise
// InvalidArgument saying what is wrong.
Status CheckHeader(const MessageHeader& header, uint32_t max_length);

// Appends fields to a payload.
class PayloadWriter {
 public:
  void U8(uint8_t value) { Raw(&value, 1); }
  void U16(uint16_t value) { Raw(&value, sizeof(value)); }
  void U32(uint32_t value) { Raw(&value, sizeof(value)); }
  void U64(uint64_t value) { Raw(&value, sizeof(value)); }
  void String(std::string_view value);
  // Code byte, then (when not OK) the message, cut to kMaxMessageBytes.
  void PutStatus(const Status& status);
  void PutConfig(const larder::PutConfig& config);
  void Keys(std::span<const std::string> keys);

  const std::string& data() const { return data_; }
  std::string Take() { return std::move(data_); }

 private:
  void Raw(const void* p, size_t n) { data_.append(static_cast<const char*>(p), n); }
  std::string data_;
};

// Reads fields from a payload. The first failure sticks: later reads return zeros, and status()
// says what went wrong first.
class PayloadReader {
 public:
  explicit PayloadReader(std::string_view data) : data_(data) {}

  uint8_t U8();
  uint16_t U16();
  uint32_t U32();
  uint64_t U64();
  // A bool encoded as one byte, 0 or 1.
  bool Bool(const char* what);
  // A string of at most `max` bytes.
  std::string String(uint32_t max, const char* what);
  // A count of at most `max` items that each take at least `min_item_bytes` (so that a count
  // cannot promise more items than the bytes left hold).
  uint32_t Count(uint32_t max, size_t min_item_bytes, const char* what);
  Status GetStatus();
  larder::PutConfig PutConfig();
  std::vector<std::string> Keys();

  // Fails the reader with `message` (for semantic checks by callers).
  void Fail(std::string message);
  // OK when every read succeeded and every byte was read.
  Status Finish() const;
  bool ok() const { return error_.empty(); }

 private:
  bool Take(void* out, size_t n);
  std::string_view data_;
  size_t pos_ = 0;
  std::string error_;
};

// ---- request bodies (encoded by the attach side, decoded by the daemon) ----

struct HelloRequest {
  uint32_t version = kProtocolVersion;
  std::string client_name;
};

struct HelloReply {
  uint32_t version = kProtocolVersion;
  std::string segment_name;
  std::string tenant_id;
  std::string client_id;
  uint32_t max_frame_bytes = kMaxFrameBytes;
  uint32_t max_batch_keys = kMaxBatchKeys;
  uint32_t max_key_bytes = kMaxKeyBytes;
  uint32_t max_regions = 0;
  uint32_t max_in_flight = 0;
};

struct RegisterSharedRequest {
  uint64_t client_address = 0;  // where the client mapped the range
  uint64_t size = 0;
  uint64_t fd_offset = 0;
};

// One buffer of the client, by its address in the client.
struct WireSlice {
  uint64_t address = 0;
  uint64_t size = 0;
};

// BatchPutFrom / BatchGetInto: key i and one buffer (its size, or its capacity for gets).
struct KeyedBuffer {
  std::string key;
  WireSlice buffer;
};

struct SlicedKey {
  std::string key;
  std::vector<WireSlice> slices;
};

struct WireRange {
  std::string key;
  uint64_t offset = 0;
  WireSlice buffer;
};

struct StagedGetRequest {
  WireSlice staging;  // a region of shared memory the daemon places values in
  std::vector<std::string> keys;
};

// One item of a BatchGetStaged reply.
struct StagedItem {
  enum Kind : uint8_t { kPlaced = 0, kFailed = 1, kDeferred = 2 };
  uint8_t kind = kFailed;
  Status status;        // kFailed
  uint64_t size = 0;    // kPlaced
  uint64_t offset = 0;  // kPlaced: inside the staging region
};

void Encode(const HelloRequest& request, PayloadWriter* out);
HelloRequest DecodeHelloRequest(PayloadReader* in);
void Encode(const HelloReply& reply, PayloadWriter* out);
HelloReply DecodeHelloReply(PayloadReader* in);

void Encode(const RegisterSharedRequest& request, PayloadWriter* out);
RegisterSharedRequest DecodeRegisterShared(PayloadReader* in);

void EncodeKeyedBuffers(std::span<const KeyedBuffer> items, PayloadWriter* out);
std::vector<KeyedBuffer> DecodeKeyedBuffers(PayloadReader* in);
void EncodeSlicedKeys(std::span<const SlicedKey> items, PayloadWriter* out);
std::vector<SlicedKey> DecodeSlicedKeys(PayloadReader* in);
void EncodeRanges(std::span<const WireRange> items, PayloadWriter* out);
std::vector<WireRange> DecodeRanges(PayloadReader* in);
void Encode(const StagedGetRequest& request, PayloadWriter* out);
StagedGetRequest DecodeStagedGet(PayloadReader* in);

// ---- reply bodies (after the reply's leading status, when it is OK) ----

void EncodeStatuses(std::span<const Status> statuses, PayloadWriter* out);
// Exactly `expected` statuses; the reader fails otherwise.
std::vector<Status> DecodeStatuses(PayloadReader* in, size_t expected);
void EncodeSizes(std::span<const Result<size_t>> sizes, PayloadWriter* out);
std::vector<Result<size_t>> DecodeSizes(PayloadReader* in, size_t expected);
void EncodeBools(std::span<const Result<bool>> values, PayloadWriter* out);
std::vector<Result<bool>> DecodeBools(PayloadReader* in, size_t expected);
void EncodeObjectInfos(std::span<const Result<ObjectInfo>> infos, PayloadWriter* out);
std::vector<Result<ObjectInfo>> DecodeObjectInfos(PayloadReader* in, size_t expected);
void EncodeStagedItems(std::span<const StagedItem> items, PayloadWriter* out);
std::vector<StagedItem> DecodeStagedItems(PayloadReader* in, size_t expected);

}  // namespace larder::standalone
