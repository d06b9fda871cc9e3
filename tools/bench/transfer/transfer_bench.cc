// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "bench/transfer/transfer_bench.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "bench/common/report.h"
#include "bench/common/target.h"
#include "common/env.h"
#include "common/memory.h"
#include "larder/transfer_engine.h"
#include "testing/netns.h"
#include "transfer/device/device_transport.h"

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
                      {"ratio_vs_memcpy", ratio_vs_memcpy},
                      {"memory", memory}};
  if (memory == "device") {
    j["host_gbps"] = host_gbps;
    j["ratio_vs_host"] = ratio_vs_host;
    j["placement"] = placement;
  }
  return j.dump();
}

namespace {

// A segment to measure against: the engine that reaches it, its handle, and this side's buffers
// for each (thread, block) are allocated by `local_memory`.
struct Side {
  std::unique_ptr<TransferEngine> engine;
  SegmentHandle segment = 0;
  RouteKind route;
  std::function<Result<std::shared_ptr<MemoryRegion>>(size_t)> local_memory;
};

// One untimed pass over the working set in both directions: the first touch of each page of a
// freshly mapped segment is far slower than every later one (page-table and hypervisor work),
// and a long-running process pays it once, not per request.
Status WarmUp(Side& side, uint64_t working_set) {
  const uint64_t chunk = std::min<uint64_t>(working_set, 4ULL << 20);
  LARDER_ASSIGN_OR_RETURN(auto scratch, side.local_memory(chunk));
  for (uint64_t off = 0; off + chunk <= working_set; off += chunk) {
    TransferRequest pass[2] = {{TransferOp::kWrite, scratch->data(), side.segment, off, chunk},
                               {TransferOp::kRead, scratch->data(), side.segment, off, chunk}};
    for (auto& request : pass) {
      LARDER_ASSIGN_OR_RETURN(auto results, side.engine->TransferSync({&request, 1}));
      LARDER_RETURN_IF_ERROR(results[0].status.WithContext("warm-up"));
    }
  }
  return Status();
}

// `threads` submitters moving `block`-sized requests, `batch` per Submit, over the working set.
Result<Measurement> MeasureEngine(Side& side, const TransferBenchOptions& o, bool read,
                                  uint64_t block, uint64_t working_set, bool progress,
                                  const std::string& label) {
  const uint64_t slots = working_set / block;
  std::vector<std::shared_ptr<MemoryRegion>> locals;
  for (size_t t = 0; t < o.threads; ++t) {
    LARDER_ASSIGN_OR_RETURN(auto local, side.local_memory(o.batch * block));
    locals.push_back(std::move(local));
  }
  return RunThreads(
      o.threads, o.duration_s, label, progress,
      [&](size_t t, std::atomic<bool>& stop, Measurement& m, std::atomic<uint64_t>& live) {
        auto* local = static_cast<uint8_t*>(locals[t]->data());
        std::vector<TransferRequest> requests(o.batch);
        uint64_t slot = t * slots / o.threads;
        m.latencies_us.reserve(1 << 20);
        while (!stop.load(std::memory_order_relaxed)) {
          for (size_t b = 0; b < o.batch; ++b) {
            requests[b] = {read ? TransferOp::kRead : TransferOp::kWrite, local + b * block,
                           side.segment, slot * block, block};
            slot = slot + 1 == slots ? 0 : slot + 1;
          }
          auto begin = Clock::now();
          auto batch = side.engine->Submit(requests);
          bool ok = batch.ok() && side.engine->Wait(*batch, std::chrono::seconds(60)).ok();
          auto end = Clock::now();
          if (batch.ok()) {
            ok = ok && side.engine->BatchStatus(*batch).ok();
            side.engine->Release(*batch).IgnoreError();
          }
          if (!ok) {
            m.errors += o.batch;
            continue;
          }
          m.latencies_us.push_back(std::chrono::duration<double, std::micro>(end - begin).count());
          m.requests += o.batch;
          m.bytes += o.batch * block;
          live.fetch_add(o.batch * block, std::memory_order_relaxed);
        }
      });
}

std::function<Result<std::shared_ptr<MemoryRegion>>(size_t)> HostMemory() {
  return [](size_t bytes) -> Result<std::shared_ptr<MemoryRegion>> {
    LARDER_ASSIGN_OR_RETURN(auto region, AllocateAnonymous(bytes, HugePages::kOff));
    std::memset(region->data(), 0x77, region->size());
    return region;
  };
}

}  // namespace

Result<std::vector<TransferBenchRow>> RunTransferBench(const TransferBenchOptions& o,
                                                       std::ostream& out) {
  const bool device = o.memory == "device";
  if (o.memory != "host" && !device) {
    return InvalidArgumentError("--memory must be host or device, not '" + o.memory + "'");
  }
  // Any transport the registry has (its error lists them); device memory has its own bench.
  LARDER_ASSIGN_OR_RETURN(auto routes, ParseProtocol(o.transport));
  if (o.transport.find(',') != std::string::npos || (o.transport != "auto" && routes.size() != 1) ||
      o.transport == "device") {
    return InvalidArgumentError("--transport must be auto or one host-memory transport, not '" +
                                o.transport + "'");
  }
  // Device memory of another host is reached by a CPU route through staging: tcp.
  const std::string transport = device && o.transport == "auto" ? "tcp" : o.transport;
  if (device && (transport != "tcp" || !o.target.empty())) {
    return InvalidArgumentError(
        "--memory device measures tcp to a target it starts on another host: give neither "
        "--target nor a --transport other than tcp");
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
  // Device memory: the targets on another host, in a namespace of their own where this process
  // may make one (root), else under another host id on this one.
  std::unique_ptr<test::NetworkNamespace> netns;
  std::string placement;
  if (device) {
    if (test::NetnsUsable().ok()) {
      Stage(stages, "creating a network namespace for the targets (another host)");
      LARDER_ASSIGN_OR_RETURN(netns, test::NetworkNamespace::Create());
      placement = "netns";
    } else {
      placement = "host-id";
    }
  }
  std::vector<ChildProcess> targets;
  // A side: an engine of `protocol` and the segment it measures, on a target it starts (or at
  // --target, or its own segment for "local").
  auto make_side = [&](const std::string& protocol, bool device_memory) -> Result<Side> {
    Side side;
    TransferEngineOptions engine_options;
    engine_options.protocol = protocol;
    engine_options.auth_token = o.auth_token;
    engine_options.copy_threads = o.copy_threads;
    if (device_memory) {
      // The device transport initializes on this thread's device; buffers are its memory.
      LARDER_RETURN_IF_ERROR(transfer::DefaultDeviceBackend()->SetCurrentDevice(0));
    }
    LARDER_ASSIGN_OR_RETURN(side.engine, TransferEngine::Create(engine_options));
    TransferEngine* engine = side.engine.get();
    side.local_memory =
        device_memory
            ? std::function<Result<std::shared_ptr<MemoryRegion>>(size_t)>(
                  [engine](size_t bytes) -> Result<std::shared_ptr<MemoryRegion>> {
                    LARDER_ASSIGN_OR_RETURN(auto region, engine->AllocateSegmentMemory(bytes));
                    if (region->kind() != MemoryKind::kDevice) {
                      return FailedPreconditionError(
                          "this build's device transport gave host memory");
                    }
                    return region;
                  })
            : HostMemory();
    if (transport == "local") {
      LARDER_ASSIGN_OR_RETURN(auto own, engine->AllocateSegmentMemory(o.segment_size));
      std::memset(own->data(), 0x5a, own->size());
      LARDER_RETURN_IF_ERROR(engine->RegisterSegment("bench", own).status());
      LARDER_ASSIGN_OR_RETURN(side.segment, engine->OpenSegment(engine->ListSegments().front()));
      side.local_memory = [own, fallback = side.local_memory](size_t bytes) {
        (void)own;  // the segment lives as long as the side
        return fallback(bytes);
      };
    } else {
      std::string address = o.target;
      if (address.empty()) {
        TargetOptions target_options;
        target_options.segment_size = o.segment_size;
        target_options.auth_token = o.auth_token;
        target_options.segment_name = o.segment_name;
        std::map<std::string, std::string> env;
        std::vector<std::string> prefix;
        if (device) {
          target_options.protocol = device_memory ? "device,tcp" : "tcp";
          target_options.device = device_memory ? 0 : -1;
          if (netns) {
            target_options.listen_address = netns->host_b_address() + ":0";
            prefix = netns->ExecPrefix();
          } else {
            env["LARDER_HOST_ID"] = "larder-bench-other-host";
          }
        } else {
          // The target exports through the transport under test beside its other routes (ucx,
          // for one, exports nothing through "auto" alone on a host without RDMA).
          target_options.protocol = "auto," + transport;
        }
        Stage(stages, "starting a target process with a " + FormatByteSize(o.segment_size) +
                          (device_memory ? " device" : "") + " segment (larder-bench target" +
                          (netns ? ", in " + netns->name() : "") + ")");
        LARDER_ASSIGN_OR_RETURN(ChildProcess target, SpawnTarget(target_options, env, prefix));
        address = target.address();
        targets.push_back(std::move(target));
      }
      Stage(stages, "opening the segment at " + address);
      LARDER_ASSIGN_OR_RETURN(side.segment, engine->OpenSegment(address, o.segment_name));
    }
    LARDER_ASSIGN_OR_RETURN(side.route, engine->SegmentRoute(side.segment));
    LARDER_ASSIGN_OR_RETURN(SegmentDescriptor info, engine->SegmentInfo(side.segment));
    if (info.size < working_set) {
      return InvalidArgumentError("the target's segment (" + FormatByteSize(info.size) +
                                  ") is smaller than the working set");
    }
    Stage(stages, "route " + std::string(RouteKindName(side.route)) + "; one untimed pass over " +
                      FormatByteSize(working_set) + " each way");
    LARDER_RETURN_IF_ERROR(WarmUp(side, working_set));
    return side;
  };
  auto finish = [&] {
    for (ChildProcess& target : targets) {
      if (target.pid() > 0) target.Stop(std::chrono::seconds(5));
    }
  };

  Result<Side> ours = make_side(device ? "device,tcp" : o.transport, device);
  if (!ours.ok()) {
    finish();
    return ours.status();
  }
  std::optional<Side> host;
  if (device) {
    Result<Side> made = make_side("tcp", false);
    if (!made.ok()) {
      finish();
      return made.status();
    }
    host = std::move(made).value();
  }
  bool progress = o.progress && !o.json && isatty(STDERR_FILENO);

  // memcpy's source/destination: a separate region of the working set's size, touched once.
  LARDER_ASSIGN_OR_RETURN(auto memcpy_region, AllocateAnonymous(working_set, HugePages::kOff));
  std::memset(memcpy_region->data(), 0x33, memcpy_region->size());
  auto* region = static_cast<uint8_t*>(memcpy_region->data());

  std::vector<TransferBenchRow> rows;
  std::vector<std::string> columns = {"memory", "route",       "op",   "block",
                                      "batch",  "threads",     "GB/s", "p50 us",
                                      "p99 us", "memcpy GB/s", "ratio"};
  if (device) {
    columns.push_back("host GB/s");
    columns.push_back("vs host");
  }
  columns.push_back("errors");
  Table table(columns);
  const RouteKind route = ours->route;
  for (const auto& op : o.ops) {
    for (uint64_t block : o.block_sizes) {
      const uint64_t slots = working_set / block;
      const bool read = op == "read";
      const std::string what = op + " " + FormatByteSize(block);
      Result<Measurement> measured =
          MeasureEngine(*ours, o, read, block, working_set, progress,
                        std::string(RouteKindName(route)) + (device ? " device " : " ") + what);
      if (!measured.ok()) {
        finish();
        return measured.status();
      }
      std::optional<Measurement> host_measured;
      if (host) {
        Result<Measurement> m =
            MeasureEngine(*host, o, read, block, working_set, progress,
                          std::string(RouteKindName(host->route)) + " host " + what);
        if (!m.ok()) {
          finish();
          return m.status();
        }
        host_measured = std::move(m).value();
      }
      LARDER_ASSIGN_OR_RETURN(auto locals,
                              AllocateAnonymous(o.threads * o.batch * block, HugePages::kOff));
      std::memset(locals->data(), 0x77, locals->size());
      Measurement baseline = RunThreads(
          o.threads, o.duration_s, "memcpy " + what, progress,
          [&](size_t t, std::atomic<bool>& stop, Measurement& m, std::atomic<uint64_t>& live) {
            auto* local = static_cast<uint8_t*>(locals->data()) + t * o.batch * block;
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
      row.transport = transport;
      row.route = std::string(RouteKindName(route));
      row.op = op;
      row.block_size = block;
      row.batch = o.batch;
      row.threads = o.threads;
      row.working_set = working_set;
      row.requests = measured->requests;
      row.errors = measured->errors;
      row.gbps = static_cast<double>(measured->bytes) / measured->seconds / 1e9;
      row.p50_us = Percentile(measured->latencies_us, 50);
      row.p99_us = Percentile(measured->latencies_us, 99);
      row.memcpy_gbps = static_cast<double>(baseline.bytes) / baseline.seconds / 1e9;
      row.ratio_vs_memcpy = row.memcpy_gbps > 0 ? row.gbps / row.memcpy_gbps : 0;
      row.memory = o.memory;
      row.placement = placement;
      if (host_measured) {
        row.host_gbps = static_cast<double>(host_measured->bytes) / host_measured->seconds / 1e9;
        row.ratio_vs_host = row.host_gbps > 0 ? row.gbps / row.host_gbps : 0;
        row.errors += host_measured->errors;
      }
      if (o.json) {
        out << row.ToJson() << std::endl;
      }
      std::vector<std::string> cells = {row.memory,
                                        row.route,
                                        row.op,
                                        FormatByteSize(block),
                                        std::to_string(row.batch),
                                        std::to_string(row.threads),
                                        Fixed(row.gbps, 2),
                                        Fixed(row.p50_us, 2),
                                        Fixed(row.p99_us, 2),
                                        Fixed(row.memcpy_gbps, 2),
                                        Fixed(row.ratio_vs_memcpy, 2)};
      if (device) {
        cells.push_back(Fixed(row.host_gbps, 2));
        cells.push_back(Fixed(row.ratio_vs_host, 2));
      }
      cells.push_back(std::to_string(row.errors));
      table.AddRow(cells);
      rows.push_back(row);
    }
  }
  if (!o.json) out << table.ToString();
  finish();
  return rows;
}

}  // namespace larder::bench
