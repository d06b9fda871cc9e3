// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The conformance suite every StoreClient implementation passes (store_client_conformance.cc):
// the same calls, checked the same way, whichever implementation answers them. An implementation
// takes part by instantiating the suite with a StoreClientUnderTest, e.g.
//
//   INSTANTIATE_TEST_SUITE_P(InProcess, StoreClientConformanceTest,
//       ::testing::Values(StoreClientUnderTest{"InProcess", MakeInProcessClient}),
//       StoreClientCaseName);
//
// in a test binary that links larder_store_client_conformance. The suite checks what
// include/larder/store_client.h promises of every implementation: per-key results in batches, the
// single-key forms agreeing with the batch forms, immutable objects, the zero-copy calls over
// memory the implementation accepts, ranged reads, and removal. Test-only.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "larder/store_client.h"

namespace larder::testutil {

// One client of a fresh, empty store, and what keeps that store running.
class StoreClientFixture {
 public:
  virtual ~StoreClientFixture() = default;
  virtual StoreClient& client() = 0;
  // `size` bytes that the client's zero-copy calls accept (registered with it, or shared with
  // its daemon), valid until the fixture goes. Null when they cannot be had.
  virtual void* ZeroCopyMemory(size_t size) = 0;
};

struct StoreClientUnderTest {
  std::string name;  // the test's name suffix
  std::function<Result<std::unique_ptr<StoreClientFixture>>()> make;
};

inline std::string StoreClientCaseName(const ::testing::TestParamInfo<StoreClientUnderTest>& info) {
  return info.param.name;
}

inline std::ostream& operator<<(std::ostream& os, const StoreClientUnderTest& c) {
  return os << c.name;
}

class StoreClientConformanceTest : public ::testing::TestWithParam<StoreClientUnderTest> {
 protected:
  void SetUp() override;
  StoreClient& client() { return fixture_->client(); }
  std::unique_ptr<StoreClientFixture> fixture_;
};

}  // namespace larder::testutil
