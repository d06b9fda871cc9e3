// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Transports register a factory here under their name; the engine builds the ones its protocol
// enables. The registry is the only place that knows which transports exist, how "auto" ranks
// them, and which protocol names are valid: which transports exist is decided by which files the
// build compiles, never by #ifdefs or switches in the engine. Thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/mutex.h"
#include "transfer/transport.h"

namespace larder::transfer {

struct TransportFactory {
  std::string name;  // also the route's name; at most RouteKind::kMaxNameBytes
  // Routes are tried in ascending preference: the closest route that reaches a peer wins.
  int preference = 0;
  // Whether "auto" enables this transport.
  bool in_auto = true;
  std::function<std::unique_ptr<Transport>(const TransportSelection&)> create;
};

// One transport that a protocol string enables.
struct SelectedTransport {
  const TransportFactory* factory = nullptr;
  TransportSelection selection;
};

class TransportRegistry {
 public:
  // The process's registry, with every transport this build has.
  static TransportRegistry& Global();

  // Aborts on a duplicate or over-long name: both are programming errors of a build.
  void Register(TransportFactory factory);
  // Null when no transport is named `name`.
  const TransportFactory* Find(std::string_view name) const;
  // The transports that `protocol` enables ("auto", names, or a comma list of both), in
  // preference order. InvalidArgument for an empty protocol or an unknown name (listing the
  // names this build has).
  Result<std::vector<SelectedTransport>> Select(std::string_view protocol) const;
  // "auto, local, shm, tcp, ..." in preference order: what a protocol string may name.
  std::string ProtocolNames() const;

 private:
  mutable Mutex mu_;
  // In ascending preference.
  std::vector<std::unique_ptr<TransportFactory>> factories_ LARDER_GUARDED_BY(mu_);
};

}  // namespace larder::transfer

// Defines the registration of a transport: `name` (an identifier, also the route's name), its
// preference for route choice, whether "auto" includes it, and `factory_fn`
// (const TransportSelection& -> std::unique_ptr<Transport>). Used once, in namespace
// larder::transfer, in the transport's own source; the registry calls it when it is first used,
// for every transport the build has (the generated builtin_transports.cc).
#define LARDER_REGISTER_TRANSPORT(name, preference, in_auto, factory_fn) \
  void RegisterTransport_##name(TransportRegistry& registry) {           \
    registry.Register({#name, preference, in_auto, factory_fn});         \
  }                                                                      \
  static_assert(true, "a use of LARDER_REGISTER_TRANSPORT ends with ;")
