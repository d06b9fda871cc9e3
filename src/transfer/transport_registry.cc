// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/transport_registry.h"

namespace larder::transfer {

TransportRegistry& TransportRegistry::Global() {
  static TransportRegistry* registry = new TransportRegistry();
  return *registry;
}

void TransportRegistry::Register(TransportFactory factory) {
  std::lock_guard lock(mu_);
  factories_.push_back(std::make_unique<TransportFactory>(std::move(factory)));
}

const TransportFactory* TransportRegistry::Find(RouteKind route) const {
  std::lock_guard lock(mu_);
  for (const auto& f : factories_) {
    if (f->route == route) return f.get();
  }
  return nullptr;
}

std::vector<std::string> TransportRegistry::Names() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> names;
  for (const auto& f : factories_) names.push_back(f->name);
  return names;
}

}  // namespace larder::transfer
