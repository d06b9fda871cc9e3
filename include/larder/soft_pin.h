// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The soft-pin action of a put: one definition for the store client's API, the master and the
// daemon's protocol. On the wire it is proto::SoftPinAction (master.proto), whose values these are
// (checked where the two meet), and one byte in the daemon's protocol.
#pragma once

#include <cstdint>

namespace larder {

// What a put does to the soft pin of its object, applied when the object becomes readable (the
// put's end).
enum class SoftPinAction : uint8_t {
  kPreserve = 0,  // an overwritten key keeps its soft pin (and deadline); a new key gets none
  kEnable = 1,    // soft-pinned until the put's end + PutConfig::soft_pin_ttl (the master's default
                  // if unset)
  kDisable = 2,   // not soft-pinned
};

// The highest action defined; a larger value from a peer is refused as unknown.
inline constexpr SoftPinAction kLastSoftPinAction = SoftPinAction::kDisable;

}  // namespace larder
