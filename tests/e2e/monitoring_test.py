#!/usr/bin/env python3
# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""The shipped Prometheus rules and Grafana dashboard against a real larder-master's /metrics.

Usage: monitoring_test.py BIN_DIR MONITORING_DIR

Starts larder-master, a larder-client daemon (restarted once) and `larder-bench store` forced
onto tcp on this host, scrapes /metrics, and checks that:
- the rule file parses and is well formed, and names the alerts an operator needs;
- every metric that a rule or a dashboard panel names is in the exposition, and every label it
  matches on exists there (with that value, for an exact match);
- a restarted client leaves the set of series unchanged (no label holds a client id or pid);
- the hairpin that the forced tcp run creates shows in the series the LarderSameHostTcp alert reads;
- the checks catch what they are for: a rule naming a metric that does not exist, a label value
  that no series has, and a rule file that does not parse, each make them fail.
Exit status 0 when all hold; 1 with the reasons otherwise.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

# Names Prometheus itself gives every target: not in any exposition.
SCRAPE_METRICS = {"up"}
TARGET_LABELS = {"instance", "job"}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = {"bool", "and", "or", "unless", "offset", "inf", "nan", "atan2"}
# Aggregations may take their grouping before their operand: sum by (le) (...).
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
                "bottomk", "topk", "quantile", "limitk", "limit_ratio"}
RULE_KEYS = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
TOKEN = re.compile(
    r'\s+|"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|\{[^}]*\}|\[[^\]]*\]'
    r"|[A-Za-z_:][A-Za-z0-9_:]*|[0-9][0-9.eE+-]*|.",
    re.S,
)
MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\s+\S+$")


def parse_exposition(text):
    """{sample name: [ {label: value} ]} of a Prometheus text exposition."""
    series = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if not m:
            raise ValueError("not a sample line: " + line)
        labels = dict((k, v) for k, _, v in MATCHER.findall(m.group(2) or ""))
        series.setdefault(m.group(1), []).append(labels)
    return series


def series_keys(text):
    """Each sample line of an exposition without its value."""
    return {line.rsplit(" ", 1)[0] for line in text.splitlines() if line and line[0] != "#"}


def selectors(expr):
    """The metric selectors of a PromQL expression: [(name, [(label, op, value)])]."""
    tokens = [t for t in TOKEN.findall(expr) if not t.isspace()]
    out = []
    i = 0
    while i < len(tokens):
        t = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
        if re.match(r"^[A-Za-z_:]", t):
            if t in GROUPING and nxt == "(":
                depth, i = 0, i + 1  # skip the label list
                while i < len(tokens):
                    depth += {"(": 1, ")": -1}.get(tokens[i], 0)
                    if depth == 0:
                        break
                    i += 1
            elif nxt == "(" or t in KEYWORDS or t in GROUPING or t in AGGREGATIONS:
                pass  # a function or a keyword
            else:
                matchers = MATCHER.findall(nxt) if nxt.startswith("{") else []
                out.append((t, matchers))
        i += 1
    return out


def check_expr(where, expr, exposition):
    errors = []
    if expr.count("(") != expr.count(")"):
        errors.append(f"{where}: unbalanced parentheses in {expr!r}")
    refs = selectors(expr)
    if not refs:
        errors.append(f"{where}: no metric in {expr!r}")
    known = set(TARGET_LABELS)
    for name, _ in refs:
        known.update(label for series in exposition.get(name, []) for label in series)
    for clause in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        for label in filter(None, (part.strip() for part in clause.split(","))):
            if label not in known:
                errors.append(f"{where}: no metric of {expr!r} has the label {label!r}")
    for name, matchers in refs:
        if name in SCRAPE_METRICS:
            continue
        if name not in exposition:
            errors.append(f"{where}: metric {name} is not in larder-master's /metrics")
            continue
        for label, op, value in matchers:
            if label in TARGET_LABELS:
                continue
            values = {s[label] for s in exposition[name] if label in s}
            if not values:
                errors.append(f"{where}: {name} has no label {label!r}")
            elif op == "=" and "$" not in value and value not in values:
                errors.append(
                    f"{where}: no series {name}{{{label}=\"{value}\"}} (it has {sorted(values)})")
    return errors


def check_rules(text, exposition):
    """Errors of a Prometheus rule file (its text) against an exposition."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        return [f"rules: not YAML: {e}"]
    if not isinstance(doc, dict) or not isinstance(doc.get("groups"), list) or not doc["groups"]:
        return ["rules: no 'groups' list"]
    errors, alerts, exprs = [], set(), []
    for g, group in enumerate(doc["groups"]):
        if not isinstance(group, dict) or not isinstance(group.get("name"), str):
            errors.append(f"rules: group {g} has no name")
            continue
        rules = group.get("rules")
        if not isinstance(rules, list) or not rules:
            errors.append(f"rules: group {group['name']} has no rules")
            continue
        for r, rule in enumerate(rules):
            where = f"rules: {group['name']}[{r}]"
            if not isinstance(rule, dict):
                errors.append(f"{where}: not a mapping")
                continue
            where += f" {rule.get('alert') or rule.get('record')}"
            if set(rule) - RULE_KEYS:
                errors.append(f"{where}: unknown keys {sorted(set(rule) - RULE_KEYS)}")
            if ("alert" in rule) == ("record" in rule):
                errors.append(f"{where}: needs exactly one of alert and record")
            if "alert" in rule:
                if rule["alert"] in alerts:
                    errors.append(f"{where}: alert defined twice")
                alerts.add(rule["alert"])
            for key in ("for", "keep_firing_for"):
                if key in rule and not DURATION.match(str(rule[key])):
                    errors.append(f"{where}: {key} {rule[key]!r} is not a duration")
            for key in ("labels", "annotations"):
                value = rule.get(key, {})
                if not isinstance(value, dict) or not all(
                        isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
                    errors.append(f"{where}: {key} must map strings to strings")
                    continue
                for k, v in value.items():
                    if v.count("{{") != v.count("}}"):
                        errors.append(f"{where}: unbalanced template in {key}.{k}")
            if not isinstance(rule.get("expr"), str) or not rule["expr"].strip():
                errors.append(f"{where}: no expr")
                continue
            exprs.append(rule["expr"])
            errors += check_expr(where, rule["expr"], exposition)
    # What an operator of the store needs to be told, whatever else the file holds.
    needed = {
        "same-host tcp bytes": ("larder_transfer_bytes_total", ("route", "tcp"),
                                ("locality", "same_host")),
        "refused puts": ("larder_put_refusals_total",),
        "client expiries": ("larder_client_expiries_total",),
        "lease expiries": ("larder_lease_expiries_total",),
    }
    for what, (name, *labels) in needed.items():
        if not any(n == name and all((l, "=", v) in m for l, v in labels)
                   for e in exprs for n, m in selectors(e)):
            errors.append(f"rules: no alert on {what} ({name})")
    return errors


def dashboard_exprs(dashboard):
    found = []

    def walk(panels):
        for panel in panels:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    found.append((f"dashboard: panel {panel.get('title')!r}", target["expr"]))
            walk(panel.get("panels", []))

    walk(dashboard.get("panels", []))
    for var in dashboard.get("templating", {}).get("list", []):
        query = var.get("query")
        query = query.get("query") if isinstance(query, dict) else query
        m = re.match(r"^\s*label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,", query or "")
        if var.get("type") == "query":
            found.append((f"dashboard: variable {var.get('name')}", m.group(1) if m else "?"))
    return found


def check_dashboard(text, exposition):
    try:
        dashboard = json.loads(text)
    except json.JSONDecodeError as e:
        return [f"dashboard: not JSON: {e}"]
    exprs = dashboard_exprs(dashboard)
    if not exprs:
        return ["dashboard: no queries"]
    errors = []
    for where, expr in exprs:
        errors += check_expr(where, expr, exposition)
    return errors


class Cluster:
    def __init__(self, bin_dir, workdir):
        self.bin_dir, self.workdir, self.children = bin_dir, workdir, []

    def start(self, name, args):
        log = open(os.path.join(self.workdir, name + ".log"), "w")
        child = subprocess.Popen([os.path.join(self.bin_dir, args[0])] + args[1:],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                 text=True)
        self.children.append(child)
        line = child.stdout.readline()
        if not line.startswith("READY "):
            raise RuntimeError(f"{args[0]} did not start (see {log.name}): {line!r}")
        return child, line.split()[1:]

    def stop(self, child):
        child.terminate()
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()

    def close(self):
        for child in self.children:
            if child.poll() is None:
                self.stop(child)


def scrape(http_port):
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10) as reply:
        return reply.read().decode()


def wait_for(what, predicate, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise RuntimeError("timed out waiting for " + what)


def heartbeat_since(http_port, seconds):
    """True when every client listed sent a heartbeat within the last `seconds`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/api/clients", timeout=10) as reply:
        clients = json.loads(reply.read())["clients"]
    return bool(clients) and all(c["last_heartbeat_ms_ago"] < 1000 * seconds for c in clients)


def value_of(text, line_prefix):
    for line in text.splitlines():
        if line.startswith(line_prefix + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def main():
    bin_dir, monitoring_dir = sys.argv[1], sys.argv[2]
    rules_text = open(os.path.join(monitoring_dir, "larder-alerts.yml")).read()
    dashboard_text = open(os.path.join(monitoring_dir, "larder-dashboard.json")).read()
    workdir = tempfile.mkdtemp(prefix="larder-monitoring-test-")
    cluster = Cluster(bin_dir, workdir)
    failures = []
    try:
        _, (master, http_port) = cluster.start(
            "master", ["larder-master", "--host", "127.0.0.1", "--port", "0", "--http-port", "0"])
        segments = lambda n: value_of(scrape(http_port), "larder_segments") == n  # noqa: E731
        client_args = ["larder-client", "--master", master, "--socket",
                       f"@larder-monitoring-test-{os.getpid()}", "--segment-size", "64M",
                       "--segment-name", "monitoring-test"]
        # The series with a client, then with that client restarted (a new pid and engine id).
        seen = []
        for run in range(2):
            client, _ = cluster.start(f"client-{run}", client_args)
            wait_for("the client's segment", lambda: segments(1))
            mounted = time.monotonic()
            # A heartbeat after the mount (it carries the traffic report that per-client series
            # would come from): the master saw the client more recently than the mount.
            wait_for("a heartbeat of the client",
                     lambda: heartbeat_since(http_port, time.monotonic() - mounted))
            seen.append(series_keys(scrape(http_port)))
            cluster.stop(client)
            wait_for("the client to leave", lambda: segments(0))
        if seen[0] != seen[1]:
            failures.append("a restarted client changed the series of /metrics: new "
                            f"{sorted(seen[1] - seen[0])}, gone {sorted(seen[0] - seen[1])}")
        for key in seen[0]:
            if re.search(r'\b(client|peer)="', key):
                failures.append(f"a series names a client engine by default: {key}")

        # Two store clients of this host forced onto tcp: the hairpin the alert exists for.
        bench = subprocess.run(
            [os.path.join(bin_dir, "larder-bench"), "store", "--master", master, "--clients", "2",
             "--op", "get", "--protocol", "tcp", "--duration", "2", "--segment-size", "64M",
             "--value-size", "64K", "--working-set", "16M"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            timeout=240)
        if bench.returncode != 0:
            failures.append(f"larder-bench store failed ({bench.returncode}):\n{bench.stdout}")
        hairpin = 'larder_transfer_bytes_total{route="tcp",locality="same_host"}'
        try:
            wait_for("same-host tcp bytes", lambda: (value_of(scrape(http_port), hairpin) or 0) > 0,
                     timeout=10)
        except RuntimeError:
            failures.append(f"{hairpin} stayed 0 after tcp transfers between two local clients")

        text = scrape(http_port)
        with open(os.path.join(workdir, "metrics.txt"), "w") as f:
            f.write(text)
        exposition = parse_exposition(text)
        failures += check_rules(rules_text, exposition)
        failures += check_dashboard(dashboard_text, exposition)

        # The checks fail where they should: (what, the errors of a spoilt copy, what they say).
        controls = [
            ("a rule naming a metric that does not exist",
             check_rules(rules_text.replace("larder_put_refusals_total", "larder_put_refused_total"),
                         exposition), "metric larder_put_refused_total is not in"),
            ("a panel naming a metric that does not exist",
             check_dashboard(dashboard_text.replace("larder_leases_active", "larder_lease_active"),
                             exposition), "metric larder_lease_active is not in"),
            ("a panel matching a label value no series has",
             check_dashboard(dashboard_text.replace('locality=\\"same_host\\"',
                                                    'locality=\\"same_hots\\"'), exposition),
             'no series larder_transfer_bytes_total{locality="same_hots"}'),
            ("a rule grouping by a label no series has",
             check_rules(rules_text.replace("by (instance, reason)", "by (instance, reasons)"),
                         exposition), "has the label 'reasons'"),
            ("a rule file that does not parse", check_rules(rules_text + "\n  - ]: [\n", exposition),
             "not YAML"),
            ("a rule file without the hairpin alert",
             check_rules(rules_text.replace('route="tcp"', 'route="shm"'), exposition),
             "no alert on same-host tcp bytes"),
        ]
        for what, errors, needle in controls:
            caught = [e for e in errors if needle in e]
            if not caught:
                failures.append(f"the checks accept {what}: {errors}")
            else:
                print(f"negative control, {what}: {caught[0].splitlines()[0]}")

        if shutil.which("promtool"):
            checked = subprocess.run(["promtool", "check", "rules",
                                      os.path.join(monitoring_dir, "larder-alerts.yml")],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if checked.returncode != 0:
                failures.append("promtool check rules:\n" + checked.stdout)
    finally:
        cluster.close()

    if failures:
        print(f"FAILED (logs and the last scrape in {workdir}):")
        for failure in failures:
            print("  " + failure)
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"ok: {len(selectors_in_files(rules_text, dashboard_text))} metric references checked")
    return 0


def selectors_in_files(rules_text, dashboard_text):
    doc = yaml.safe_load(rules_text)
    exprs = [r["expr"] for g in doc["groups"] for r in g["rules"]]
    exprs += [e for _, e in dashboard_exprs(json.loads(dashboard_text))]
    return [s for e in exprs for s in selectors(e)]


if __name__ == "__main__":
    sys.exit(main())
