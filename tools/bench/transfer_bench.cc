// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "bench/transfer_bench.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench/report.h"
#include "bench/target.h"
#include "common/env.h"
#include "common/memory.h"
#include "larder/transfer_engine.h"

namespace larder::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Measurement {
  uint64_t requests = 0;
  uint64_t bytes = 0;
  uint64_t errors = 0;
  double seconds = 0;
  std::vector<double> latencies_us;  // one per batch (every request of a batch shares it)
};

// Runs `threads` copies of body(thread, stop, measurement) for `duration`, then merges.
template <typename Body>
Measurement RunThreads(size_t threads, double duration, const std::string& label, bool progress,
                       Body body) {
  std::vector<Measurement> per_thread(threads);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> live_bytes{0};
  auto start = Clock::now();
  {
    ProgressBar bar(
        label, std::chrono::milliseconds(static_cast<int64_t>(duration * 1000)),
        [&] {
          double s = std::chrono::duration<double>(Clock::now() - start).count();
          return Fixed(s > 0 ? static_cast<double>(live_bytes.load()) / s / 1e9 : 0, 2) + " GB/s";
        },
        progress);
    std::vector<std::thread> workers;
    for (size_t t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] { body(t, stop, per_thread[t], live_bytes); });
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(duration));
    stop.store(true);
    for (auto& w : workers) w.join();
  }
  Measurement total;
  total.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (auto& m : per_thread) {
    total.requests += m.requests;
    total.bytes += m.bytes;
    total.errors += m.errors;
    total.latencies_us.insert(total.latencies_us.end(), m.latencies_us.begin(),
                              m.latencies_us.end());
  }
  return total;
}

}  // namespace

std::string TransferBenchRow::ToJson() const {
  nlohmann::json j = {{"transport", transport},
                      {"route", route},
                      {"op", op},
                      {"block_size", block_size},
                      {"batch", batch},
                      {"threads", threads},
                      {"working_set", working_set},
                      {"requests", requests},
                      {"errors", errors},
                      {"gbps", gbps},
                      {"p50_us", p50_us},
                      {"p99_us", p99_us},
                      {"memcpy_gbps", memcpy_gbps},
                      {"ratio_vs_memcpy", ratio_vs_memcpy}};
  return j.dump();
}

Result<std::vector<TransferBenchRow>> RunTransferBench(const TransferBenchOptions& o,
                                                       std::ostream& out) {
  // Any transport the registry has (its error lists them); device memory has its own bench.
  LARDER_ASSIGN_OR_RETURN(auto routes, ParseProtocol(o.transport));
  if (o.transport.find(',') != std::string::npos || (o.transport != "auto" && routes.size() != 1) ||
      o.transport == "device") {
    return InvalidArgumentError("--transport must be auto or one host-memory transport, not '" +
                                o.transport + "'");
  }
  if (o.batch == 0 || o.threads == 0)
    return InvalidArgumentError("--batch and --threads must be > 0");
  if (o.duration_s <= 0) return InvalidArgumentError("--duration must be > 0");
  for (const auto& op : o.ops) {
    if (op != "read" && op != "write") return InvalidArgumentError("--op must be read or write");
  }
  uint64_t working_set = o.working_set ? o.working_set : o.segment_size;
  if (working_set > o.segment_size) {
    return InvalidArgumentError("--working-set exceeds --segment-size");
  }
  for (uint64_t block : o.block_sizes) {
    if (block == 0 || block > working_set) {
      return InvalidArgumentError("block size " + FormatByteSize(block) +
                                  " does not fit the working set of " +
                                  FormatByteSize(working_set));
    }
  }

  // What happens before the first measurement (a target process, the warm-up) takes seconds.
  const bool stages = o.progress && !o.json;
  // The initiator engine, and the segment it reads and writes.
  TransferEngineOptions engine_options;
  engine_options.protocol = o.transport;
  engine_options.auth_token = o.auth_token;
  engine_options.copy_threads = o.copy_threads;
  LARDER_ASSIGN_OR_RETURN(auto engine, TransferEngine::Create(engine_options));
  ChildProcess target;
  SegmentHandle segment = 0;
  std::shared_ptr<MemoryRegion> own_segment;
  if (o.transport == "local") {
    LARDER_ASSIGN_OR_RETURN(own_segment, engine->AllocateSegmentMemory(o.segment_size));
    std::memset(own_segment->data(), 0x5a, own_segment->size());
    LARDER_ASSIGN_OR_RETURN(SegmentId id, engine->RegisterSegment("bench", own_segment));
    (void)id;
    LARDER_ASSIGN_OR_RETURN(segment, engine->OpenSegment(engine->ListSegments().front()));
  } else {
    std::string address = o.target;
    if (address.empty()) {
      TargetOptions target_options;
      target_options.segment_size = o.segment_size;
      target_options.auth_token = o.auth_token;
      target_options.segment_name = o.segment_name;
      // The target exports through the transport under test beside its other routes (ucx, for
      // one, exports nothing through "auto" alone on a host without RDMA).
      target_options.protocol = "auto," + o.transport;
      Stage(stages, "starting a target process with a " + FormatByteSize(o.segment_size) +
                        " segment (larder-bench target)");
      LARDER_ASSIGN_OR_RETURN(target, SpawnTarget(target_options));
      address = target.address();
    }
    Stage(stages, "opening the segment at " + address);
    LARDER_ASSIGN_OR_RETURN(segment, engine->OpenSegment(address, o.segment_name));
  }
  LARDER_ASSIGN_OR_RETURN(RouteKind route, engine->SegmentRoute(segment));
  LARDER_ASSIGN_OR_RETURN(SegmentDescriptor info, engine->SegmentInfo(segment));
  if (info.size < working_set) {
    return InvalidArgumentError("the target's segment (" + FormatByteSize(info.size) +
                                ") is smaller than the working set");
  }
  bool progress = o.progress && !o.json && isatty(STDERR_FILENO);

  Stage(stages, "route " + std::string(RouteKindName(route)) + "; preparing the " +
                    FormatByteSize(working_set) +
                    " working set (memcpy's region, then one untimed pass each way)");
  // memcpy's source/destination: a separate region of the working set's size, touched once.
  LARDER_ASSIGN_OR_RETURN(auto memcpy_region, AllocateAnonymous(working_set, HugePages::kOff));
  std::memset(memcpy_region->data(), 0x33, memcpy_region->size());
  auto* region = static_cast<uint8_t*>(memcpy_region->data());

  // One untimed pass over the working set in both directions first: the first touch of each page
  // of a freshly mapped segment is far slower than every later one (page-table and hypervisor
  // work), and a long-running process pays it once, not per request.
  {
    const uint64_t chunk = std::min<uint64_t>(working_set, 4ULL << 20);
    LARDER_ASSIGN_OR_RETURN(auto scratch, AllocateAnonymous(chunk, HugePages::kOff));
    for (uint64_t off = 0; off + chunk <= working_set; off += chunk) {
      TransferRequest pass[2] = {{TransferOp::kRead, scratch->data(), segment, off, chunk},
                                 {TransferOp::kWrite, scratch->data(), segment, off, chunk}};
      for (auto& request : pass) {
        LARDER_ASSIGN_OR_RETURN(auto results, engine->TransferSync({&request, 1}));
        LARDER_RETURN_IF_ERROR(results[0].status.WithContext("warm-up"));
      }
    }
  }

  std::vector<TransferBenchRow> rows;
  Table table({"transport", "route", "op", "block", "batch", "threads", "GB/s", "p50 us", "p99 us",
               "memcpy GB/s", "ratio", "errors"});
  for (const auto& op : o.ops) {
    for (uint64_t block : o.block_sizes) {
      uint64_t slots = working_set / block;
      size_t local_bytes = o.batch * block;
      std::vector<std::shared_ptr<MemoryRegion>> locals;
      for (size_t t = 0; t < o.threads; ++t) {
        LARDER_ASSIGN_OR_RETURN(auto local, AllocateAnonymous(local_bytes, HugePages::kOff));
        std::memset(local->data(), 0x77, local->size());
        locals.push_back(std::move(local));
      }
      bool read = op == "read";
      std::string label =
          std::string(RouteKindName(route)) + " " + op + " " + FormatByteSize(block);

      Measurement ours = RunThreads(
          o.threads, o.duration_s, label, progress,
          [&](size_t t, std::atomic<bool>& stop, Measurement& m, std::atomic<uint64_t>& live) {
            auto* local = static_cast<uint8_t*>(locals[t]->data());
            std::vector<TransferRequest> requests(o.batch);
            uint64_t slot = t * slots / o.threads;
            m.latencies_us.reserve(1 << 20);
            while (!stop.load(std::memory_order_relaxed)) {
              for (size_t b = 0; b < o.batch; ++b) {
                requests[b] = {read ? TransferOp::kRead : TransferOp::kWrite, local + b * block,
                               segment, slot * block, block};
                slot = slot + 1 == slots ? 0 : slot + 1;
              }
              auto begin = Clock::now();
              auto batch = engine->Submit(requests);
              bool ok = batch.ok() && engine->Wait(*batch, std::chrono::seconds(60)).ok();
              auto end = Clock::now();
              if (batch.ok()) {
                ok = ok && engine->BatchStatus(*batch).ok();
                engine->Release(*batch).IgnoreError();
              }
              if (!ok) {
                m.errors += o.batch;
                continue;
              }
              m.latencies_us.push_back(
                  std::chrono::duration<double, std::micro>(end - begin).count());
              m.requests += o.batch;
              m.bytes += o.batch * block;
              live.fetch_add(o.batch * block, std::memory_order_relaxed);
            }
          });

      Measurement baseline = RunThreads(
          o.threads, o.duration_s, "memcpy " + op + " " + FormatByteSize(block), progress,
          [&](size_t t, std::atomic<bool>& stop, Measurement& m, std::atomic<uint64_t>& live) {
            auto* local = static_cast<uint8_t*>(locals[t]->data());
            uint64_t slot = t * slots / o.threads;
            while (!stop.load(std::memory_order_relaxed)) {
              for (size_t b = 0; b < o.batch; ++b) {
                uint8_t* remote = region + slot * block;
                if (read) {
                  std::memcpy(local + b * block, remote, block);
                } else {
                  std::memcpy(remote, local + b * block, block);
                }
                slot = slot + 1 == slots ? 0 : slot + 1;
              }
              m.bytes += o.batch * block;
              live.fetch_add(o.batch * block, std::memory_order_relaxed);
            }
          });

      TransferBenchRow row;
      row.transport = o.transport;
      row.route = std::string(RouteKindName(route));
      row.op = op;
      row.block_size = block;
      row.batch = o.batch;
      row.threads = o.threads;
      row.working_set = working_set;
      row.requests = ours.requests;
      row.errors = ours.errors;
      row.gbps = static_cast<double>(ours.bytes) / ours.seconds / 1e9;
      row.p50_us = Percentile(ours.latencies_us, 50);
      row.p99_us = Percentile(ours.latencies_us, 99);
      row.memcpy_gbps = static_cast<double>(baseline.bytes) / baseline.seconds / 1e9;
      row.ratio_vs_memcpy = row.memcpy_gbps > 0 ? row.gbps / row.memcpy_gbps : 0;
      if (o.json) {
        out << row.ToJson() << std::endl;
      }
      table.AddRow({row.transport, row.route, row.op, FormatByteSize(block),
                    std::to_string(row.batch), std::to_string(row.threads), Fixed(row.gbps, 2),
                    Fixed(row.p50_us, 2), Fixed(row.p99_us, 2), Fixed(row.memcpy_gbps, 2),
                    Fixed(row.ratio_vs_memcpy, 2), std::to_string(row.errors)});
      rows.push_back(row);
    }
  }
  if (!o.json) out << table.ToString();
  if (target.pid() > 0) target.Stop(std::chrono::seconds(5));
  return rows;
}

}  // namespace larder::bench
