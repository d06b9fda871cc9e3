// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// larder-demo: what `make run` shows. Starts a target process on this host, then moves data to
// and from its segment over every route (shm between the two processes, tcp forced), verifies
// every byte, and prints the route and bandwidth of each.
#include <CLI/CLI.hpp>
#include <iostream>

#include "bench/demo.h"
#include "bench/process.h"
#include "bench/target.h"

int main(int argc, char** argv) {
  larder::bench::BlockTerminationSignals();
  CLI::App app{"larder-demo: two processes on this host moving data over shm and tcp"};
  larder::bench::DemoOptions options;
  app.add_option("--size", options.transfer_bytes, "bytes moved per direction and route")
      ->capture_default_str();
  app.add_option("--rounds", options.rounds, "repetitions per direction and route")
      ->capture_default_str();
  larder::bench::TargetOptions target;
  auto* g = app.add_subcommand("target", "(internal) the demo's target process");
  g->add_option("--listen", target.listen_address);
  g->add_option("--segment-size", target.segment_size);
  g->add_option("--segment-name", target.segment_name);
  g->add_option("--protocol", target.protocol);
  g->add_flag("--huge-pages", target.huge_pages);
  CLI11_PARSE(app, argc, argv);
  if (g->parsed()) {
    auto status = larder::bench::RunTarget(target);
    if (!status.ok()) std::cerr << "larder-demo target: " << status << "\n";
    return status.ok() ? 0 : 1;
  }
  auto status = larder::bench::RunDemo(options, std::cout);
  if (!status.ok()) {
    std::cerr << "larder-demo: " << status << "\n";
    return 1;
  }
  return 0;
}
