// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// larder-attach-peer: a test process attached to larder-client. `larder-attach-peer <socket>`
// attaches, prints "READY <segment name>", then runs commands from stdin, one per line:
//   put <prefix> <count> <size>  store keys <prefix>0.. with the test pattern (zero-copy) -> OK
//   crash                        exit at once, without detaching (as a killed process would)
// A failure prints "ERR <status>". EOF on stdin detaches and exits.
#include <unistd.h>

#include <iostream>
#include <sstream>
#include <string>

#include "common/child_process.h"
#include "larder/standalone.h"
#include "standalone/standalone_testing.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: larder-attach-peer <socket>\n";
    return 2;
  }
  larder::AttachOptions options;
  options.socket = argv[1];
  options.client_name = "larder-attach-peer";
  auto store = larder::AttachedStoreClient::Attach(options);
  if (!store.ok()) {
    std::cerr << "larder-attach-peer: " << store.status() << "\n";
    return 1;
  }
  larder::AnnounceReady((*store)->segment_name());
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream words(line);
    std::string command;
    words >> command;
    if (command == "crash") _exit(3);
    if (command != "put") {
      std::cout << "ERR unknown command " << command << std::endl;
      continue;
    }
    std::string prefix;
    size_t count = 0, size = 0;
    words >> prefix >> count >> size;
    auto memory = (*store)->AllocateShared(count * size);
    if (!memory.ok()) {
      std::cout << "ERR " << memory.status() << std::endl;
      continue;
    }
    std::vector<std::string> keys;
    std::vector<void*> ptrs;
    std::vector<size_t> sizes;
    for (size_t i = 0; i < count; ++i) {
      keys.push_back(prefix + std::to_string(i));
      ptrs.push_back(static_cast<char*>(*memory) + i * size);
      sizes.push_back(size);
      larder::standalone::testing::FillPattern(keys.back(), ptrs.back(), size);
    }
    std::string answer = "OK";
    for (const larder::Status& status : (*store)->BatchPutFrom(keys, ptrs, sizes)) {
      if (!status.ok()) answer = "ERR " + status.ToString();
    }
    std::cout << answer << std::endl;
  }
  return 0;
}
