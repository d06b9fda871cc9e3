// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Which protocol an engine uses: the role's variable, the explicit setting, and protocol strings.
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/net.h"
#include "larder/transfer_engine.h"
#include "transfer/testing/engine_fixture.h"
#include "transfer/testing/test_util.h"

namespace larder {
namespace {

using testutil::AutoRoutes;
using testutil::CreateEngine;
using testutil::ScopedEnv;

class ProtocolResolutionTest : public ::testing::Test {
 protected:
  ScopedEnv protocol_{"LARDER_PROTOCOL", std::nullopt};
  ScopedEnv store_protocol_{"LARDER_STORE_PROTOCOL", std::nullopt};
};

// Every combination of the two variables unset, empty or set, for both roles, with and without
// explicit config: the documented rule, and neither variable ever rewritten.
TEST_F(ProtocolResolutionTest, EveryCombinationFollowsTheRule) {
  const std::optional<std::string> values[] = {std::nullopt, "", "x"};
  for (const auto& pd : values) {
    for (const auto& store : values) {
      std::optional<std::string> pd_value =
          pd ? std::optional<std::string>(*pd == "x" ? "tcp" : *pd) : std::nullopt;
      std::optional<std::string> store_value =
          store ? std::optional<std::string>(*store == "x" ? "device,tcp" : *store) : std::nullopt;
      ScopedEnv pd_env("LARDER_PROTOCOL", pd_value);
      ScopedEnv store_env("LARDER_STORE_PROTOCOL", store_value);
      for (EngineRole role : {EngineRole::kPd, EngineRole::kStore}) {
        for (std::string configured : {"", "shm"}) {
          std::string expected = "auto";
          if (pd_value && !pd_value->empty()) expected = *pd_value;
          if (role == EngineRole::kStore && store_value && !store_value->empty()) {
            expected = *store_value;
          }
          if (!configured.empty()) expected = configured;
          EXPECT_EQ(ResolveProtocol(role, configured), expected)
              << "LARDER_PROTOCOL=" << pd_value.value_or("<unset>")
              << " LARDER_STORE_PROTOCOL=" << store_value.value_or("<unset>")
              << " role=" << (role == EngineRole::kStore ? "store" : "standalone")
              << " configured=" << configured;
          const char* pd_now = std::getenv("LARDER_PROTOCOL");
          const char* store_now = std::getenv("LARDER_STORE_PROTOCOL");
          EXPECT_EQ(pd_now != nullptr, pd_value.has_value());
          if (pd_now && pd_value) {
            EXPECT_EQ(*pd_value, pd_now);
          }
          EXPECT_EQ(store_now != nullptr, store_value.has_value());
          if (store_now && store_value) {
            EXPECT_EQ(*store_value, store_now);
          }
        }
      }
    }
  }
}

TEST_F(ProtocolResolutionTest, DefaultsToAuto) {
  EXPECT_EQ(ResolveProtocol(EngineRole::kPd, ""), "auto");
  EXPECT_EQ(ResolveProtocol(EngineRole::kStore, ""), "auto");
}

TEST_F(ProtocolResolutionTest, StoreRoleUsesTheStoreVariable) {
  setenv("LARDER_PROTOCOL", "shm", 1);
  setenv("LARDER_STORE_PROTOCOL", "tcp", 1);
  EXPECT_EQ(ResolveProtocol(EngineRole::kStore, ""), "tcp");
  // Only the store role reads the store variable.
  EXPECT_EQ(ResolveProtocol(EngineRole::kPd, ""), "shm");
  // Resolution never writes the environment.
  EXPECT_STREQ(std::getenv("LARDER_PROTOCOL"), "shm");
  EXPECT_STREQ(std::getenv("LARDER_STORE_PROTOCOL"), "tcp");
}

TEST_F(ProtocolResolutionTest, EmptyStoreVariableFallsBackToLarderProtocol) {
  setenv("LARDER_PROTOCOL", "shm,tcp", 1);
  setenv("LARDER_STORE_PROTOCOL", "", 1);
  EXPECT_EQ(ResolveProtocol(EngineRole::kStore, ""), "shm,tcp");
  unsetenv("LARDER_STORE_PROTOCOL");
  EXPECT_EQ(ResolveProtocol(EngineRole::kStore, ""), "shm,tcp");
  EXPECT_STREQ(std::getenv("LARDER_PROTOCOL"), "shm,tcp");
  EXPECT_EQ(std::getenv("LARDER_STORE_PROTOCOL"), nullptr);
}

TEST_F(ProtocolResolutionTest, PdIgnoresTheStoreVariable) {
  setenv("LARDER_STORE_PROTOCOL", "tcp", 1);
  EXPECT_EQ(ResolveProtocol(EngineRole::kPd, ""), "auto");
  EXPECT_STREQ(std::getenv("LARDER_STORE_PROTOCOL"), "tcp");
  EXPECT_EQ(std::getenv("LARDER_PROTOCOL"), nullptr);
}

TEST_F(ProtocolResolutionTest, ExplicitConfigurationWins) {
  setenv("LARDER_PROTOCOL", "shm", 1);
  setenv("LARDER_STORE_PROTOCOL", "tcp", 1);
  EXPECT_EQ(ResolveProtocol(EngineRole::kStore, "local"), "local");
  EXPECT_EQ(ResolveProtocol(EngineRole::kPd, "local"), "local");
  EXPECT_STREQ(std::getenv("LARDER_PROTOCOL"), "shm");
  EXPECT_STREQ(std::getenv("LARDER_STORE_PROTOCOL"), "tcp");
}

TEST_F(ProtocolResolutionTest, CreateUsesTheRolesVariable) {
  setenv("LARDER_STORE_PROTOCOL", "tcp", 1);
  TransferEngineOptions store;
  store.role = EngineRole::kStore;
  auto store_engine = CreateEngine(store);
  ASSERT_TRUE(store_engine);
  EXPECT_EQ(store_engine->routes(), std::vector<RouteKind>{RouteKind::kTcp});

  TransferEngineOptions standalone;  // LARDER_PROTOCOL unset: auto
  auto standalone_engine = CreateEngine(standalone);
  ASSERT_TRUE(standalone_engine);
  EXPECT_EQ(standalone_engine->routes(), AutoRoutes());
}

TEST(ParseProtocolTest, KnownNames) {
  auto all = ParseProtocol("auto");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(*all, AutoRoutes());
  // Every build has these; ucx sits between shm and tcp where it is built.
  EXPECT_LT(RoutePreference(RouteKind::kLocal), RoutePreference(RouteKind::kSameHostShm));
  EXPECT_LT(RoutePreference(RouteKind::kSameHostShm), RoutePreference(RouteKind::kTcp));
  EXPECT_EQ(RoutePreference(RouteKind("bogus")), std::numeric_limits<int>::max());
  auto pair = ParseProtocol("shm,tcp");
  ASSERT_TRUE(pair.ok()) << pair.status();
  EXPECT_EQ(*pair, (std::vector<RouteKind>{RouteKind::kSameHostShm, RouteKind::kTcp}));
  auto tcp = ParseProtocol("tcp");
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  EXPECT_EQ(*tcp, std::vector<RouteKind>{RouteKind::kTcp});
  // Preference is fixed, whatever order the list is written in; spaces are tolerated.
  auto reversed = ParseProtocol("tcp, local");
  ASSERT_TRUE(reversed.ok()) << reversed.status();
  EXPECT_EQ(*reversed, (std::vector<RouteKind>{RouteKind::kLocal, RouteKind::kTcp}));
}

TEST(ParseProtocolTest, DeviceIsNeverInAuto) {
  auto all = ParseProtocol("auto");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(std::count(all->begin(), all->end(), RouteKind::kDevice), 0);
  auto both = ParseProtocol("tcp,device");
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(*both, (std::vector<RouteKind>{RouteKind::kDevice, RouteKind::kTcp}));
}

TEST(ParseProtocolTest, UnknownNamesAreInvalidArgument) {
  for (const char* bad : {"bogus", "", "shm,bogus", "shm,,tcp", "rdma", "tcp;shm"}) {
    auto parsed = ParseProtocol(bad);
    ASSERT_FALSE(parsed.ok()) << "'" << bad << "'";
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  std::string message = ParseProtocol("bogus").status().message();
  EXPECT_NE(message.find("bogus"), std::string::npos);
  // The message lists what this build has.
  EXPECT_NE(message.find("auto, local"), std::string::npos) << message;
  EXPECT_NE(message.find("tcp"), std::string::npos) << message;
}

}  // namespace
}  // namespace larder
