// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "bench/demo/store_demo.h"

#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "bench/common/report.h"
#include "bench/store/store_worker.h"
#include "common/child_process.h"
#include "common/env.h"
#include "master/master_server.h"

namespace larder::bench {
namespace {

using json = nlohmann::json;

Result<json> Ask(ChildProcess& worker, const json& command) {
  LARDER_RETURN_IF_ERROR(worker.WriteLine(command.dump()));
  LARDER_ASSIGN_OR_RETURN(std::string line, worker.ReadLine(std::chrono::minutes(5)));
  json reply = json::parse(line, nullptr, false);
  if (reply.is_discarded() || reply.contains("error")) {
    return InternalError("client process answered: " + line);
  }
  return reply;
}

struct PassFigures {
  std::string route;
  double read_gbps = 0;
  double write_gbps = 0;
};

Result<PassFigures> RunPass(const StoreDemoOptions& options, const std::string& master,
                            const std::string& protocol, std::ostream& out) {
  const char* names[] = {"prefill-1", "prefill-2", "decode"};
  std::map<std::string, std::string> env;
  if (!protocol.empty()) env["LARDER_STORE_PROTOCOL"] = protocol;
  std::vector<ChildProcess> clients;
  for (const char* name : names) {
    LARDER_ASSIGN_OR_RETURN(
        ChildProcess client,
        ChildProcess::Spawn({SelfExecutable(), "store-worker", "--master", master, "--segment-size",
                             std::to_string(256ull << 20), "--segment-name",
                             std::string(name) + (protocol.empty() ? "" : "-" + protocol)},
                            env, std::chrono::seconds(30)));
    clients.push_back(std::move(client));
  }
  uint64_t bytes_per_writer = options.page_size * static_cast<uint64_t>(options.pages_per_writer);
  PassFigures figures;
  double write_rate = 0;
  for (int w = 0; w < 2; ++w) {
    // Each prefill process keeps its pages in its own segment (placement: local first).
    LARDER_ASSIGN_OR_RETURN(json put, Ask(clients[w], {{"cmd", "put"},
                                                       {"prefix", std::string(names[w]) + "/page/"},
                                                       {"count", options.pages_per_writer},
                                                       {"value_size", options.page_size},
                                                       {"batch", options.batch}}));
    if (put["errors"] != 0) return InternalError("put failed: " + put.value("first_error", ""));
    write_rate += static_cast<double>(bytes_per_writer) / put["seconds"].get<double>() / 1e9;
  }
  figures.write_gbps = write_rate / 2;
  std::string segment = clients[0].address();
  LARDER_ASSIGN_OR_RETURN(json route, Ask(clients[2], {{"cmd", "route"}, {"segment", segment}}));
  figures.route = route["route"];
  std::vector<double> rates;
  uint64_t verified = 0;
  for (int round = 0; round < options.rounds; ++round) {
    double seconds = 0;
    for (int w = 0; w < 2; ++w) {
      LARDER_ASSIGN_OR_RETURN(json got,
                              Ask(clients[2], {{"cmd", "get"},
                                               {"prefix", std::string(names[w]) + "/page/"},
                                               {"count", options.pages_per_writer},
                                               {"value_size", options.page_size},
                                               {"batch", options.batch}}));
      if (got["verified"] != options.pages_per_writer) {
        return DataLossError("decode read " + got["verified"].dump() + " of " +
                             std::to_string(options.pages_per_writer) + " pages of " + names[w] +
                             " intact: " + got.value("first_error", ""));
      }
      verified += got["verified"].get<uint64_t>();
      seconds += got["seconds"].get<double>();
    }
    rates.push_back(2.0 * static_cast<double>(bytes_per_writer) / seconds / 1e9);
  }
  figures.read_gbps = Percentile(rates, 50);
  out << "  prefill-1, prefill-2: put " << options.pages_per_writer << " pages of "
      << FormatByteSize(options.page_size) << " each into their own segments ("
      << Fixed(figures.write_gbps, 2) << " GB/s)\n"
      << "  decode: read all " << 2 * options.pages_per_writer << " pages from the other two "
      << "processes over " << figures.route << ": " << Fixed(figures.read_gbps, 2)
      << " GB/s (median of " << options.rounds << " passes), " << verified
      << " pages verified, 0 wrong\n";
  for (ChildProcess& client : clients) client.Stop(std::chrono::seconds(10));
  return figures;
}

}  // namespace

Status RunStoreDemo(const StoreDemoOptions& options, std::ostream& out) {
  LARDER_ASSIGN_OR_RETURN(auto master, StartEmbeddedMaster(/*http_port=*/0));
  out << "larder-master on " << master->address()
      << " (metrics: http://127.0.0.1:" << master->http_port() << "/metrics)\n\n";
  out << "1. Store protocol auto (LARDER_STORE_PROTOCOL unset): same-host peers map each "
         "other's segments\n";
  LARDER_ASSIGN_OR_RETURN(PassFigures shm, RunPass(options, master->address(), "", out));
  if (shm.route != "shm") {
    return FailedPreconditionError("same-host reads took '" + shm.route + "', expected shm");
  }
  out << "\n2. LARDER_STORE_PROTOCOL=tcp: the same reads through the network stack\n";
  LARDER_ASSIGN_OR_RETURN(PassFigures tcp, RunPass(options, master->address(), "tcp", out));
  out << "\nshm reads were " << Fixed(shm.read_gbps / std::max(tcp.read_gbps, 1e-9), 1)
      << "x the tcp reads on this host.\n";
  master::MasterStats stats = master->state().Stats();
  out << "master: " << stats.puts << " puts and " << stats.gets << " gets served; now "
      << stats.objects << " objects and " << stats.clients
      << " clients (each client unmounted its segment as it left)\n";
  return Status::Ok();
}

}  // namespace larder::bench
