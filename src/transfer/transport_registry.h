// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Transports register a factory here under their name and route; the engine builds the ones its
// protocol enables. Which transports exist is decided by which files the build compiles, never by
// #ifdefs in the engine. Thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transfer/transport.h"

namespace larder::transfer {

struct TransportFactory {
  std::string name;
  RouteKind route = RouteKind::kNone;
  std::function<std::unique_ptr<Transport>()> create;
};

class TransportRegistry {
 public:
  static TransportRegistry& Global();

  void Register(TransportFactory factory);
  // Null when no transport serves `route`.
  const TransportFactory* Find(RouteKind route) const;
  std::vector<std::string> Names() const;

 private:
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<TransportFactory>> factories_;  // guarded by mu_
};

}  // namespace larder::transfer

// Registers `factory_fn` (returning std::unique_ptr<Transport>) at static-initialization time.
#define LARDER_REGISTER_TRANSPORT(name, route, factory_fn)                                \
  [[maybe_unused]] static const bool larder_transport_registered_##name = [] {            \
    ::larder::transfer::TransportRegistry::Global().Register({#name, route, factory_fn}); \
    return true;                                                                          \
  }()
