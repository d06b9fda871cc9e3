// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/status_page.h"

namespace larder::master {

namespace {

constexpr std::string_view kPage = R"page(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Larder</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 0; background: #f6f7f9; color: #1d2330; }
  header { background: #1d2330; color: #fff; padding: 10px 20px; display: flex; gap: 16px;
           align-items: baseline; }
  header h1 { font-size: 18px; margin: 0; }
  header .meta { color: #aab3c5; }
  main { padding: 16px 20px; }
  .cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr)); gap: 10px; }
  .card { background: #fff; border-radius: 6px; padding: 10px 12px; box-shadow: 0 1px 2px #0002; }
  .card .label { color: #5b6477; font-size: 12px; }
  .card .value { font-size: 20px; font-weight: 600; }
  .charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(320px, 1fr));
            gap: 10px; margin-top: 14px; }
  .chart { background: #fff; border-radius: 6px; padding: 8px 12px; box-shadow: 0 1px 2px #0002; }
  .chart h3 { font-size: 13px; margin: 0 0 4px; color: #5b6477; font-weight: 600; }
  .chart svg { width: 100%; height: 120px; }
  .legend span { margin-right: 10px; font-size: 12px; }
  h2 { font-size: 15px; margin: 20px 0 6px; }
  table { border-collapse: collapse; width: 100%; background: #fff; box-shadow: 0 1px 2px #0002; }
  th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid #e6e8ee; font-size: 13px; }
  th { background: #eef0f4; font-weight: 600; }
  td.num { text-align: right; font-variant-numeric: tabular-nums; }
  .bar { background: #e6e8ee; height: 6px; border-radius: 3px; width: 80px; display: inline-block;
         vertical-align: middle; margin-left: 6px; }
  .bar i { display: block; height: 6px; border-radius: 3px; background: #3b7ddd; }
  #auth { display: none; background: #fff3cd; padding: 10px 12px; border-radius: 6px;
          margin-bottom: 12px; }
  #error { color: #b3261e; }
</style>
</head>
<body>
<header><h1>Larder</h1><span class="meta">version <span id="version">-</span>, role
<span id="role">-</span>, incarnation <span id="incarnation">-</span></span>
<span class="meta" id="error"></span></header>
<main>
<form id="auth">This master has a cluster token: its segment and client lists need the admin
token. <input id="token" type="password" size="40" placeholder="admin token">
<button type="submit">Use</button></form>
<div class="cards">
  <div class="card"><div class="label">objects</div><div class="value" id="objects">-</div></div>
  <div class="card"><div class="label">bytes used / capacity</div>
    <div class="value"><span id="bytes_used">-</span> / <span id="bytes_capacity">-</span></div></div>
  <div class="card"><div class="label">hit rate (as engines see it)</div><div class="value" id="hit_rate">-</div></div>
  <div class="card"><div class="label">ops/s (last interval)</div><div class="value" id="ops_per_s">-</div></div>
  <div class="card"><div class="label">evictions/s (10 s)</div><div class="value" id="evictions_per_s">-</div></div>
  <div class="card"><div class="label">evictions</div><div class="value" id="evictions">-</div></div>
  <div class="card"><div class="label">lease expiries</div><div class="value" id="lease_expiries">-</div></div>
  <div class="card"><div class="label">clients / segments</div>
    <div class="value"><span id="clients">-</span> / <span id="segments">-</span></div></div>
  <div class="card"><div class="label">disk copies / disk hits</div>
    <div class="value"><span id="disk_copies">-</span> / <span id="disk_hits">-</span></div></div>
</div>
<div class="charts">
  <div class="chart"><h3>operations per second</h3><svg id="chart-ops"></svg></div>
  <div class="chart"><h3>hit rate</h3><svg id="chart-hits"></svg></div>
  <div class="chart"><h3>bytes per second by route</h3><svg id="chart-routes"></svg>
    <div class="legend" id="legend-routes"></div></div>
</div>
<h2>Tenants</h2>
<table><thead><tr><th>tenant</th><th>lookups</th><th>gets</th><th>hit rate</th><th>of</th></tr></thead>
<tbody id="tenant-rows"></tbody></table>
<h2>Segments</h2>
<table><thead><tr><th>name</th><th>owner</th><th>host</th><th>size</th><th>used</th>
<th>objects</th><th>page</th><th>bytes moved with the owner, by route</th></tr></thead>
<tbody id="segment-rows"></tbody></table>
<h2>Clients</h2>
<table><thead><tr><th>client</th><th>host</th><th>pid</th><th>alive</th>
<th>last heartbeat</th><th>segments</th><th>bytes it moved, by route</th></tr></thead>
<tbody id="client-rows"></tbody></table>
</main>
<script>
"use strict";
const COLORS = ["#3b7ddd", "#e8833a", "#2e9d5b", "#b04fc8", "#c9473c", "#7a8699"];
function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n.toFixed(0) : n.toFixed(1)) + " " + units[i];
}
function percent(x) { return x === null || x === undefined ? "-" : (100 * x).toFixed(1) + "%"; }
function rate(x) { return x >= 100 ? x.toFixed(0) : x.toFixed(1); }
function text(id, value) { document.getElementById(id).textContent = value; }
function cell(row, value, field, numeric) {
  const td = row.insertCell();
  td.textContent = value;
  if (field) td.dataset.field = field;
  if (numeric) td.className = "num";
  return td;
}
function routes(r) {
  const parts = Object.keys(r).sort().map(k => k + " " + bytes(r[k].bytes));
  return parts.length ? parts.join(", ") : "-";
}
async function get(path) {
  const headers = {};
  const token = sessionStorage.getItem("larder-admin-token");
  if (token) headers["Authorization"] = "Bearer " + token;
  const response = await fetch(path, {headers, cache: "no-store"});
  if (response.status === 401 || response.status === 403) {
    document.getElementById("auth").style.display = "block";
    return null;
  }
  if (!response.ok) throw new Error(path + ": HTTP " + response.status);
  return response.json();
}
function chart(id, series, format) {
  const svg = document.getElementById(id);
  const w = 320, h = 120, bottom = 16;
  svg.setAttribute("viewBox", "0 0 " + w + " " + h);
  let max = 0, t0 = Infinity, t1 = -Infinity;
  for (const s of series) for (const [t, v] of s.points) {
    if (v !== null) max = Math.max(max, v);
    t0 = Math.min(t0, t); t1 = Math.max(t1, t);
  }
  if (max === 0) max = 1;
  // No samples yet (an idle master just started): an empty second ending now.
  if (!Number.isFinite(t1)) t1 = Date.now();
  if (!(t1 > t0)) { t0 = t1 - 1; }
  // Room on the left for the axis label ("1023.9 MiB/s"), at about 6 px a character.
  const left = Math.max(44, 6 * format(max).length + 8);
  const x = t => left + (w - left - 4) * (t - t0) / (t1 - t0);
  const y = v => 4 + (h - bottom - 4) * (1 - v / max);
  let out = '<line x1="' + left + '" y1="' + y(0) + '" x2="' + (w - 4) + '" y2="' + y(0) +
            '" stroke="#ccd"/>';
  out += '<text x="' + (left - 4) + '" y="10" font-size="10" text-anchor="end">' + format(max) +
         '</text><text x="' + (left - 4) + '" y="' + y(0) +
         '" font-size="10" text-anchor="end">0</text>';
  const seconds = Math.round((t1 - t0) / 1000);
  out += '<text x="' + left + '" y="' + (h - 2) + '" font-size="10">-' + seconds +
         ' s</text><text x="' + (w - 4) + '" y="' + (h - 2) +
         '" font-size="10" text-anchor="end">now</text>';
  series.forEach((s, i) => {
    const pts = s.points.filter(p => p[1] !== null).map(p => x(p[0]).toFixed(1) + "," +
                                                            y(p[1]).toFixed(1));
    out += '<polyline fill="none" stroke-width="1.5" stroke="' + COLORS[i % COLORS.length] +
           '" points="' + pts.join(" ") + '"/>';
  });
  svg.innerHTML = out;
}
function renderSummary(s) {
  text("version", s.version); text("role", s.role); text("incarnation", s.incarnation);
  text("objects", s.objects);
  text("bytes_used", bytes(s.bytes_used)); text("bytes_capacity", bytes(s.bytes_capacity));
  text("hit_rate", percent(s.hit_rate)); text("ops_per_s", rate(s.ops_per_s));
  text("evictions_per_s", rate(s.evictions_per_s)); text("evictions", s.evictions);
  text("lease_expiries", s.lease_expiries);
  text("clients", s.clients); text("segments", s.segments);
  const disk = s.disk || {copies: 0, disk_hits: 0};
  text("disk_copies", disk.copies); text("disk_hits", disk.disk_hits);
}
function renderHistory(h) {
  const p = h.points;
  chart("chart-ops", [{points: p.map(q => [q.unix_ms, q.ops_per_s])}], rate);
  chart("chart-hits", [{points: p.map(q => [q.unix_ms, q.hit_rate])}], percent);
  const names = [...new Set(p.flatMap(q => Object.keys(q.route_bytes_per_s)))].sort();
  chart("chart-routes", names.map(n => ({points: p.map(q => [q.unix_ms,
                                                                q.route_bytes_per_s[n] || 0])})),
        v => bytes(v) + "/s");
  document.getElementById("legend-routes").innerHTML = names.map((n, i) =>
      '<span style="color:' + COLORS[i % COLORS.length] + '">&#9632;</span> <span>' +
      n.replace(/[<&]/g, "") + "</span>").join(" ");
}
function renderSegments(list) {
  const body = document.getElementById("segment-rows");
  body.replaceChildren();
  for (const s of list.segments) {
    const row = body.insertRow();
    row.dataset.segment = s.name;
    cell(row, s.name + (s.draining ? " (draining)" : ""), "name"); cell(row, s.owner, "owner"); cell(row, s.host_id, "host_id");
    cell(row, bytes(s.size), "size", true);
    const used = cell(row, bytes(s.used), "used", true);
    const bar = document.createElement("span");
    bar.className = "bar";
    const fill = document.createElement("i");
    fill.style.width = (s.size ? Math.min(100, 100 * s.used / s.size) : 0) + "%";
    bar.appendChild(fill); used.appendChild(bar);
    cell(row, s.objects, "objects", true); cell(row, bytes(s.page_size), "page_size", true);
    cell(row, routes(s.routes_to_owner), "routes");
  }
}
function renderTenants(list) {
  const body = document.getElementById("tenant-rows");
  body.replaceChildren();
  const rows = list.tenants.map(t => [t.tenant === "" ? "(default)" : t.tenant, t]);
  if (list.other_tenants) rows.push(["(other tenants)", list.other_tenants]);
  for (const [name, t] of rows) {
    const row = body.insertRow();
    row.dataset.tenant = name;
    cell(row, name, "tenant"); cell(row, t.lookups, "lookups", true);
    cell(row, t.gets, "gets", true); cell(row, percent(t.hit_rate), "hit_rate", true);
    cell(row, t.hit_rate_of, "hit_rate_of");
  }
}
function renderClients(list) {
  const body = document.getElementById("client-rows");
  body.replaceChildren();
  for (const c of list.clients) {
    const row = body.insertRow();
    row.dataset.client = c.client_id;
    cell(row, c.client_id, "client_id"); cell(row, c.host_id, "host_id");
    cell(row, c.pid || "-", "pid", true); cell(row, c.alive ? "yes" : "no", "alive");
    cell(row, (c.last_heartbeat_ms_ago / 1000).toFixed(1) + " s ago", "last_heartbeat", true);
    cell(row, c.segments, "segments", true); cell(row, routes(c.routes), "routes");
  }
}
async function refresh() {
  try {
    const [summary, history, segments, clients, tenants] = await Promise.all(
        [get("/api/summary"), get("/api/history"), get("/api/segments"), get("/api/clients"),
         get("/api/tenants")]);
    if (summary) renderSummary(summary);
    if (history) renderHistory(history);
    if (segments) renderSegments(segments);
    if (clients) renderClients(clients);
    if (tenants) renderTenants(tenants);
    text("error", "");
    document.body.dataset.refreshed = String(Date.now());
  } catch (e) {
    text("error", String(e.message || e));
  }
}
document.getElementById("auth").addEventListener("submit", e => {
  e.preventDefault();
  sessionStorage.setItem("larder-admin-token", document.getElementById("token").value);
  document.getElementById("auth").style.display = "none";
  refresh();
});
refresh();
setInterval(refresh, 2000);
</script>
</body>
</html>
)page";

}  // namespace

std::string_view StatusPageHtml() { return kPage; }

}  // namespace larder::master
