// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Frames of the tcp data protocol. Every frame starts with a fixed 40-byte header:
//
//   u32 magic "LRD2" | u8 type | u8 code | u16 flags | u64 request_id | u64 segment_id |
//   u64 offset | u64 length
//
// followed by `length` payload bytes for kWrite, kReadReply (OK), kError (message), kHello, kAuth,
// kAuthOk and kDescribeReply (JSON). Fields are in host byte order (every supported platform is
// little-endian). The server checks every field and answers a bad frame with kError; after the
// error it closes the connection when it cannot find the next frame boundary (bad magic, unknown
// type, a write payload larger than kMaxFramePayload, a frame type clients never send) or when
// authentication failed or was skipped.
//
// Connection set-up (payload layouts and MACs in tcp_auth.h):
//   1. server -> client, in the clear: kHello. flags: kFlagTls when the server has a certificate,
//      kFlagNeedAuth when it has a cluster token; with kFlagNeedAuth the payload is the server
//      nonce Ns (32 random bytes) and the server's engine id, else empty.
//   2. kFlagTls: both sides run a TLS 1.3 handshake on the socket; every later byte is TLS. A
//      client with a CA refuses a hello without kFlagTls; a client without one refuses kFlagTls.
//   3. kFlagNeedAuth: client -> server kAuth: client nonce Nc, client engine id, the "ip:port" it
//      dialed, mac_c = HMAC(token, "larder-tcp-client-v1", Ns, Nc, server id, dialed, client id
//      [, TLS exporter]). The server recomputes mac_c with its own engine id and accepts only a
//      dialed endpoint that is its advertised endpoint or the local address of the connection.
//      server -> client kAuthOk: mac_s over the same fields labelled "larder-tcp-server-v1"; the
//      client checks it before sending any data frame. A client with a token refuses a hello
//      without kFlagNeedAuth (the server would not prove the token).
//
// Data frames (kRead, kWrite) carry kFlagLatency for latency-class work. A client never mixes the
// classes on one connection; the server thread of a connection that carries bulk work lowers its
// own scheduling priority (common/priority.h) and marks latency frames as latency work while it
// serves them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "larder/status.h"

namespace larder::transfer::wire {

inline constexpr uint32_t kFrameMagic = 0x3244524c;  // "LRD2"
inline constexpr size_t kFrameHeaderSize = 40;
// Largest data payload of one frame (the engine's slices are smaller).
inline constexpr uint64_t kMaxFramePayload = 64ULL << 20;
// Largest error message or control payload.
inline constexpr uint64_t kMaxControlPayload = 16ULL << 20;

enum class FrameType : uint8_t {
  kHello = 1,          // server -> client on connect; flags kFlagTls, kFlagNeedAuth (+ payload)
  kAuth = 2,           // client -> server: client nonce, engine id, dialed endpoint, mac_c
  kAuthOk = 3,         // server -> client: mac_s
  kRead = 4,           // client -> server: read [offset, offset+length) of segment_id
  kReadReply = 5,      // server -> client: payload = the bytes
  kWrite = 6,          // client -> server: payload = the bytes for [offset, offset+length)
  kWriteReply = 7,     // server -> client
  kDescribe = 8,       // client -> server: list exported segments
  kDescribeReply = 9,  // server -> client: payload = JSON array of descriptors
  kError = 10,         // server -> client: code + message payload
};

// kHello flags.
inline constexpr uint16_t kFlagNeedAuth = 1;  // the server has a token: both sides prove it
inline constexpr uint16_t kFlagTls = 2;       // the server requires TLS from the next byte on
// kRead / kWrite flags.
inline constexpr uint16_t kFlagLatency = 4;  // latency-class work (TrafficClass); else bulk

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  FrameType type = FrameType::kError;
  uint8_t code = 0;
  uint16_t flags = 0;
  uint64_t request_id = 0;
  uint64_t segment_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

inline void EncodeHeader(const FrameHeader& h, uint8_t* out) {
  std::memcpy(out, &h.magic, 4);
  out[4] = static_cast<uint8_t>(h.type);
  out[5] = h.code;
  std::memcpy(out + 6, &h.flags, 2);
  std::memcpy(out + 8, &h.request_id, 8);
  std::memcpy(out + 16, &h.segment_id, 8);
  std::memcpy(out + 24, &h.offset, 8);
  std::memcpy(out + 32, &h.length, 8);
}

// Decodes and validates the fixed fields. InvalidArgument for a bad magic or an unknown type.
inline Status DecodeHeader(const uint8_t* in, FrameHeader* h) {
  std::memcpy(&h->magic, in, 4);
  if (h->magic != kFrameMagic) return InvalidArgumentError("bad frame magic");
  uint8_t type = in[4];
  if (type < static_cast<uint8_t>(FrameType::kHello) ||
      type > static_cast<uint8_t>(FrameType::kError)) {
    return InvalidArgumentError("unknown frame type " + std::to_string(type));
  }
  h->type = static_cast<FrameType>(type);
  h->code = in[5];
  std::memcpy(&h->flags, in + 6, 2);
  std::memcpy(&h->request_id, in + 8, 8);
  std::memcpy(&h->segment_id, in + 16, 8);
  std::memcpy(&h->offset, in + 24, 8);
  std::memcpy(&h->length, in + 32, 8);
  return Status();
}

// The Status carried by a kError frame.
inline Status ErrorFrameStatus(uint8_t code, std::string message) {
  if (code == 0 || code > static_cast<uint8_t>(StatusCode::kUnauthenticated))
    code = static_cast<uint8_t>(StatusCode::kInternal);
  return Status(static_cast<StatusCode>(code), std::move(message));
}

}  // namespace larder::transfer::wire
