// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "bench/demo/demo.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>

#include "bench/common/report.h"
#include "bench/common/target.h"
#include "common/env.h"
#include "common/memory.h"
#include "larder/transfer_engine.h"

namespace larder::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct RouteCase {
  std::string protocol;  // initiator protocol
  RouteKind expected;
  bool in_process;
};

}  // namespace

Status RunDemo(const DemoOptions& options, std::ostream& out) {
  if (options.transfer_bytes == 0 || options.rounds <= 0) {
    return InvalidArgumentError("--size and --rounds must be > 0");
  }
  uint64_t segment_size = RoundUp(options.transfer_bytes, 1 << 20);
  TargetOptions target_options;
  target_options.segment_size = segment_size;
  target_options.segment_name = "demo";
  LARDER_ASSIGN_OR_RETURN(ChildProcess target, SpawnTarget(target_options));
  out << "larder-demo: target process " << target.pid() << " serves segment 'demo' ("
      << FormatByteSize(segment_size) << ") at " << target.address() << "; this process is "
      << getpid() << "\n\n";

  LARDER_ASSIGN_OR_RETURN(auto source, AllocateAnonymous(options.transfer_bytes, HugePages::kOff));
  LARDER_ASSIGN_OR_RETURN(auto sink, AllocateAnonymous(options.transfer_bytes, HugePages::kOff));
  std::mt19937_64 rng(42);
  auto* src = static_cast<uint64_t*>(source->data());
  for (size_t i = 0; i < options.transfer_bytes / 8; ++i) src[i] = rng();

  Table table({"route", "between", "op", "bytes", "GB/s (median)", "verified"});
  const RouteCase cases[] = {
      {"local", RouteKind::kLocal, true},
      {"auto", RouteKind::kSameHostShm, false},
      {"tcp", RouteKind::kTcp, false},
  };
  for (const RouteCase& c : cases) {
    TransferEngineOptions engine_options;
    engine_options.protocol = c.protocol;
    LARDER_ASSIGN_OR_RETURN(auto engine, TransferEngine::Create(engine_options));
    std::shared_ptr<MemoryRegion> own;
    SegmentHandle segment;
    if (c.in_process) {
      LARDER_ASSIGN_OR_RETURN(own, engine->AllocateSegmentMemory(segment_size));
      LARDER_ASSIGN_OR_RETURN(SegmentId id, engine->RegisterSegment("demo", own));
      (void)id;
      LARDER_ASSIGN_OR_RETURN(segment, engine->OpenSegment(engine->ListSegments().front()));
    } else {
      LARDER_ASSIGN_OR_RETURN(segment, engine->OpenSegment(target.address(), "demo"));
    }
    LARDER_ASSIGN_OR_RETURN(RouteKind route, engine->SegmentRoute(segment));
    if (route != c.expected) {
      return InternalError("protocol '" + c.protocol + "' took route " +
                           std::string(RouteKindName(route)) + ", expected " +
                           std::string(RouteKindName(c.expected)));
    }
    for (TransferOp op : {TransferOp::kWrite, TransferOp::kRead}) {
      std::vector<double> gbps;
      bool verified = true;
      for (int r = 0; r < options.rounds; ++r) {
        if (op == TransferOp::kRead) std::memset(sink->data(), 0, options.transfer_bytes);
        TransferRequest request{op, op == TransferOp::kWrite ? source->data() : sink->data(),
                                segment, 0, options.transfer_bytes};
        auto begin = Clock::now();
        LARDER_ASSIGN_OR_RETURN(auto results,
                                engine->TransferSync({&request, 1}, std::chrono::seconds(60)));
        double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
        LARDER_RETURN_IF_ERROR(results[0].status);
        if (results[0].route != c.expected)
          return InternalError("request took an unexpected route");
        gbps.push_back(static_cast<double>(options.transfer_bytes) / seconds / 1e9);
        if (op == TransferOp::kRead) {
          verified =
              verified && std::memcmp(sink->data(), source->data(), options.transfer_bytes) == 0;
        }
      }
      if (!verified)
        return DataLossError("bytes read back over " + std::string(RouteKindName(route)) +
                             " differ");
      table.AddRow({std::string(RouteKindName(route)),
                    c.in_process ? "same process" : "two processes",
                    op == TransferOp::kWrite ? "write" : "read",
                    FormatByteSize(options.transfer_bytes), Fixed(Percentile(gbps, 50), 2),
                    op == TransferOp::kRead ? "yes (every byte)" : "(by the read)"});
    }
  }
  out << table.ToString();
  out << "\nshm: the target's memfd mapped into this process; tcp: the target's data server over "
         "loopback (forced with protocol=tcp).\n";
  target.Stop(std::chrono::seconds(5));
  return Status();
}

}  // namespace larder::bench
