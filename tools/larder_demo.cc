// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// larder-demo: what `make run` shows. By default the store demo: a master and three client
// processes on this host putting and getting KV pages (shm, then tcp forced), every page verified.
// `larder-demo transfer` shows the transfer engine alone between two processes.
#include <CLI/CLI.hpp>
#include <iostream>

#include "bench/common/target.h"
#include "bench/demo/demo.h"
#include "bench/demo/store_demo.h"
#include "bench/store/store_worker.h"
#include "common/child_process.h"
#include "larder/version.h"

int main(int argc, char** argv) {
  larder::BlockTerminationSignals();
  CLI::App app{
      "larder-demo: a master and three processes on this host sharing KV pages through the store"};
  app.set_version_flag("--version", std::string("larder-demo ") + larder::Version(),
                       "print the version and exit");
  larder::bench::StoreDemoOptions store;
  app.add_option("--page-size", store.page_size, "bytes per KV page")->capture_default_str();
  app.add_option("--pages", store.pages_per_writer, "pages each prefill process writes")
      ->capture_default_str();
  app.add_option("--rounds", store.rounds, "read passes (median reported)")->capture_default_str();
  larder::bench::DemoOptions options;
  auto* t = app.add_subcommand("transfer", "two processes moving data over shm and tcp (no store)");
  t->add_option("--size", options.transfer_bytes, "bytes moved per direction and route")
      ->capture_default_str();
  t->add_option("--rounds", options.rounds, "repetitions per direction and route")
      ->capture_default_str();
  larder::bench::StoreWorkerOptions worker;
  auto* w = app.add_subcommand("store-worker", "(internal) a demo client process");
  w->group("");
  w->add_option("--master", worker.master);
  w->add_option("--protocol", worker.protocol);
  w->add_option("--segment-size", worker.segment_size);
  w->add_option("--segment-name", worker.segment_name);
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
  if (w->parsed()) return larder::bench::RunStoreWorker(worker);
  auto status = t->parsed() ? larder::bench::RunDemo(options, std::cout)
                            : larder::bench::RunStoreDemo(store, std::cout);
  if (!status.ok()) {
    std::cerr << "larder-demo: " << status << "\n";
    return 1;
  }
  return 0;
}
