// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The conformance suite (transfer/testing/conformance.h) over the ucx transport: a target engine
// that exports through ucx beside its other routes, and an initiator that speaks only ucx, so that
// every transfer goes through UCX (here over its tcp and shared-memory transports).
#include <gtest/gtest.h>

#include "transfer/testing/conformance.h"

namespace larder::testutil {
namespace {

INSTANTIATE_TEST_SUITE_P(Ucx, ConformanceTest,
                         ::testing::Values(TwoEngineCase("ucx", "ucx", RouteKind("ucx"),
                                                         {.completes_small_batches_inline = false,
                                                          .segment_memory = MemoryKind::kMemfd})),
                         TransportCaseName);

}  // namespace
}  // namespace larder::testutil
