// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Fuzzes the frame protocol's decoders (frame.h, auth.h): the 40-byte header and the kHello,
// kAuth and kAuthOk payloads that a frame server or client reads from an unauthenticated peer.
// Whatever decodes must encode back to the same bytes; nothing may crash or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "testing/fuzz_check.h"
#include "transfer/wire/auth.h"
#include "transfer/wire/frame.h"

using namespace larder::transfer::wire;  // NOLINT: a fuzz target of this namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size >= kFrameHeaderSize) {
    FrameHeader header;
    if (DecodeHeader(data, &header).ok()) {
      uint8_t again[kFrameHeaderSize];
      EncodeHeader(header, again);
      larder::test::FuzzCheck(std::memcmp(again, data, kFrameHeaderSize) == 0);
    }
  }
  std::string_view payload(reinterpret_cast<const char*>(data), size);
  if (payload.size() > kMaxAuthPayload) payload = payload.substr(0, kMaxAuthPayload);

  AuthNonce nonce;
  std::string engine_id;
  if (DecodeHello(payload, &nonce, &engine_id).ok()) {
    larder::test::FuzzCheck(engine_id.size() <= kMaxEngineIdBytes);
    larder::test::FuzzCheck(EncodeHello(nonce, engine_id) == payload);
  }
  AuthRequest request;
  if (DecodeAuth(payload, &request).ok()) {
    larder::test::FuzzCheck(request.client_engine_id.size() <= kMaxEngineIdBytes);
    larder::test::FuzzCheck(request.dialed_endpoint.size() <= kMaxEndpointBytes);
    larder::test::FuzzCheck(EncodeAuth(request) == payload);
  }
  AuthMac mac;
  if (DecodeAuthOk(payload, &mac).ok()) larder::test::FuzzCheck(EncodeAuthOk(mac) == payload);
  return 0;
}
