// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

// The bytes of a control-plane request that its proof covers (src/common/control_auth.h): the
// message's deterministic serialization, which the client computes before sending and the master
// computes again from what it parsed. Header-only: it needs protobuf, which larder_common does not
// link.

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/message_lite.h>

#include <cstdint>
#include <string>

namespace larder {

// Writes those bytes into `out`, which holds `size` bytes: message.ByteSizeLong(), computed just
// before (it caches the sizes the serialization uses). False when they did not come out whole.
inline bool SerializeForMacTo(const google::protobuf::MessageLite& message, size_t size,
                              uint8_t* out) {
  google::protobuf::io::ArrayOutputStream array(out, static_cast<int>(size));
  google::protobuf::io::CodedOutputStream coded(&array);
  coded.SetSerializationDeterministic(true);
  message.SerializeWithCachedSizes(&coded);
  return !coded.HadError() && static_cast<size_t>(coded.ByteCount()) == size;
}

inline std::string SerializeForMac(const google::protobuf::MessageLite& message) {
  const size_t size = message.ByteSizeLong();
  std::string out(size, '\0');
  SerializeForMacTo(message, size, reinterpret_cast<uint8_t*>(out.data()));
  return out;
}

}  // namespace larder
