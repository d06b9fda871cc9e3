// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Fuzzes the larder-client daemon's handling of an attached process's requests
// (AttachConnection::Handle, every decoder of src/standalone/protocol.h behind it) on an in-memory
// StoreClient. An input is a sequence of up to 16 requests, each a u16 type, a u16 length and that
// many payload bytes. RegisterShared requests carry a 1 MiB memfd sealed as larder-client requires,
// so that later requests can name memory that translates. Every reply must start with a status that
// decodes.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/net.h"
#include "standalone/attach_connection.h"
#include "standalone/memory_store.h"
#include "standalone/protocol.h"
#include "testing/fuzz_check.h"

using namespace larder;              // NOLINT: a fuzz target
using namespace larder::standalone;  // NOLINT: a fuzz target

namespace {

constexpr size_t kMemfdBytes = 1 << 20;
constexpr int kMaxRequests = 16;

// The memfd that RegisterShared requests carry (a new descriptor of it each time).
int SharedMemfd() {
  static const int fd = [] {
    int memfd = memfd_create("larder-fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    larder::test::FuzzCheck(memfd >= 0 && ftruncate(memfd, kMemfdBytes) == 0 &&
                            fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0);
    return memfd;
  }();
  return fd;
}

uint16_t U16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  testing::MemoryStore store;
  AttachConnection connection(
      &store, AttachConnectionOptions{.tenant_id = "fuzz", .max_regions = 4}, "fuzz-peer");
  for (int i = 0; i < kMaxRequests && size >= 4; ++i) {
    const uint16_t type = U16(data);
    const size_t length = std::min<size_t>(U16(data + 2), size - 4);
    std::string_view payload(reinterpret_cast<const char*>(data + 4), length);
    data += 4 + length;
    size -= 4 + length;
    if (!IsRequestType(type)) continue;
    Fd fd;
    if (static_cast<MessageType>(type) == MessageType::kRegisterShared) {
      fd = Fd(fcntl(SharedMemfd(), F_DUPFD_CLOEXEC, 0));
      larder::test::FuzzCheck(fd.valid());
    }
    std::string reply = connection.Handle(type, payload, std::move(fd));
    PayloadReader in(reply);
    (void)in.GetStatus();
    larder::test::FuzzCheck(in.ok());
  }
  larder::test::FuzzCheck(connection.region_count() <= 4);
  return 0;
}
