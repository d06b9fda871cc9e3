// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/transport_registry.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace larder::transfer {

// Registers every transport the build has (generated: builtin_transports.cc.in).
void RegisterBuiltinTransports(TransportRegistry& registry);

TransportRegistry& TransportRegistry::Global() {
  static TransportRegistry* registry = [] {
    auto* built = new TransportRegistry();
    RegisterBuiltinTransports(*built);
    return built;
  }();
  return *registry;
}

void TransportRegistry::Register(TransportFactory factory) {
  MutexLock lock(mu_);
  bool duplicate = std::any_of(factories_.begin(), factories_.end(),
                               [&](const auto& f) { return f->name == factory.name; });
  if (duplicate || factory.name.empty() || factory.name.size() > RouteKind::kMaxNameBytes ||
      factory.name == "auto" || factory.name == "none") {
    std::fprintf(stderr, "larder: cannot register transport '%s'\n", factory.name.c_str());
    std::abort();
  }
  auto at =
      std::upper_bound(factories_.begin(), factories_.end(), factory.preference,
                       [](int preference, const auto& f) { return preference < f->preference; });
  factories_.insert(at, std::make_unique<TransportFactory>(std::move(factory)));
}

const TransportFactory* TransportRegistry::Find(std::string_view name) const {
  MutexLock lock(mu_);
  for (const auto& f : factories_) {
    if (f->name == name) return f.get();
  }
  return nullptr;
}

std::string TransportRegistry::ProtocolNames() const {
  MutexLock lock(mu_);
  std::string names = "auto";
  for (const auto& f : factories_) names += ", " + f->name;
  return names;
}

Result<std::vector<SelectedTransport>> TransportRegistry::Select(std::string_view protocol) const {
  std::vector<const TransportFactory*> all;
  {
    MutexLock lock(mu_);
    for (const auto& f : factories_) all.push_back(f.get());
  }
  std::vector<bool> in_auto(all.size(), false), named(all.size(), false);
  bool any = false;
  size_t start = 0;
  while (start <= protocol.size()) {
    size_t comma = protocol.find(',', start);
    std::string_view name = protocol.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
    while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
    if (name == "auto") {
      for (size_t i = 0; i < all.size(); ++i) in_auto[i] = in_auto[i] || all[i]->in_auto;
    } else {
      auto it = std::find_if(all.begin(), all.end(), [&](auto* f) { return f->name == name; });
      if (it == all.end()) {
        return InvalidArgumentError("unknown protocol '" + std::string(name) + "' in '" +
                                    std::string(protocol) +
                                    "' (this build has: " + ProtocolNames() + "; or a comma list)");
      }
      named[it - all.begin()] = true;
    }
    any = true;
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  if (!any) return InvalidArgumentError("empty protocol");
  std::vector<SelectedTransport> selected;
  for (size_t i = 0; i < all.size(); ++i) {
    if (in_auto[i] || named[i]) selected.push_back({all[i], {.named = named[i]}});
  }
  return selected;
}

}  // namespace larder::transfer
