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

#include <string>

namespace larder {

inline std::string SerializeForMac(const google::protobuf::MessageLite& message) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    message.SerializeToCodedStream(&coded);
  }
  return out;
}

}  // namespace larder
