// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Fuzzes the parsers of configuration text (environment variables, flags, options): byte sizes,
// durations, host:port addresses, huge-page modes, protocol strings and the emulated device's peer
// groups (LARDER_EMULATED_DEVICE_PEERS). The first byte picks the
// parser; what parses must be sane (a port in range, a protocol of registered routes).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "common/env.h"
#include "common/net.h"
#include "larder/transfer_engine.h"
#include "testing/fuzz_check.h"
#include "transfer/device/emulated_device.h"

using namespace larder;  // NOLINT: a fuzz target

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 7) {
    case 0:
      (void)ParseByteSize(text);
      break;
    case 1:
      if (auto zero = ParseByteSize(text, /*allow_zero=*/true); zero.ok() && *zero != 0) {
        larder::test::FuzzCheck(ParseByteSize(text).ok());
      }
      break;
    case 2:
      if (auto d = ParseDuration(text); d.ok()) larder::test::FuzzCheck(d->count() >= 0);
      break;
    case 3:
      if (auto hp = ParseHostPort(text); hp.ok()) {
        larder::test::FuzzCheck(hp->host.find('\0') == std::string::npos);
        auto again = ParseHostPort(hp->ToString());
        larder::test::FuzzCheck(again.ok() && again->host == hp->host && again->port == hp->port);
      }
      break;
    case 4:
      if (auto mode = ParseHugePages(text); mode.ok()) {
        larder::test::FuzzCheck(ParseHugePages(HugePagesName(*mode)).ok());
      }
      break;
    case 6:
      // Empty: one group of every device; else a group (or -1: none) for each device.
      if (auto groups = transfer::ParsePeerGroups(text, 8); groups.ok() && !groups->empty()) {
        larder::test::FuzzCheck(groups->size() == 8);
        for (int group : *groups) larder::test::FuzzCheck(group >= -1 && group < 8);
      }
      break;
    default:
      if (auto routes = ParseProtocol(text); routes.ok()) {
        larder::test::FuzzCheck(!routes->empty());
        for (RouteKind route : *routes) larder::test::FuzzCheck(RoutePreference(route) < 1000000);
      }
      break;
  }
  return 0;
}
