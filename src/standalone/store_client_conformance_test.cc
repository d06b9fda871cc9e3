// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The StoreClient conformance suite (client/testing/store_client_conformance.h) over a process
// attached to a larder-client daemon (a larder-master and a larder-client process per case), and
// over the in-memory store that the daemon's request handling is tested on.
#include <cstdlib>
#include <memory>
#include <optional>
#include <vector>

#include "client/testing/store_client_conformance.h"
#include "standalone/memory_store.h"
#include "standalone/standalone_testing.h"

namespace larder::testutil {
namespace {

class AttachedClient final : public StoreClientFixture {
 public:
  static Result<std::unique_ptr<StoreClientFixture>> Make() {
    auto fixture = std::make_unique<AttachedClient>();
    LARDER_ASSIGN_OR_RETURN(fixture->master_, standalone::testing::StartMaster());
    LARDER_ASSIGN_OR_RETURN(
        fixture->daemon_,
        standalone::testing::StartDaemon(fixture->master_->address,
                                         standalone::testing::UniqueSocket("conformance")));
    LARDER_ASSIGN_OR_RETURN(
        fixture->client_,
        AttachedStoreClient::Attach(standalone::testing::AttachTo(fixture->daemon_->socket)));
    return std::unique_ptr<StoreClientFixture>(std::move(fixture));
  }

  StoreClient& client() override { return *client_; }
  void* ZeroCopyMemory(size_t size) override {
    auto memory = client_->AllocateShared(size);
    return memory.ok() ? *memory : nullptr;
  }

 private:
  std::optional<standalone::testing::MasterProcess> master_;
  std::optional<standalone::testing::DaemonProcess> daemon_;
  std::unique_ptr<AttachedStoreClient> client_;  // detaches before the daemon stops
};

class InMemory final : public StoreClientFixture {
 public:
  static Result<std::unique_ptr<StoreClientFixture>> Make() {
    return std::unique_ptr<StoreClientFixture>(std::make_unique<InMemory>());
  }
  ~InMemory() override {
    for (void* memory : memory_) std::free(memory);
  }

  StoreClient& client() override { return store_; }
  void* ZeroCopyMemory(size_t size) override {
    void* memory = std::malloc(size);
    if (memory == nullptr) return nullptr;
    memory_.push_back(memory);
    return store_.RegisterBuffer(memory, size).ok() ? memory : nullptr;
  }

 private:
  standalone::testing::MemoryStore store_;
  std::vector<void*> memory_;
};

INSTANTIATE_TEST_SUITE_P(Standalone, StoreClientConformanceTest,
                         ::testing::Values(StoreClientUnderTest{"Attached", AttachedClient::Make},
                                           StoreClientUnderTest{"InMemory", InMemory::Make}),
                         StoreClientCaseName);

}  // namespace
}  // namespace larder::testutil
