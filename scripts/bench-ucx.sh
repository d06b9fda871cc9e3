#!/usr/bin/env bash
# The ucx route beside the tcp route and UCX's own ucx_perftest, in one session: reads of 4 MiB and
# 64 MiB, each measured ROUNDS times (default 3), interleaved, with UCX on its tcp transport
# (UCX_TLS=tcp, as on machines without RDMA). Prints every figure and the medians with the ratio
# ucx / ucx_perftest. usage: scripts/bench-ucx.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${ROUNDS:-3}
bench="$build/bin/larder-bench"
anchor=${LARDER_ANCHORS_DIR:-}/ucx-bandwidth.sh  # the reference-peer scripts (docs/benchmarks.md)
export LARDER_LOG_LEVEL=${LARDER_LOG_LEVEL:-warn}
[ -x "$bench" ] || { echo "bench-ucx: $bench not built" >&2; exit 2; }
[ -f "$anchor" ] || { echo "bench-ucx: $anchor not found (set LARDER_ANCHORS_DIR)" >&2; exit 2; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for _ in $(seq "$rounds"); do
  UCX_TLS=tcp "$bench" transfer --json --transport ucx --op read --block-size 4M,64M >>"$out"
  "$bench" transfer --json --transport tcp --op read --block-size 4M,64M >>"$out"
  bash "$anchor" 4194304 67108864 | grep '"tls":"tcp"' >>"$out"
done
cat "$out"
python3 - "$out" <<'PY'
import collections, json, statistics, sys
figures = collections.defaultdict(list)
for line in open(sys.argv[1]):
    row = json.loads(line)
    if "gbps" not in row:
        continue
    who = "ucx_perftest" if row.get("peer") == "ucx" else row["transport"]
    figures[(row["block_size"], who)].append(row["gbps"])
print("block      ucx GB/s  tcp GB/s  ucx_perftest GB/s  ucx/ucx_perftest")
for block in sorted({b for b, _ in figures}):
    m = {who: statistics.median(figures[(block, who)]) for who in ("ucx", "tcp", "ucx_perftest")
         if figures[(block, who)]}
    ratio = m["ucx"] / m["ucx_perftest"] if "ucx" in m and "ucx_perftest" in m else float("nan")
    print(f"{block >> 20:>3} MiB  {m.get('ucx', float('nan')):9.3f} {m.get('tcp', float('nan')):9.3f}"
          f" {m.get('ucx_perftest', float('nan')):18.3f} {ratio:17.2f}")
PY
