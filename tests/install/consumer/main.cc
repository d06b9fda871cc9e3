// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Uses an installed Larder as any program would: joins the cluster at argv[1] with a store client
// that contributes 8 MiB, puts a value, reads it back, and prints "ok <version>".
#include <larder/store_client.h>
#include <larder/version.h>

#include <cstdio>
#include <span>
#include <string>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer MASTER_HOST:PORT\n");
    return 2;
  }
  larder::StoreClientOptions options;
  options.master_address = argv[1];
  options.global_segment_size = 8 << 20;
  auto client = larder::StoreClient::Create(options);
  if (!client.ok()) {
    std::fprintf(stderr, "consumer: %s\n", client.status().ToString().c_str());
    return 1;
  }
  const std::string value(100000, 'v');
  larder::Status put = (*client)->Put("consumer/key", std::as_bytes(std::span(value)));
  if (!put.ok()) {
    std::fprintf(stderr, "consumer: put: %s\n", put.ToString().c_str());
    return 1;
  }
  auto got = (*client)->Get("consumer/key");
  if (!got.ok() || *got != value) {
    std::fprintf(stderr, "consumer: get: %s\n",
                 got.ok() ? "other bytes" : got.status().ToString().c_str());
    return 1;
  }
  std::printf("ok %s\n", std::string(larder::Version()).c_str());
  return 0;
}
