// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// larder-client end to end: a real larder-master and larder-client processes, and attached
// clients in this process and in larder-attach-peer processes.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "common/net.h"
#include "larder/standalone.h"
#include "standalone/standalone_testing.h"

namespace larder::standalone {
namespace {

using namespace std::chrono_literals;
using testing::DaemonProcess;
using testing::FillPattern;
using testing::FirstMismatch;
using testing::WaitUntil;

// One master and one daemon for the suite; tests that kill a daemon start their own.
class StandaloneTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Status started = suite_.Start("suite");
    ASSERT_TRUE(started.ok()) << started;
  }
  static void TearDownTestSuite() { suite_.Stop(); }

  void SetUp() override {
    ASSERT_TRUE(suite_.started());
    prefix_ = std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "/";
  }

  static std::unique_ptr<AttachedStoreClient> Attach(const std::string& socket,
                                                     AttachOptions options = {}) {
    options.socket = socket;
    auto store = AttachedStoreClient::Attach(options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }
  static std::unique_ptr<AttachedStoreClient> Attach() { return Attach(suite_.daemon().socket); }

  // A daemon of the test's own (to kill or stop), for the suite's master, on `socket`.
  static Result<DaemonProcess> StartOwnDaemon(const std::string& socket,
                                              const std::vector<std::string>& flags = {}) {
    return testing::StartDaemon(suite_.master().address, socket, flags);
  }

  std::string Key(const std::string& name) const { return prefix_ + name; }

  static inline testing::SuiteDeployment suite_;
  std::string prefix_;
};

TEST_F(StandaloneTest, PutFromAndGetIntoThroughSharedMemoryKeepEveryByte) {
  auto store = Attach();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->segment_name(), suite_.daemon().segment);
  EXPECT_EQ(store->socket_address(), suite_.daemon().socket);
  const std::vector<size_t> sizes = {1, 7, 63, 4095, 4096, 4097, 65539, (1 << 20) + 5, 3 << 20};
  size_t total = 0;
  for (size_t size : sizes) total += size + 64;
  auto src = store->AllocateShared(total);
  auto dst = store->AllocateShared(total);
  ASSERT_TRUE(src.ok() && dst.ok()) << src.status() << dst.status();
  std::vector<std::string> keys;
  std::vector<void*> in, out;
  size_t at = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    keys.push_back(Key(std::to_string(i)));
    in.push_back(static_cast<char*>(*src) + at + i);  // odd alignments
    out.push_back(static_cast<char*>(*dst) + at + 2 * i);
    FillPattern(keys[i], in[i], sizes[i]);
    at += sizes[i] + 32;
  }
  for (const Status& status : store->BatchPutFrom(keys, in, sizes)) {
    EXPECT_TRUE(status.ok()) << status;
  }
  auto got = store->BatchGetInto(keys, out, sizes);
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << keys[i] << ": " << got[i].status();
    EXPECT_EQ(*got[i], sizes[i]);
    EXPECT_EQ(FirstMismatch(keys[i], out[i], sizes[i]), -1) << keys[i];
  }
  // The single-key calls, and a buffer too small for the value.
  ASSERT_TRUE(store->PutFrom(Key("single"), in[5], sizes[5]).ok());
  std::memset(out[5], 0, sizes[5]);
  auto single = store->GetInto(Key("single"), out[5], sizes[5]);
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_EQ(FirstMismatch(keys[5], out[5], sizes[5]), -1);
  EXPECT_EQ(store->GetInto(Key("single"), out[5], sizes[5] - 1).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(store->GetInto(Key("absent"), out[5], sizes[5]).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(store->FreeShared(*src).ok());
  EXPECT_TRUE(store->FreeShared(*dst).ok());
  EXPECT_EQ(store->FreeShared(*dst).code(), StatusCode::kNotFound);
}

TEST_F(StandaloneTest, SlicesAndRangesScatterAndGather) {
  auto store = Attach();
  ASSERT_NE(store, nullptr);
  auto memory = store->AllocateShared(4 << 20);
  ASSERT_TRUE(memory.ok()) << memory.status();
  char* base = static_cast<char*>(*memory);
  // Object i is three slices far apart, as a layer-first KV pool lays a page out.
  const size_t kSlice = 10000;
  std::vector<std::string> keys = {Key("a"), Key("b")};
  std::vector<std::vector<BufferSlice>> put_slices(2), get_slices(2);
  std::vector<std::string> expected(2);
  for (size_t i = 0; i < 2; ++i) {
    std::string value(3 * kSlice, '\0');
    FillPattern(keys[i], value.data(), value.size());
    expected[i] = value;
    for (size_t layer = 0; layer < 3; ++layer) {
      char* put_at = base + layer * (1 << 20) + i * kSlice;
      std::memcpy(put_at, value.data() + layer * kSlice, kSlice);
      put_slices[i].push_back(BufferSlice{put_at, kSlice});
      get_slices[i].push_back(BufferSlice{base + (3 << 20) + (i * 3 + layer) * kSlice, kSlice});
    }
  }
  for (const Status& status : store->BatchPutFromSlices(keys, put_slices)) {
    EXPECT_TRUE(status.ok()) << status;
  }
  auto got = store->BatchGetIntoSlices(keys, get_slices);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(got[i].ok()) << got[i].status();
    EXPECT_EQ(*got[i], 3 * kSlice);
    std::string gathered;
    for (const BufferSlice& slice : get_slices[i]) {
      gathered.append(static_cast<char*>(slice.ptr), slice.size);
    }
    EXPECT_EQ(gathered, expected[i]);
  }
  char* range_dst = base + (3 << 20) + 6 * kSlice;
  std::vector<ObjectRange> ranges = {{keys[0], 123, range_dst, 4567},
                                     {keys[1], 3 * kSlice - 10, range_dst + 8192, 10},
                                     {keys[1], 3 * kSlice - 10, range_dst + 16384, 11},
                                     {Key("absent"), 0, range_dst, 1}};
  auto read = store->BatchGetRanges(ranges);
  ASSERT_TRUE(read[0].ok()) << read[0].status();
  EXPECT_EQ(std::string(range_dst, 4567), expected[0].substr(123, 4567));
  ASSERT_TRUE(read[1].ok()) << read[1].status();
  EXPECT_EQ(std::string(range_dst + 8192, 10), expected[1].substr(3 * kSlice - 10));
  EXPECT_EQ(read[2].status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(read[3].status().code(), StatusCode::kNotFound);
}

TEST_F(StandaloneTest, CopyingApiStagesThroughTheStagingArea) {
  AttachOptions options;
  options.staging_bytes = 64 << 10;
  auto store = Attach(suite_.daemon().socket, options);
  ASSERT_NE(store, nullptr);
  // Ten 20 KiB values need several rounds through a 64 KiB area, both ways.
  std::vector<std::string> keys, values;
  for (int i = 0; i < 10; ++i) {
    keys.push_back(Key(std::to_string(i)));
    std::string value(20 << 10, '\0');
    FillPattern(keys.back(), value.data(), value.size());
    values.push_back(value);
  }
  std::vector<std::span<const std::byte>> spans;
  for (const std::string& value : values) spans.push_back(std::as_bytes(std::span(value)));
  for (const Status& status : store->BatchPut(keys, spans)) EXPECT_TRUE(status.ok()) << status;
  auto got = store->BatchGet(keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << got[i].status();
    EXPECT_EQ(*got[i], values[i]) << keys[i];
  }
  std::vector<std::vector<char>> buffers(keys.size());
  auto allocated = store->BatchGetAllocated(keys, [&](size_t i, uint64_t size) -> Result<void*> {
    buffers[i].resize(size);
    return static_cast<void*>(buffers[i].data());
  });
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(allocated[i].ok()) << allocated[i].status();
    EXPECT_EQ(std::string(buffers[i].begin(), buffers[i].end()), values[i]);
  }
  ASSERT_TRUE(store->Put(Key("one"), std::as_bytes(std::span(values[0]))).ok());
  auto one = store->Get(Key("one"));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(*one, values[0]);

  // A value larger than the area: InvalidArgument naming the limit, both ways.
  std::string big(100 << 10, 'x');
  Status too_big = store->Put(Key("big"), std::as_bytes(std::span(big)));
  EXPECT_EQ(too_big.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_big.message().find("staging_bytes"), std::string::npos) << too_big;
  auto shared = store->AllocateShared(big.size());
  ASSERT_TRUE(shared.ok());
  std::memcpy(*shared, big.data(), big.size());
  ASSERT_TRUE(store->PutFrom(Key("big"), *shared, big.size()).ok());
  auto big_get = store->Get(Key("big"));
  EXPECT_EQ(big_get.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(big_get.status().message().find("staging_bytes"), std::string::npos)
      << big_get.status();
  EXPECT_EQ(store->Get(Key("absent")).status().code(), StatusCode::kNotFound);
}

TEST_F(StandaloneTest, OnlySharedMemoryIsAcceptedForZeroCopy) {
  auto store = Attach();
  ASSERT_NE(store, nullptr);
  std::vector<char> heap(4096, 'h');
  Status refused = store->RegisterBuffer(heap.data(), heap.size());
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("AllocateShared"), std::string::npos) << refused;
  EXPECT_NE(refused.message().find("RegisterSharedBuffer"), std::string::npos) << refused;
  Status put = store->PutFrom(Key("heap"), heap.data(), heap.size());
  EXPECT_EQ(put.code(), StatusCode::kFailedPrecondition) << put;
  EXPECT_NE(put.message().find("AllocateShared"), std::string::npos) << put;

  auto memory = store->AllocateShared(1 << 20);
  ASSERT_TRUE(memory.ok());
  char* base = static_cast<char*>(*memory);
  EXPECT_TRUE(store->RegisterBuffer(base + 4096, 8192).ok());
  EXPECT_EQ(store->RegisterBuffer(base + 8192, 100).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store->RegisterBuffer(base + (1 << 20) - 10, 11).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_TRUE(store->UnregisterBuffer(base + 4096).ok());
  EXPECT_EQ(store->UnregisterBuffer(base + 4096).code(), StatusCode::kNotFound);
  // A range that runs past the shared memory fails per item, the others succeed.
  FillPattern(Key("in"), base, 1000);
  std::vector<std::string> keys = {Key("in"), Key("past")};
  std::vector<void*> ptrs = {base, base + (1 << 20) - 100};
  std::vector<size_t> sizes = {1000, 101};
  auto statuses = store->BatchPutFrom(keys, ptrs, sizes);
  EXPECT_TRUE(statuses[0].ok()) << statuses[0];
  EXPECT_EQ(statuses[1].code(), StatusCode::kFailedPrecondition) << statuses[1];

  // The caller's own sealed memfd, shared from an offset.
  Fd fd(memfd_create("caller-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_TRUE(fd.valid());
  ASSERT_EQ(ftruncate(fd.get(), 1 << 20), 0);
  void* mapped = mmap(nullptr, 1 << 19, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 1 << 19);
  ASSERT_NE(mapped, MAP_FAILED);
  Status unsealed = store->RegisterSharedBuffer(mapped, 1 << 19, fd.get(), 1 << 19);
  EXPECT_NE(unsealed.message().find("F_SEAL_SHRINK"), std::string::npos) << unsealed;
  ASSERT_EQ(fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK), 0);
  EXPECT_EQ(store->RegisterSharedBuffer(mapped, 1 << 19, fd.get(), 100).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(store->RegisterSharedBuffer(mapped, 1 << 19, fd.get(), 1 << 19).ok());
  EXPECT_EQ(store->RegisterSharedBuffer(mapped, 4096, fd.get(), 1 << 19).code(),
            StatusCode::kInvalidArgument);  // overlaps
  FillPattern(Key("own"), mapped, 5000);
  ASSERT_TRUE(store->PutFrom(Key("own"), mapped, 5000).ok());
  auto back = store->GetInto(Key("own"), base + 8192, 5000);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(FirstMismatch(Key("own"), base + 8192, 5000), -1);
  EXPECT_TRUE(store->UnregisterBuffer(mapped).ok());
  EXPECT_EQ(store->PutFrom(Key("own2"), mapped, 5000).code(), StatusCode::kFailedPrecondition);
  munmap(mapped, 1 << 19);

  EXPECT_TRUE(store->FreeShared(base).ok());
  EXPECT_EQ(store->PutFrom(Key("freed"), base, 10).code(), StatusCode::kFailedPrecondition);
}

TEST_F(StandaloneTest, MetadataCallsReachTheDaemonsStore) {
  auto store = Attach();
  ASSERT_NE(store, nullptr);
  std::string value(3000, 'm');
  for (const char* name : {"x1", "x2", "y1"}) {
    ASSERT_TRUE(store->Put(Key(name), std::as_bytes(std::span(value))).ok());
  }
  EXPECT_TRUE(*store->Exist(Key("x1")));
  EXPECT_FALSE(*store->Exist(Key("absent")));
  auto exist = store->BatchExist(std::vector<std::string>{Key("x2"), Key("none")});
  EXPECT_TRUE(*exist[0]);
  EXPECT_FALSE(*exist[1]);
  EXPECT_EQ(*store->GetSize(Key("y1")), 3000u);
  EXPECT_EQ(store->GetSize(Key("absent")).status().code(), StatusCode::kNotFound);
  auto infos = store->BatchGetObjectInfo(std::vector<std::string>{Key("x1"), Key("none")});
  ASSERT_TRUE(infos[0].ok()) << infos[0].status();
  EXPECT_EQ(infos[0]->size, 3000u);
  ASSERT_EQ(infos[0]->replicas.size(), 1u);
  EXPECT_EQ(infos[0]->replicas[0].segment_name, suite_.daemon().segment);
  EXPECT_EQ(infos[1].status().code(), StatusCode::kNotFound);

  EXPECT_TRUE(store->Remove(Key("y1")).ok());
  EXPECT_EQ(store->Remove(Key("y1")).code(), StatusCode::kNotFound);
  auto removed = store->RemoveByRegex(prefix_ + "x.*");
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 2u);
  EXPECT_EQ(store->RemoveByRegex("(").status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(store->Put(Key("z"), std::as_bytes(std::span(value))).ok());
  auto batch = store->BatchRemove(std::vector<std::string>{Key("z"), Key("none")}, true);
  EXPECT_TRUE(batch[0].ok()) << batch[0];
  EXPECT_EQ(batch[1].code(), StatusCode::kNotFound);

  EXPECT_FALSE(store->client_id().empty());
  EXPECT_FALSE(store->engine().id().empty());  // a local engine of this process
  EXPECT_EQ(store->RouteTo(suite_.daemon().segment).status().code(), StatusCode::kUnimplemented);
}

TEST_F(StandaloneTest, TwoAttachedClientsSeeEachOthersObjects) {
  auto a = Attach();
  auto b = AttachStoreClient(testing::AttachTo(suite_.daemon().socket));
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(b.ok()) << b.status();
  std::string from_a(5000, 'a'), from_b(7000, 'b');
  ASSERT_TRUE(a->Put(Key("from-a"), std::as_bytes(std::span(from_a))).ok());
  ASSERT_TRUE((*b)->Put(Key("from-b"), std::as_bytes(std::span(from_b))).ok());
  EXPECT_EQ(*(*b)->Get(Key("from-a")), from_a);
  EXPECT_EQ(*a->Get(Key("from-b")), from_b);
  EXPECT_EQ((*b)->segment_name(), a->segment_name());
}

TEST_F(StandaloneTest, AClientThatExitsOrCrashesLosesNoCache) {
  const size_t kSize = 100000;
  for (const char* how : {"exit", "crash", "kill"}) {
    SCOPED_TRACE(how);
    auto peer =
        ChildProcess::Spawn({testing::Bin("larder-attach-peer"), suite_.daemon().socket}, {}, 30s);
    ASSERT_TRUE(peer.ok()) << peer.status();
    EXPECT_EQ(peer->address(), suite_.daemon().segment);
    const std::string prefix = Key(how);
    ASSERT_TRUE(peer->WriteLine("put " + prefix + " 8 " + std::to_string(kSize)).ok());
    auto answer = peer->ReadLine(60s);
    ASSERT_TRUE(answer.ok()) << answer.status();
    ASSERT_EQ(*answer, "OK");
    if (std::string(how) == "crash") {
      ASSERT_TRUE(peer->WriteLine("crash").ok());
    } else if (std::string(how) == "kill") {
      peer->Kill(SIGKILL);
    }
    int status = peer->Stop(30s);
    EXPECT_TRUE(WIFEXITED(status) || WIFSIGNALED(status));

    // Another process's view: every byte is still in the daemon's segment.
    auto reader = Attach();
    ASSERT_NE(reader, nullptr);
    auto memory = reader->AllocateShared(kSize);
    ASSERT_TRUE(memory.ok());
    for (int i = 0; i < 8; ++i) {
      const std::string key = prefix + std::to_string(i);
      auto got = reader->GetInto(key, *memory, kSize);
      ASSERT_TRUE(got.ok()) << key << ": " << got.status();
      EXPECT_EQ(FirstMismatch(key, *memory, kSize), -1) << key;
    }
  }
}

TEST_F(StandaloneTest, MooncakeAddressAndPathSocketsServe) {
  const std::string port = std::to_string(20000 + getpid() % 30000);
  auto daemon = StartOwnDaemon("127.0.0.1:" + port);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  EXPECT_EQ(daemon->socket, "@larder-client-" + port);
  auto by_address = Attach("127.0.0.1:" + port);
  ASSERT_NE(by_address, nullptr);
  EXPECT_EQ(by_address->segment_name(), daemon->segment);

  char dir_template[] = "/tmp/larder-client-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string path = std::string(dir_template) + "/client.sock";
  auto on_path = StartOwnDaemon(path);
  ASSERT_TRUE(on_path.ok()) << on_path.status();
  EXPECT_EQ(on_path->socket, path);
  auto by_path = Attach(path);
  ASSERT_NE(by_path, nullptr);
  std::string value = "through a path socket";
  ASSERT_TRUE(by_path->Put(Key("path"), std::as_bytes(std::span(value))).ok());
  EXPECT_EQ(*by_address->Get(Key("path")), value);  // one cluster, two daemons
  by_path.reset();
  on_path->process.Stop(30s);
  rmdir(dir_template);  // the daemon removed its socket file
  EXPECT_EQ(access(path.c_str(), F_OK), -1);
}

TEST_F(StandaloneTest, AttachFailsClearlyWithoutADaemon) {
  auto none = AttachedStoreClient::Attach(testing::AttachTo(testing::UniqueSocket("nobody")));
  EXPECT_EQ(none.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(none.status().message().find("no larder-client serves"), std::string::npos)
      << none.status();
  EXPECT_EQ(AttachedStoreClient::Attach(testing::AttachTo("no-such-form")).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(StandaloneTest, ADeadDaemonFailsEveryCallWithUnavailable) {
  auto daemon = StartOwnDaemon(testing::UniqueSocket("killed"));
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  constexpr std::chrono::milliseconds kTimeout = 5s;
  auto store = Attach(daemon->socket, {.timeout = kTimeout});
  ASSERT_NE(store, nullptr);
  auto memory = store->AllocateShared(1 << 16);
  ASSERT_TRUE(memory.ok());
  ASSERT_TRUE(store->PutFrom(Key("k"), *memory, 100).ok());
  daemon->process.Kill(SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  // Once it has exited, the kernel has closed its end of the socket: every call fails.
  daemon->process.Stop(10s);
  for (const Status& status :
       {store->Exist(Key("k")).status(), store->PutFrom(Key("k2"), *memory, 10),
        store->GetInto(Key("k"), *memory, 100).status(), store->AllocateShared(4096).status()}) {
    EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status;
    EXPECT_NE(status.message().find("larder-client at " + daemon->socket + " is gone"),
              std::string::npos)
        << status;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, kTimeout);
}

TEST_F(StandaloneTest, AStalledDaemonFailsCallsAfterTheTimeout) {
  auto daemon = StartOwnDaemon(testing::UniqueSocket("stalled"));
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto store = Attach(daemon->socket, {.timeout = 1500ms});
  ASSERT_NE(store, nullptr);
  daemon->process.Kill(SIGSTOP);
  const auto start = std::chrono::steady_clock::now();
  auto stalled = store->Exist(Key("k"));
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(stalled.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(stalled.status().message().find("is gone: no reply to BatchExist within 1500 ms"),
            std::string::npos)
      << stalled.status();
  EXPECT_GE(waited, 1400ms);
  EXPECT_LT(waited, 10s);
  EXPECT_EQ(store->GetSize(Key("k")).status().code(), StatusCode::kUnavailable);
  daemon->process.Kill(SIGCONT);
}

TEST_F(StandaloneTest, SigtermSaysGoodbyeAndExitsCleanly) {
  auto daemon = StartOwnDaemon(testing::UniqueSocket("sigterm"));
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto store = Attach(daemon->socket);
  ASSERT_NE(store, nullptr);
  daemon->process.Kill(SIGTERM);
  int status = daemon->process.Stop(30s);  // waits for it to exit
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  Status gone = store->Exist(Key("k")).status();
  EXPECT_EQ(gone.code(), StatusCode::kUnavailable) << gone;
  EXPECT_NE(gone.message().find("is gone"), std::string::npos) << gone;
}

TEST_F(StandaloneTest, MaxClientsIsEnforcedAndFreedOnDetach) {
  auto daemon = StartOwnDaemon(testing::UniqueSocket("max"), {"--max-clients", "2"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto first = Attach(daemon->socket);
  auto second = Attach(daemon->socket);
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  auto third = AttachedStoreClient::Attach(testing::AttachTo(daemon->socket));
  EXPECT_EQ(third.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("--max-clients"), std::string::npos) << third.status();
  second.reset();
  // The daemon notices the detach on its own schedule.
  EXPECT_TRUE(WaitUntil(
      [&] { return AttachedStoreClient::Attach(testing::AttachTo(daemon->socket)).ok(); }, 20s));
  EXPECT_TRUE(first->Exist(Key("k")).ok());
}

}  // namespace
}  // namespace larder::standalone
