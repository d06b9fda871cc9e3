// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Each run starts fresh processes: a mount-worker owner that contributes the segment and puts two
// objects into it, then a mount-worker reader that contributes nothing, opens the owner's segment
// and gets both objects. Memory is read from /proc/<pid>/status by this process, between the
// workers' commands, so the workers are idle when it is read.
#include "bench/mount/mount_bench.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>

#include "bench/common/report.h"
#include "bench/store/store_worker.h"
#include "common/child_process.h"
#include "common/env.h"
#include "larder/status.h"
#include "master/master_server.h"

namespace larder::bench {
namespace {

using json = nlohmann::json;

constexpr uint64_t kSmallObject = 4096;
constexpr uint64_t kLargeObject = 4ull << 20;
constexpr uint64_t k2MiB = 2ull << 20;
constexpr uint64_t k1GiB = 1ull << 30;
// Memory left to everything else on the host when huge pages are reserved for a row.
constexpr uint64_t kHugePageHeadroom = 4ull << 30;
// Pages added to the pool beyond a row's own when the bench raises it (none of 1 GiB).
constexpr uint64_t kHugePageSpareBytes = 64ull << 20;
constexpr std::chrono::seconds kWorkerTimeout{120};

// Resident and mapped memory of a process, from /proc/<pid>/status, in bytes.
struct ProcMemory {
  uint64_t vm_size = 0;    // VmSize: address space, mappings included
  uint64_t rss = 0;        // VmRSS: resident memory (hugetlb pages not included)
  uint64_t rss_shmem = 0;  // RssShmem: resident shared memory (memfd pages mapped)
  uint64_t pte = 0;        // VmPTE: page tables
  uint64_t hugetlb = 0;    // HugetlbPages: hugetlb pages mapped
};

Result<ProcMemory> ReadProcMemory(pid_t pid) {
  std::string path = "/proc/" + std::to_string(pid) + "/status";
  std::ifstream in(path);
  if (!in) return UnavailableError("cannot read " + path);
  std::map<std::string, uint64_t*> fields;
  ProcMemory memory;
  fields["VmSize"] = &memory.vm_size;
  fields["VmRSS"] = &memory.rss;
  fields["RssShmem"] = &memory.rss_shmem;
  fields["VmPTE"] = &memory.pte;
  fields["HugetlbPages"] = &memory.hugetlb;
  std::string line;
  while (std::getline(in, line)) {
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    auto it = fields.find(line.substr(0, colon));
    if (it == fields.end()) continue;
    *it->second = std::strtoull(line.c_str() + colon + 1, nullptr, 10) * 1024;  // "<n> kB"
  }
  return memory;
}

std::string HugePageDir(uint64_t page_size) {
  return "/sys/kernel/mm/hugepages/hugepages-" + std::to_string(page_size / 1024) + "kB/";
}

Result<uint64_t> ReadCounter(const std::string& path) {
  std::ifstream in(path);
  uint64_t value = 0;
  if (!(in >> value)) return UnavailableError("cannot read " + path);
  return value;
}

Status WriteCounter(const std::string& path, uint64_t value) {
  std::ofstream out(path);
  if (out) out << value << std::flush;
  if (!out) {
    return FailedPreconditionError("cannot write " + path + " (" + std::strerror(errno) +
                                   "); run as root or reserve the pages beforehand");
  }
  return Status::Ok();
}

uint64_t MemAvailable() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) == 0) {
      return std::strtoull(line.c_str() + 13, nullptr, 10) * 1024;
    }
  }
  return 0;
}

std::string Human(uint64_t bytes) {
  if (bytes >= (1ull << 40)) return Fixed(static_cast<double>(bytes) / (1ull << 40), 1) + " TiB";
  if (bytes >= k1GiB) return Fixed(static_cast<double>(bytes) / k1GiB, 1) + " GiB";
  if (bytes >= (1ull << 20)) return Fixed(static_cast<double>(bytes) / (1ull << 20), 1) + " MiB";
  return Fixed(static_cast<double>(bytes) / 1024, 0) + " KiB";
}

std::string PageName(uint64_t page_size) {
  if (page_size == k1GiB) return "1 GiB";
  if (page_size == k2MiB) return "2 MiB";
  return Human(page_size);
}

// Makes `pages` hugetlb pages of `page_size` available by raising the pool's nr_hugepages, and
// puts the old value back on destruction (after the row's processes have exited and freed them).
class HugePageReservation {
 public:
  // Errors (each a reason to skip the row): FailedPrecondition (no such page size, or the pool
  // cannot be written), ResourceExhausted (the pages do not fit in this host's free memory, or
  // the kernel found too few contiguous ranges for them).
  static Result<std::unique_ptr<HugePageReservation>> Reserve(uint64_t page_size, uint64_t pages) {
    const std::string dir = HugePageDir(page_size);
    auto total = ReadCounter(dir + "nr_hugepages");
    if (!total.ok()) {
      return FailedPreconditionError("this kernel offers no " + PageName(page_size) +
                                     " huge pages (" + dir + " is missing)");
    }
    uint64_t free = ReadCounter(dir + "free_hugepages").value_or(0);
    uint64_t reserved = ReadCounter(dir + "resv_hugepages").value_or(0);
    uint64_t available = free > reserved ? free - reserved : 0;
    std::unique_ptr<HugePageReservation> reservation(
        new HugePageReservation(dir + "nr_hugepages", *total));
    if (available >= pages) return reservation;  // nothing to change

    // A little more than the row needs: other processes take free pages too (every engine with
    // ucx: UCX's memory pools take a few while the pool has some).
    uint64_t extra = pages - available + kHugePageSpareBytes / page_size;
    uint64_t memory = MemAvailable();
    uint64_t room = memory > kHugePageHeadroom ? (memory - kHugePageHeadroom) / page_size : 0;
    std::string need = "needs " + std::to_string(pages) + " x " + PageName(page_size) + " pages (" +
                       Human(pages * page_size) + ")";
    if (extra > room) {
      return ResourceExhaustedError(need + "; possible here: " + std::to_string(available + room) +
                                    " (" + std::to_string(available) +
                                    " free in the pool, room for " + std::to_string(room) +
                                    " more: MemAvailable " + Human(memory) + " minus " +
                                    Human(kHugePageHeadroom) + " kept for the rest of the host)");
    }
    LARDER_RETURN_IF_ERROR(WriteCounter(reservation->path_, *total + extra));
    reservation->changed_ = true;
    uint64_t now_free = ReadCounter(dir + "free_hugepages").value_or(0);
    uint64_t now_reserved = ReadCounter(dir + "resv_hugepages").value_or(0);
    uint64_t now_available = now_free > now_reserved ? now_free - now_reserved : 0;
    if (now_available < pages) {
      return ResourceExhaustedError(need + "; the kernel could provide only " +
                                    std::to_string(now_available) +
                                    " (physical memory too fragmented)");
    }
    return reservation;
  }

  ~HugePageReservation() {
    if (changed_) WriteCounter(path_, old_total_).IgnoreError();
  }

 private:
  HugePageReservation(std::string path, uint64_t old_total)
      : path_(std::move(path)), old_total_(old_total) {}

  std::string path_;
  uint64_t old_total_;
  bool changed_ = false;
};

// One run's measurements.
struct Sample {
  uint64_t page_size = 0;  // as the owner's engine describes the segment to peers
  std::string route;
  bool verified = false;
  double owner_mount_ms = 0;
  double peer_open_ms = 0;
  double first_get_4k_ms = 0;
  double first_get_4m_ms = 0;
  double second_get_4k_ms = 0;  // the same gets again: what is left once the pages are mapped
  double second_get_4m_ms = 0;
  ProcMemory reader_before_open;
  ProcMemory reader;  // after both gets
  ProcMemory owner;   // after both puts
};

Result<json> Call(ChildProcess& worker, const std::string& role, const json& command) {
  LARDER_RETURN_IF_ERROR(worker.WriteLine(command.dump()));
  LARDER_ASSIGN_OR_RETURN(std::string line, worker.ReadLine(kWorkerTimeout));
  json reply = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (reply.is_discarded() || reply.contains("error")) {
    return InternalError(role + " " + command.value("cmd", "") + ": " +
                         (reply.is_discarded() ? line : reply["error"].get<std::string>()));
  }
  return reply;
}

Result<ChildProcess> SpawnWorker(const std::string& master, uint64_t segment_size,
                                 const std::string& segment_name, const std::string& huge_pages) {
  std::vector<std::string> argv = {SelfExecutable(), "mount-worker",   "--master",
                                   master,           "--segment-size", std::to_string(segment_size),
                                   "--huge-pages",   huge_pages};
  if (!segment_name.empty()) {
    argv.push_back("--segment-name");
    argv.push_back(segment_name);
  }
  return ChildProcess::Spawn(argv, {}, kWorkerTimeout);
}

Result<Sample> RunOnce(const std::string& master, uint64_t size, const std::string& huge_pages,
                       const std::string& tag) {
  Sample sample;
  const std::string segment = "mount-" + tag;
  const std::string small_key = "mount/" + tag + "/4k";
  const std::string large_key = "mount/" + tag + "/4m";

  LARDER_ASSIGN_OR_RETURN(ChildProcess owner, SpawnWorker(master, size, segment, huge_pages));
  LARDER_ASSIGN_OR_RETURN(json info, Call(owner, "owner", {{"cmd", "info"}}));
  sample.owner_mount_ms = info.value("create_ms", 0.0);
  const std::string owner_address = info.value("address", "");
  for (auto [key, bytes] : {std::pair{small_key, kSmallObject}, {large_key, kLargeObject}}) {
    LARDER_RETURN_IF_ERROR(
        Call(owner, "owner",
             {{"cmd", "put"}, {"key", key}, {"size", bytes}, {"preferred", segment}})
            .status());
  }
  LARDER_ASSIGN_OR_RETURN(sample.owner, ReadProcMemory(owner.pid()));

  LARDER_ASSIGN_OR_RETURN(ChildProcess reader, SpawnWorker(master, 0, "", "off"));
  LARDER_RETURN_IF_ERROR(
      Call(reader, "reader", {{"cmd", "prepare"}, {"bytes", kLargeObject}}).status());
  LARDER_ASSIGN_OR_RETURN(sample.reader_before_open, ReadProcMemory(reader.pid()));
  LARDER_ASSIGN_OR_RETURN(json open,
                          Call(reader, "reader", {{"cmd", "open"}, {"segment", segment}}));
  sample.route = open.value("route", "");
  sample.peer_open_ms = open.value("ms", 0.0);
  sample.verified = true;
  for (auto [key, bytes, ms] : {std::tuple{small_key, kSmallObject, &sample.first_get_4k_ms},
                                {large_key, kLargeObject, &sample.first_get_4m_ms},
                                {small_key, kSmallObject, &sample.second_get_4k_ms},
                                {large_key, kLargeObject, &sample.second_get_4m_ms}}) {
    LARDER_ASSIGN_OR_RETURN(
        json got, Call(reader, "reader", {{"cmd", "get"}, {"key", key}, {"size", bytes}}));
    *ms = got.value("ms", 0.0);
    sample.verified = sample.verified && got.value("verified", false);
  }
  LARDER_ASSIGN_OR_RETURN(sample.reader, ReadProcMemory(reader.pid()));
  // After the memory is read: this opens a TCP connection to the owner, which the figures above
  // should not include.
  LARDER_ASSIGN_OR_RETURN(
      json descriptor,
      Call(reader, "reader",
           {{"cmd", "descriptor"}, {"address", owner_address}, {"segment", segment}}));
  sample.page_size = descriptor.value("page_size", uint64_t{0});
  reader.Stop(std::chrono::seconds(10));
  owner.Stop(std::chrono::seconds(10));
  return sample;
}

template <typename T>
T Median(std::vector<T> values) {
  if (values.empty()) return T{};
  std::sort(values.begin(), values.end());
  size_t mid = values.size() / 2;
  if (values.size() % 2 == 1) return values[mid];
  return values[mid - 1] + (values[mid] - values[mid - 1]) / 2;
}

json RowJson(uint64_t size, const std::string& huge_pages, const std::vector<Sample>& samples) {
  auto median = [&samples](auto field) {
    std::vector<decltype(field(samples.front()))> values;
    for (const Sample& sample : samples) values.push_back(field(sample));
    return Median(std::move(values));
  };
  std::string route = samples.front().route;
  bool verified = true;
  for (const Sample& sample : samples) {
    if (sample.route != "shm") route = sample.route;  // any run off shm shows
    verified = verified && sample.verified;
  }
  return {
      {"segment_bytes", size},
      {"huge_pages", huge_pages},
      {"page_size", samples.front().page_size},
      {"repeat", samples.size()},
      {"route", route},
      {"verified", verified},
      {"owner_mount_ms", median([](const Sample& s) { return s.owner_mount_ms; })},
      {"peer_open_ms", median([](const Sample& s) { return s.peer_open_ms; })},
      {"first_get_4k_ms", median([](const Sample& s) { return s.first_get_4k_ms; })},
      {"first_get_4m_ms", median([](const Sample& s) { return s.first_get_4m_ms; })},
      {"second_get_4k_ms", median([](const Sample& s) { return s.second_get_4k_ms; })},
      {"second_get_4m_ms", median([](const Sample& s) { return s.second_get_4m_ms; })},
      {"reader_rss_before_open_bytes",
       median([](const Sample& s) { return s.reader_before_open.rss; })},
      {"reader_rss_bytes", median([](const Sample& s) { return s.reader.rss; })},
      {"reader_rss_shmem_bytes", median([](const Sample& s) { return s.reader.rss_shmem; })},
      {"reader_pte_bytes", median([](const Sample& s) { return s.reader.pte; })},
      {"reader_hugetlb_bytes", median([](const Sample& s) { return s.reader.hugetlb; })},
      {"reader_vm_size_bytes", median([](const Sample& s) { return s.reader.vm_size; })},
      {"owner_rss_bytes", median([](const Sample& s) { return s.owner.rss; })},
      {"owner_rss_shmem_bytes", median([](const Sample& s) { return s.owner.rss_shmem; })},
      {"owner_pte_bytes", median([](const Sample& s) { return s.owner.pte; })},
      {"owner_hugetlb_bytes", median([](const Sample& s) { return s.owner.hugetlb; })},
  };
}

// True when SIGINT or SIGTERM is pending (main blocks them): stop between runs, so that huge-page
// reservations are still given back.
bool Interrupted() {
  sigset_t pending;
  sigemptyset(&pending);
  if (sigpending(&pending) != 0) return false;
  return sigismember(&pending, SIGINT) == 1 || sigismember(&pending, SIGTERM) == 1;
}

// Page size a mode must give; 0 for "auto" (either).
uint64_t ExpectedPageSize(const std::string& huge_pages) {
  if (huge_pages == "2m") return k2MiB;
  if (huge_pages == "1g") return k1GiB;
  if (huge_pages == "off") return static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return 0;
}

}  // namespace

int RunMountBench(const MountBenchOptions& options, std::ostream& out) {
  const uint64_t expected_page = ExpectedPageSize(options.huge_pages);
  const bool reserve = options.huge_pages == "2m" || options.huge_pages == "1g";
  auto master = StartEmbeddedMaster();
  if (!master.ok()) {
    std::cerr << "larder-bench mount: cannot start a master: " << master.status() << "\n";
    return 1;
  }
  const std::string master_address = (*master)->address();

  // One untimed run first: the first processes of a session pay for cold caches (the binary, the
  // master's first registration), which would otherwise land on whichever row comes first.
  RunOnce(master_address, 64ull << 20, "off", std::to_string(getpid()) + "-warmup")
      .status()
      .IgnoreError();

  Table table({"segment", "pages", "route", "owner mount ms", "peer open ms", "get 4K ms",
               "get 4M ms", "again 4K/4M ms", "reader RSS", "reader PTE", "owner RSS",
               "owner shmem"});
  std::vector<std::string> notes;
  bool failed = false;
  for (size_t row = 0; row < options.sizes.size() && !Interrupted(); ++row) {
    const uint64_t size = options.sizes[row];
    json base = {{"segment_bytes", size}, {"huge_pages", options.huge_pages}};
    if (expected_page != 0) base["page_size"] = expected_page;
    auto report = [&](const std::string& what, const std::string& reason) {
      if (options.json) {
        json line = base;
        line[what] = what == "skipped" ? json(true) : json(reason);
        if (what == "skipped") line["reason"] = reason;
        out << line.dump() << std::endl;
      } else {
        notes.push_back(what + " " + FormatByteSize(size) + " (" + options.huge_pages +
                        " pages): " + reason);
      }
    };

    std::unique_ptr<HugePageReservation> reservation;
    if (reserve) {
      uint64_t pages = (size + expected_page - 1) / expected_page;
      auto reserved = HugePageReservation::Reserve(expected_page, pages);
      if (!reserved.ok()) {
        report("skipped", reserved.status().message());
        continue;
      }
      reservation = std::move(*reserved);
    }

    std::vector<Sample> samples;
    Status status;
    for (int run = 0; run < options.repeat && status.ok() && !Interrupted(); ++run) {
      std::string tag =
          std::to_string(getpid()) + "-" + std::to_string(row) + "-" + std::to_string(run);
      auto sample = RunOnce(master_address, size, options.huge_pages, tag);
      if (!sample.ok()) {
        status = sample.status();
      } else if (expected_page != 0 && sample->page_size != expected_page) {
        status = InternalError("the owner's descriptor says page_size " +
                               std::to_string(sample->page_size) + ", asked for " +
                               std::to_string(expected_page));
      } else if (!sample->verified) {
        status = DataLossError("a get returned wrong bytes");
      } else {
        samples.push_back(*sample);
      }
    }
    reservation.reset();  // every worker of the row has exited
    if (!status.ok() || samples.empty()) {
      failed = true;
      report("error", status.ok() ? "interrupted" : status.ToString());
      continue;
    }
    json line = RowJson(size, options.huge_pages, samples);
    if (options.json) {
      out << line.dump() << std::endl;
      continue;
    }
    table.AddRow({FormatByteSize(size), PageName(line["page_size"].get<uint64_t>()),
                  line["route"].get<std::string>(), Fixed(line["owner_mount_ms"], 1),
                  Fixed(line["peer_open_ms"], 2), Fixed(line["first_get_4k_ms"], 3),
                  Fixed(line["first_get_4m_ms"], 3),
                  Fixed(line["second_get_4k_ms"], 3) + " / " + Fixed(line["second_get_4m_ms"], 3),
                  Human(line["reader_rss_bytes"]), Human(line["reader_pte_bytes"]),
                  Human(line["owner_rss_bytes"]), Human(line["owner_rss_shmem_bytes"])});
  }
  if (!options.json) {
    out << "larder-bench mount: huge pages " << options.huge_pages << ", median of "
        << options.repeat << " runs with fresh processes\n"
        << table.ToString();
    for (const std::string& note : notes) out << note << "\n";
  }
  return failed ? 1 : 0;
}

}  // namespace larder::bench
