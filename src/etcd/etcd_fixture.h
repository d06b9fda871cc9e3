// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// A GoogleTest fixture with a real etcd of its own (etcd_test_server.h), started for each test;
// the test is skipped, saying why, where no etcd binary is found. A fixture that derives from it
// and sets up more calls EtcdTest::SetUp() first and returns when IsSkipped() or
// HasFatalFailure(). Header-only, for test binaries that link larder_etcd_testing.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "etcd/etcd_test_server.h"

namespace larder::etcd {

class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!EtcdTestServer::Available(&why)) GTEST_SKIP() << why;
    auto server = EtcdTestServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    etcd_ = std::move(*server);
  }

  std::unique_ptr<EtcdTestServer> etcd_;
};

}  // namespace larder::etcd
