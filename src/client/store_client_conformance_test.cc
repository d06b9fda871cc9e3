// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The StoreClient conformance suite (client/testing/store_client_conformance.h) over the store
// client of this process, against a larder-master in this process.
#include <cstdlib>
#include <memory>

#include "client/testing/store_client_conformance.h"
#include "master/master_server.h"

namespace larder::testutil {
namespace {

class InProcessClient final : public StoreClientFixture {
 public:
  static Result<std::unique_ptr<StoreClientFixture>> Make() {
    auto fixture = std::make_unique<InProcessClient>();
    master::MasterServerOptions server;
    server.listen_host = "127.0.0.1";
    server.port = 0;
    server.http_port = -1;
    LARDER_ASSIGN_OR_RETURN(fixture->master_, master::MasterServer::Start(server));
    StoreClientOptions options;
    options.master_address = fixture->master_->address();
    options.global_segment_size = 64ull << 20;
    LARDER_ASSIGN_OR_RETURN(fixture->client_, StoreClient::Create(options));
    return std::unique_ptr<StoreClientFixture>(std::move(fixture));
  }
  ~InProcessClient() override {
    client_.reset();
    for (void* memory : memory_) std::free(memory);
  }

  StoreClient& client() override { return *client_; }
  void* ZeroCopyMemory(size_t size) override {
    void* memory = std::aligned_alloc(4096, (size + 4095) / 4096 * 4096);
    if (memory == nullptr) return nullptr;
    memory_.push_back(memory);
    return client_->RegisterBuffer(memory, size).ok() ? memory : nullptr;
  }

 private:
  std::unique_ptr<master::MasterServer> master_;
  std::unique_ptr<StoreClient> client_;
  std::vector<void*> memory_;
};

INSTANTIATE_TEST_SUITE_P(InProcess, StoreClientConformanceTest,
                         ::testing::Values(StoreClientUnderTest{"InProcess",
                                                                InProcessClient::Make}),
                         StoreClientCaseName);

}  // namespace
}  // namespace larder::testutil
