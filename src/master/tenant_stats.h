// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

// Lookups and gets by tenant, for the hit rate a serving engine sees. SGLang and vLLM look keys
// up first (BatchExist) and fetch only the hits, so the gets' own hit rate is near 100% whatever
// the cache holds: an engine's hit rate is its lookups' where it looks up, its gets' where it
// does not (ServingHitRate).

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "common/mutex.h"

namespace larder::master {

struct TenantTraffic {
  // Keys asked, hit or miss, and the misses among them: of BatchExist (lookups) and of
  // GetReplicas with a lease (gets).
  uint64_t lookups = 0, lookup_misses = 0;
  uint64_t gets = 0, get_misses = 0;

  // What the engine was asked and what it found: its lookups when it looks up, else its gets.
  uint64_t asked() const { return lookups > 0 ? lookups : gets; }
  uint64_t found() const {
    return lookups > 0 ? lookups - std::min(lookups, lookup_misses)
                       : gets - std::min(gets, get_misses);
  }
  TenantTraffic& operator+=(const TenantTraffic& other);
  // The counts from `before` to this (a counter that fell counts as nothing).
  TenantTraffic Since(const TenantTraffic& before) const;
};

// found / asked over every tenant (each by its own kind of request); none when nothing was asked.
std::optional<double> ServingHitRate(
    const std::vector<std::pair<std::string, TenantTraffic>>& tenants, const TenantTraffic& others);

// The tenant of a master key ("" for the default tenant's), nullopt when the key's tenant prefix
// is not a valid tenant name (types.h).
std::optional<std::string_view> TenantOfKey(std::string_view key);

// One batch's counts by tenant (a batch usually has one), merged into TenantCounters at once.
class TenantTally {
 public:
  void Lookup(std::string_view key, bool hit) {
    Count(key, hit, &TenantTraffic::lookups, &TenantTraffic::lookup_misses);
  }
  void Get(std::string_view key, bool hit) {
    Count(key, hit, &TenantTraffic::gets, &TenantTraffic::get_misses);
  }
  bool empty() const { return rows_.empty(); }

 private:
  friend class TenantCounters;
  void Count(std::string_view key, bool hit, uint64_t TenantTraffic::*asked,
             uint64_t TenantTraffic::*misses);
  // nullopt: a key with no valid tenant. Views into the batch's keys: merge before they go.
  absl::InlinedVector<std::pair<std::optional<std::string_view>, TenantTraffic>, 2> rows_;
};

// Cumulative counts of the first kMaxTenants tenants seen, and of all later ones together (a
// token holder can name any number of tenants; the master's memory for them is bounded).
// Thread-safe.
class TenantCounters {
 public:
  static constexpr size_t kMaxTenants = 64;

  void Merge(const TenantTally& tally);
  struct Snapshot {
    std::vector<std::pair<std::string, TenantTraffic>> tenants;  // by name
    TenantTraffic others;  // tenants past the first kMaxTenants, and keys with no valid tenant
  };
  Snapshot Get() const;

 private:
  mutable Mutex mu_;
  std::vector<std::pair<std::string, TenantTraffic>> tenants_ LARDER_GUARDED_BY(mu_);
  TenantTraffic others_ LARDER_GUARDED_BY(mu_);
};

}  // namespace larder::master
