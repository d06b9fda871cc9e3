// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/tenant_stats.h"

#include <algorithm>

#include "master/types.h"

namespace larder::master {

namespace {

uint64_t Delta(uint64_t before, uint64_t after) { return after > before ? after - before : 0; }

}  // namespace

TenantTraffic& TenantTraffic::operator+=(const TenantTraffic& other) {
  lookups += other.lookups;
  lookup_misses += other.lookup_misses;
  gets += other.gets;
  get_misses += other.get_misses;
  return *this;
}

TenantTraffic TenantTraffic::Since(const TenantTraffic& before) const {
  TenantTraffic delta;
  delta.lookups = Delta(before.lookups, lookups);
  delta.lookup_misses = std::min(delta.lookups, Delta(before.lookup_misses, lookup_misses));
  delta.gets = Delta(before.gets, gets);
  delta.get_misses = std::min(delta.gets, Delta(before.get_misses, get_misses));
  return delta;
}

std::optional<double> ServingHitRate(
    const std::vector<std::pair<std::string, TenantTraffic>>& tenants,
    const TenantTraffic& others) {
  uint64_t asked = others.asked(), found = others.found();
  for (const auto& [name, traffic] : tenants) {
    asked += traffic.asked();
    found += traffic.found();
  }
  if (asked == 0) return std::nullopt;
  return static_cast<double>(std::min(found, asked)) / static_cast<double>(asked);
}

std::optional<std::string_view> TenantOfKey(std::string_view key) {
  if (key.empty() || key.front() != '\0') return std::string_view();
  // "\0" + tenant + "\0" + key; "\0\0" + key is the default tenant's.
  const size_t end = key.find('\0', 1);
  if (end == std::string_view::npos || end - 1 > kMaxTenantBytes) return std::nullopt;
  return key.substr(1, end - 1);
}

void TenantTally::Count(std::string_view key, bool hit, uint64_t TenantTraffic::*asked,
                        uint64_t TenantTraffic::*misses) {
  const std::optional<std::string_view> tenant = TenantOfKey(key);
  auto it = std::find_if(rows_.begin(), rows_.end(),
                         [&](const auto& row) { return row.first == tenant; });
  TenantTraffic& traffic =
      it != rows_.end() ? it->second : rows_.emplace_back(tenant, TenantTraffic{}).second;
  traffic.*asked += 1;
  if (!hit) traffic.*misses += 1;
}

void TenantCounters::Merge(const TenantTally& tally) {
  MutexLock lock(mu_);
  for (const auto& [tenant, traffic] : tally.rows_) {
    if (!tenant) {
      others_ += traffic;
      continue;
    }
    auto it =
        std::lower_bound(tenants_.begin(), tenants_.end(), *tenant,
                         [](const auto& row, std::string_view name) { return row.first < name; });
    if (it != tenants_.end() && it->first == *tenant) {
      it->second += traffic;
    } else if (tenants_.size() < kMaxTenants) {
      tenants_.emplace(it, std::string(*tenant), traffic);
    } else {
      others_ += traffic;
    }
  }
}

TenantCounters::Snapshot TenantCounters::Get() const {
  MutexLock lock(mu_);
  return Snapshot{tenants_, others_};
}

}  // namespace larder::master
