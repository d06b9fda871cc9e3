// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Fixed-size fields of device memory handles (ExportAllocation). A handle never leaves its host,
// so fields are in host byte order; every read is bounds-checked, since a handle is a peer's bytes.
#pragma once

#include <unistd.h>

#include <cstring>
#include <string>
#include <string_view>

#include "larder/status.h"

namespace larder::transfer::handle_codec {

template <typename T>
void Put(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(value));
}

// Reads a T from the front of `in`; false (and `in` unchanged) when it is too short.
template <typename T>
bool Take(std::string_view* in, T* value) {
  if (in->size() < sizeof(T)) return false;
  std::memcpy(value, in->data(), sizeof(T));
  in->remove_prefix(sizeof(T));
  return true;
}

// A u16 length and that many bytes.
inline void PutString(std::string* out, std::string_view value) {
  Put(out, static_cast<uint16_t>(value.size()));
  out->append(value);
}

inline bool TakeString(std::string_view* in, std::string* value) {
  uint16_t size = 0;
  std::string_view rest = *in;
  if (!Take(&rest, &size) || rest.size() < size) return false;
  value->assign(rest.substr(0, size));
  rest.remove_prefix(size);
  *in = rest;
  return true;
}

// The checks every import makes before it touches the device library: a handle opens on its own
// host only, and in another process than the exporter.
inline Status CheckOrigin(std::string_view handle_host, int32_t handle_pid,
                          std::string_view this_host) {
  if (handle_host != this_host) {
    return FailedPreconditionError("device memory handle of host '" + std::string(handle_host) +
                                   "'; this is host '" + std::string(this_host) +
                                   "': a handle opens on its own host only");
  }
  if (handle_pid == getpid()) {
    return FailedPreconditionError(
        "device memory handle exported by this process: an import maps another process's memory");
  }
  return Status();
}

}  // namespace larder::transfer::handle_codec
