// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/wire/auth.h"

#include <cstring>

#include "common/net.h"

namespace larder::transfer::wire {
namespace {

// Payload fields are a u16 length (host order, like every integer of the protocol) and the bytes.
void AppendField(std::string* out, const void* data, size_t len) {
  auto prefix = static_cast<uint16_t>(len);
  out->append(reinterpret_cast<const char*>(&prefix), sizeof(prefix));
  out->append(static_cast<const char*>(data), len);
}

void AppendField(std::string* out, std::string_view field) {
  AppendField(out, field.data(), field.size());
}

class FieldReader {
 public:
  FieldReader(std::string_view payload, const char* frame) : rest_(payload), frame_(frame) {}

  // The next field, which must be [min, max] bytes long.
  Status Next(const char* field, size_t min, size_t max, std::string_view* out) {
    uint16_t len = 0;
    if (rest_.size() < sizeof(len)) return Malformed(std::string(field) + " is missing");
    std::memcpy(&len, rest_.data(), sizeof(len));
    rest_.remove_prefix(sizeof(len));
    if (len > rest_.size()) return Malformed(std::string(field) + " runs past the payload");
    if (len < min || len > max) {
      return Malformed(
          std::string(field) + " has " + std::to_string(len) + " bytes, want " +
          (min == max ? std::to_string(min) : std::to_string(min) + ".." + std::to_string(max)));
    }
    *out = rest_.substr(0, len);
    rest_.remove_prefix(len);
    return Status();
  }

  template <size_t N>
  Status NextFixed(const char* field, std::array<uint8_t, N>* out) {
    std::string_view bytes;
    LARDER_RETURN_IF_ERROR(Next(field, N, N, &bytes));
    std::memcpy(out->data(), bytes.data(), N);
    return Status();
  }

  Status Finish() {
    if (!rest_.empty()) return Malformed(std::to_string(rest_.size()) + " trailing bytes");
    return Status();
  }

 private:
  Status Malformed(const std::string& why) const {
    return InvalidArgumentError("malformed " + std::string(frame_) + " payload: " + why);
  }

  std::string_view rest_;
  const char* frame_;
};

AuthMac Mac(std::string_view label, std::string_view token, const TcpAuthBinding& b) {
  MacInput input(label);
  input.Add(b.server_nonce.data(), b.server_nonce.size())
      .Add(b.client_nonce.data(), b.client_nonce.size())
      .Add(b.server_engine_id)
      .Add(b.dialed_endpoint)
      .Add(b.client_engine_id);
  if (!b.channel_binding.empty()) input.Add(b.channel_binding);
  return input.Sign(token);
}

}  // namespace

AuthMac TcpClientMac(std::string_view token, const TcpAuthBinding& binding) {
  return Mac("larder-tcp-client-v1", token, binding);
}

AuthMac TcpServerMac(std::string_view token, const TcpAuthBinding& binding) {
  return Mac("larder-tcp-server-v1", token, binding);
}

std::string EncodeHello(const AuthNonce& server_nonce, std::string_view server_engine_id) {
  std::string out;
  AppendField(&out, server_nonce.data(), server_nonce.size());
  AppendField(&out, server_engine_id);
  return out;
}

Status DecodeHello(std::string_view payload, AuthNonce* server_nonce,
                   std::string* server_engine_id) {
  FieldReader reader(payload, "hello");
  std::string_view id;
  LARDER_RETURN_IF_ERROR(reader.NextFixed("server nonce", server_nonce));
  LARDER_RETURN_IF_ERROR(reader.Next("server engine id", 1, kMaxEngineIdBytes, &id));
  LARDER_RETURN_IF_ERROR(reader.Finish());
  *server_engine_id = std::string(id);
  return Status();
}

std::string EncodeAuth(const AuthRequest& request) {
  std::string out;
  AppendField(&out, request.client_nonce.data(), request.client_nonce.size());
  AppendField(&out, request.client_engine_id);
  AppendField(&out, request.dialed_endpoint);
  AppendField(&out, request.mac.data(), request.mac.size());
  return out;
}

Status DecodeAuth(std::string_view payload, AuthRequest* request) {
  FieldReader reader(payload, "auth");
  std::string_view id, endpoint;
  LARDER_RETURN_IF_ERROR(reader.NextFixed("client nonce", &request->client_nonce));
  LARDER_RETURN_IF_ERROR(reader.Next("client engine id", 1, kMaxEngineIdBytes, &id));
  LARDER_RETURN_IF_ERROR(reader.Next("dialed endpoint", 1, kMaxEndpointBytes, &endpoint));
  LARDER_RETURN_IF_ERROR(reader.NextFixed("mac", &request->mac));
  LARDER_RETURN_IF_ERROR(reader.Finish());
  request->client_engine_id = std::string(id);
  request->dialed_endpoint = std::string(endpoint);
  return Status();
}

std::string EncodeAuthOk(const AuthMac& mac) {
  std::string out;
  AppendField(&out, mac.data(), mac.size());
  return out;
}

Status DecodeAuthOk(std::string_view payload, AuthMac* mac) {
  FieldReader reader(payload, "auth-ok");
  LARDER_RETURN_IF_ERROR(reader.NextFixed("mac", mac));
  return reader.Finish();
}

}  // namespace larder::transfer::wire
