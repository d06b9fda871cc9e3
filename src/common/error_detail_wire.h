// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// An ErrorDetail on the control plane: in a gRPC status's error details for a whole call
// ("larder:detail:N"), in ItemStatus.detail for one item. A value this build does not know reads
// as kNone: the error is then handled by its code alone.
#pragma once

#include <string>
#include <string_view>

#include "larder/status.h"

namespace larder {

inline ErrorDetail ErrorDetailFromNumber(uint64_t number) {
  switch (number) {
    case static_cast<uint64_t>(ErrorDetail::kRemountRequired):
    case static_cast<uint64_t>(ErrorDetail::kLeaseExpired):
    case static_cast<uint64_t>(ErrorDetail::kBeingWritten):
    case static_cast<uint64_t>(ErrorDetail::kLeased):
    case static_cast<uint64_t>(ErrorDetail::kRebuilding):
    case static_cast<uint64_t>(ErrorDetail::kUnknownSession):
    case static_cast<uint64_t>(ErrorDetail::kOnDisk):
      return static_cast<ErrorDetail>(number);
    default:
      return ErrorDetail::kNone;
  }
}

inline constexpr std::string_view kErrorDetailWirePrefix = "larder:detail:";

// "" for kNone.
inline std::string ErrorDetailToWire(ErrorDetail detail) {
  if (detail == ErrorDetail::kNone) return {};
  return std::string(kErrorDetailWirePrefix) + std::to_string(static_cast<unsigned>(detail));
}

inline ErrorDetail ErrorDetailFromWire(std::string_view details) {
  if (!details.starts_with(kErrorDetailWirePrefix)) return ErrorDetail::kNone;
  details.remove_prefix(kErrorDetailWirePrefix.size());
  if (details.size() != 1 || details[0] < '0' || details[0] > '9') return ErrorDetail::kNone;
  return ErrorDetailFromNumber(static_cast<uint64_t>(details[0] - '0'));
}

}  // namespace larder
