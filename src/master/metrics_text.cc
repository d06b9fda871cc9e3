// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "master/metrics_text.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>
#include <vector>

#include "larder/version.h"
#include "master/http_routes_internal.h"
#include "master/master_state.h"

namespace larder::master {

namespace {

// A Prometheus histogram in seconds: cumulative buckets, +Inf, _sum and _count.
void Histogram(std::ostringstream& out, const char* name, const char* help,
               const LatencyHistogram::Snapshot& snapshot) {
  out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " histogram\n";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < LatencyHistogram::kBounds.size(); ++i) {
    cumulative += snapshot.counts[i];
    out << name << "_bucket{le=\"" << static_cast<double>(LatencyHistogram::kBounds[i]) / 1e9
        << "\"} " << cumulative << '\n';
  }
  out << name << "_bucket{le=\"+Inf\"} " << snapshot.count << '\n'
      << name << "_sum " << static_cast<double>(snapshot.sum_ns) / 1e9 << '\n'
      << name << "_count " << snapshot.count << '\n';
}

// A label value as Prometheus' text format wants it: backslash, quote and newline escaped.
std::string LabelValue(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// Every store client's transfer counters summed by route and locality (traffic_totals.h): the
// same series whatever clients come and go, and all of them from the start.
void RenderTrafficTotals(std::ostringstream& out, const MasterState& state) {
  const auto totals = state.TrafficByLocality();
  struct Family {
    const char* name;
    const char* help;
    uint64_t TrafficTotals::Counters::*field;
  };
  static constexpr Family kFamilies[] = {
      {"larder_transfer_requests_total",
       "Transfer requests the store clients' engines finished, by route and by whether the peer "
       "ran on the same host.",
       &TrafficTotals::Counters::requests},
      {"larder_transfer_bytes_total",
       "Bytes the store clients' engines moved, by route and by whether the peer ran on the same "
       "host (route=\"tcp\",locality=\"same_host\" is the hairpin through the network stack).",
       &TrafficTotals::Counters::bytes},
      {"larder_transfer_failures_total",
       "Transfer requests of the store clients' engines that failed, by route and locality.",
       &TrafficTotals::Counters::failures},
  };
  for (const Family& family : kFamilies) {
    out << "# HELP " << family.name << ' ' << family.help << "\n# TYPE " << family.name
        << " counter\n";
    for (const auto& [key, counters] : totals) {
      out << family.name << "{route=\"" << LabelValue(key.route) << "\",locality=\""
          << LocalityName(key.locality) << "\"} " << counters.*family.field << '\n';
    }
  }
}

// Series per client and peer engine (MasterOptions::metrics_per_client).
void RenderTraffic(std::ostringstream& out, const MasterState& state) {
  auto traffic = state.Traffic();
  struct Family {
    const char* name;
    const char* help;
    uint64_t RouteTrafficReport::*field;
  };
  static constexpr Family kFamilies[] = {
      {"larder_client_transfer_requests_total",
       "Transfer requests a client's engine finished, by peer engine and route.",
       &RouteTrafficReport::requests},
      {"larder_client_transfer_bytes_total",
       "Bytes a client's engine moved, by peer engine and route (tcp to a peer on the same host "
       "is the hairpin to watch for).",
       &RouteTrafficReport::bytes},
      {"larder_client_transfer_failures_total",
       "Transfer requests of a client's engine that failed, by peer engine and route.",
       &RouteTrafficReport::failures},
  };
  for (const Family& family : kFamilies) {
    out << "# HELP " << family.name << ' ' << family.help << "\n# TYPE " << family.name
        << " counter\n";
    for (const auto& [client, report] : traffic) {
      for (const RouteTrafficReport& route : report.routes) {
        out << family.name << "{client=\"" << LabelValue(client) << "\",peer=\""
            << LabelValue(route.peer_client_id) << "\",route=\"" << LabelValue(route.route)
            << "\"} " << route.*family.field << '\n';
      }
    }
  }
  // One family per gauge a client's transports report (EngineStats::Values), each client with a
  // line, 0 where its heartbeat did not name that gauge.
  for (const auto& [name, transport] : GaugeNames(traffic)) {
    out << "# HELP larder_client_" << name << " The " << transport << " transport's gauge " << name
        << " of a client, as its heartbeats report it (docs/operations.md).\n"
           "# TYPE larder_client_"
        << name << " gauge\n";
    for (const auto& [client, report] : traffic) {
      out << "larder_client_" << name << "{client=\"" << LabelValue(client) << "\"} "
          << report.Gauge(name) << '\n';
    }
  }
}

// Lookups and gets by tenant. The tenant label is the tenant's name ("" for the default tenant);
// tenants past the first TenantCounters::kMaxTenants share one series with other_tenants="true".
void RenderTenants(std::ostringstream& out, const TenantCounters::Snapshot& snapshot) {
  struct Family {
    const char* name;
    const char* help;
    uint64_t TenantTraffic::*field;
  };
  static constexpr Family kFamilies[] = {
      {"larder_tenant_lookups_total", "Keys a tenant looked up (BatchExist), found or not.",
       &TenantTraffic::lookups},
      {"larder_tenant_lookup_misses_total", "Keys a tenant looked up that were absent.",
       &TenantTraffic::lookup_misses},
      {"larder_tenant_gets_total", "Keys a tenant asked of GetReplicas, found or not.",
       &TenantTraffic::gets},
      {"larder_tenant_get_misses_total", "Keys a tenant asked of GetReplicas that were absent.",
       &TenantTraffic::get_misses},
  };
  for (const Family& family : kFamilies) {
    out << "# HELP " << family.name << ' ' << family.help << "\n# TYPE " << family.name
        << " counter\n";
    for (const auto& [tenant, traffic] : snapshot.tenants) {
      out << family.name << "{tenant=\"" << LabelValue(tenant) << "\"} " << traffic.*family.field
          << '\n';
    }
    if (snapshot.others.lookups + snapshot.others.gets > 0) {
      out << family.name << "{other_tenants=\"true\"} " << snapshot.others.*family.field << '\n';
    }
  }
}

}  // namespace

// The disk tier (docs/disk-tier.md): demotions by outcome, disk hits, promotions, copies, and
// each holder's disk.
void RenderDiskTier(std::ostringstream& out, const DiskTier& tier) {
  const DiskTierCounters& c = tier.counters();
  out << "# HELP larder_disk_demotions_total Demotions to the disk tier, by outcome: demoted "
         "(recorded), failed (the holder could not), timed_out, refused (the key changed "
         "meanwhile), queue_full (not queued: left to eviction).\n"
         "# TYPE larder_disk_demotions_total counter\n";
  const std::pair<const char*, uint64_t> demotions[] = {{"demoted", c.demoted.load()},
                                                        {"failed", c.demote_failed.load()},
                                                        {"timed_out", c.demote_timed_out.load()},
                                                        {"refused", c.demote_refused.load()},
                                                        {"queue_full", c.queue_full.load()}};
  for (const auto& [outcome, value] : demotions) {
    out << "larder_disk_demotions_total{outcome=\"" << outcome << "\"} " << value << '\n';
  }
  out << "# HELP larder_disk_evictions_total Memory replicas evicted while a holder was "
         "polling, by whether a disk copy kept the object.\n"
         "# TYPE larder_disk_evictions_total counter\n"
      << "larder_disk_evictions_total{disk_copy=\"kept\"} " << c.evicted_with_copy.load() << '\n'
      << "larder_disk_evictions_total{disk_copy=\"none\"} " << c.evicted_dropped.load() << '\n';
  auto metric = [&](const char* name, const char* type, const char* help, uint64_t value) {
    out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n'
        << name << ' ' << value << '\n';
  };
  metric("larder_disk_demotions_queued_total", "counter", "Demotions handed to holders.",
         c.demotions_queued.load());
  metric("larder_disk_hits_total", "counter",
         "Gets of objects found only on disk (answered OnDisk while the holder brings them back).",
         c.disk_hits.load());
  metric("larder_disk_promotions_total", "counter", "Disk copies asked back into memory.",
         c.promotions_queued.load());
  Histogram(out, "larder_disk_promotion_seconds",
            "How long disk copies took to come back into memory: from the first get that found "
            "the key only on disk to the holder's put of it (its disk read and copy).",
            tier.PromotionTimes());
  metric("larder_disk_promotion_failures_total", "counter",
         "Promotions the holder could not do (the copy failed its checks, or memory was full).",
         c.promote_failed.load());
  metric("larder_disk_copies_evicted_total", "counter", "Disk copies the holders' disks evicted.",
         c.disk_evicted.load());
  metric("larder_disk_copies_announced_total", "counter",
         "Disk copies taken from holders' announcements (after a restart of either).",
         c.announced.load());
  metric("larder_disk_copies", "gauge", "Disk copies recorded.", tier.copies());
  const std::vector<DiskHolderView> holders = tier.Holders();
  out << "# HELP larder_disk_holder_online Whether the holder of each disk polls.\n"
         "# TYPE larder_disk_holder_online gauge\n";
  for (const DiskHolderView& h : holders) {
    out << "larder_disk_holder_online{disk=\"" << h.report.identity << "\",host=\""
        << LabelValue(h.host_id) << "\"} " << (h.online ? 1 : 0) << '\n';
  }
  struct HolderGauge {
    const char* name;
    const char* help;
    uint64_t DiskHolderView::*field;
  };
  const HolderGauge gauges[] = {
      {"larder_disk_holder_copy_bytes", "Bytes of the disk copies recorded per disk.",
       &DiskHolderView::copy_bytes},
      {"larder_disk_holder_queued", "Demotions queued per disk.", &DiskHolderView::queued}};
  for (const auto& [name, help, field] : gauges) {
    out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " gauge\n";
    for (const DiskHolderView& h : holders) {
      out << name << "{disk=\"" << h.report.identity << "\"} " << h.*field << '\n';
    }
  }
  struct DiskGauge {
    const char* name;
    const char* help;
    uint64_t DiskHolderReport::*field;
  };
  const DiskGauge disks[] = {
      {"larder_disk_capacity_bytes", "Each disk's capacity, as its holder last said.",
       &DiskHolderReport::capacity_bytes},
      {"larder_disk_used_bytes", "Bytes of each disk's region files.",
       &DiskHolderReport::used_bytes},
      {"larder_disk_records", "Records on each disk.", &DiskHolderReport::records}};
  for (const auto& [name, help, field] : disks) {
    out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " gauge\n";
    for (const DiskHolderView& h : holders) {
      out << name << "{disk=\"" << h.report.identity << "\"} " << h.report.*field << '\n';
    }
  }
}

std::string RenderMetrics(const MasterState& state) {
  MasterStats stats = state.Stats();
  std::ostringstream out;
  auto metric = [&](const char* name, const char* type, const char* help, uint64_t value) {
    out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n'
        << name << ' ' << value << '\n';
  };
  metric("larder_objects", "gauge", "Objects stored (complete or being written).", stats.objects);
  metric("larder_soft_pinned_objects", "gauge",
         "Complete objects with a soft pin (evicted only after every unpinned object).",
         stats.soft_pinned_objects);
  metric("larder_bytes_used", "gauge", "Bytes allocated in all segments.", stats.bytes_used);
  metric("larder_bytes_capacity", "gauge", "Bytes of all mounted segments.", stats.bytes_capacity);
  metric("larder_segments", "gauge", "Mounted segments.", stats.segments);
  metric("larder_clients", "gauge", "Registered, live clients.", stats.clients);
  metric("larder_puts_total", "counter", "Puts completed.", stats.puts);
  metric("larder_gets_total", "counter", "Leases granted by GetReplicas.", stats.gets);
  metric("larder_get_misses_total", "counter", "GetReplicas of absent or incomplete keys.",
         stats.get_misses);
  metric("larder_lookups_total", "counter",
         "Keys looked up (BatchExist: is_exist, batch_is_exist), found or not.", stats.lookups);
  metric("larder_lookup_misses_total", "counter", "Keys looked up that were absent or incomplete.",
         stats.lookup_misses);
  RenderTenants(out, state.TenantStats());
  metric("larder_removes_total", "counter", "Objects removed by clients.", stats.removes);
  metric("larder_evictions_total", "counter", "Objects evicted.", stats.evictions);
  metric("larder_evicted_bytes_total", "counter", "Bytes evicted.", stats.evicted_bytes);
  metric("larder_lease_expiries_total", "counter",
         "Leases never released that ran out at the lease TTL (a reader died or stalled).",
         stats.lease_expiries);
  metric("larder_lease_releases_total", "counter", "Leases released by their reader.",
         stats.lease_releases);
  metric("larder_lease_releases_unknown_total", "counter",
         "Releases of leases not held: released before, expired, or from an earlier master.",
         stats.lease_releases_unknown);
  metric("larder_lease_releases_refused_total", "counter",
         "Releases refused because another client holds the lease.", stats.lease_releases_refused);
  metric("larder_leases_active", "gauge", "Leases granted and neither released nor expired.",
         stats.leases_active);
  Histogram(out, "larder_lease_hold_seconds",
            "How long read leases were held: grant to release, or the TTL when they expired.",
            state.LeaseHoldTimes());
  out << "# HELP larder_put_refusals_total Puts refused, by reason: no_space (nothing evictable: "
         "every object leased, pinned or being written), invalid (key, size, replicas).\n"
         "# TYPE larder_put_refusals_total counter\n"
      << "larder_put_refusals_total{reason=\"no_space\"} " << stats.put_refusals_no_space << '\n'
      << "larder_put_refusals_total{reason=\"invalid\"} " << stats.put_refusals_invalid << '\n';
  out << "# HELP larder_evictions_per_second Objects evicted per second over the last 10 s.\n"
         "# TYPE larder_evictions_per_second gauge\nlarder_evictions_per_second "
      << stats.evictions_per_second << '\n';
  metric("larder_eviction_runs_total", "counter", "Eviction runs (one per put that needed space).",
         stats.eviction_runs);
  metric("larder_eviction_scanned_total", "counter", "Objects examined by eviction runs.",
         stats.eviction_scanned);
  Histogram(out, "larder_eviction_seconds", "How long each eviction run took.",
            state.EvictionTimes());
  metric("larder_put_revokes_total", "counter", "Puts revoked (by the writer or on timeout).",
         stats.put_revokes);
  metric("larder_client_expiries_total", "counter", "Clients expired for missing heartbeats.",
         stats.client_expiries);
  metric("larder_recovered_objects_total", "counter",
         "Objects (or replicas) rebuilt from the clients' catalogs.", stats.recovered_objects);
  metric("larder_catalog_entries_dropped_total", "counter",
         "Catalog entries refused at a rebuild (bad, overlapping, conflicting, duplicate).",
         stats.catalog_entries_dropped);
  RenderDiskTier(out, state.disk());
  out << "# HELP larder_segment_bytes_used Bytes allocated per segment.\n"
         "# TYPE larder_segment_bytes_used gauge\n";
  auto segments = state.ListSegments({});
  for (const SegmentView& segment : segments) {
    out << "larder_segment_bytes_used{segment=\"" << LabelValue(segment.name) << "\"} "
        << segment.used << '\n';
  }
  out << "# HELP larder_segment_bytes_capacity Bytes per segment.\n"
         "# TYPE larder_segment_bytes_capacity gauge\n";
  for (const SegmentView& segment : segments) {
    out << "larder_segment_bytes_capacity{segment=\"" << LabelValue(segment.name) << "\"} "
        << segment.size << '\n';
  }
  out << "# HELP larder_segment_page_bytes Page size behind each segment (4 KiB, or huge pages).\n"
         "# TYPE larder_segment_page_bytes gauge\n";
  for (const SegmentView& segment : segments) {
    out << "larder_segment_page_bytes{segment=\"" << LabelValue(segment.name) << "\"} "
        << segment.descriptor.page_size << '\n';
  }
  RenderTrafficTotals(out, state);
  if (state.options().metrics_per_client) RenderTraffic(out, state);
  return out.str();
}

}  // namespace larder::master
