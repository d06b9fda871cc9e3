#!/usr/bin/env bash
# The device checks that need a real GPU, in one run of at most 8 minutes on a machine with a CUDA
# toolkit and one GPU: builds with -DLARDER_WITH_CUDA=ON (only the targets these checks need),
# runs the CUDA backend's conformance suite (the DeviceBackend contract, the device route and its
# pinned-host staging over CUDA, with the owner in another process) and the three device benches
# with --json (the transfer bench's staging through tcp is the device transport's path across
# hosts):
#   larder-bench transfer --memory device     (tcp through pinned staging, beside host memory)
#   larder-bench store --protocol device       (the store on device memory)
#   larder-bench deployment --memory device    (prefills' and decode's KV in device memory)
# Every step's output goes to OUT (default: gpu-check-out/), the figures to OUT/figures.jsonl;
# a summary is printed at the end. Exit status: 0 when every step passed, 1 otherwise, 2 when
# there is no toolkit or no GPU (said why).
# usage: scripts/gpu-check.sh [BUILD_DIR] (default build-cuda); OUT=dir, JOBS=n
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-cuda}
out=${OUT:-gpu-check-out}
jobs=${JOBS:-$(nproc)}
mkdir -p "$out"
: >"$out/figures.jsonl"
export LARDER_LOG_LEVEL=${LARDER_LOG_LEVEL:-warn}
export LARDER_DEVICE_BACKEND=cuda
started=$(date +%s)

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >"$out/gpus.txt" 2>&1; then
  echo "gpu-check: no GPU here (nvidia-smi -L failed); nothing run" >&2
  exit 2
fi
cat "$out/gpus.txt"

failed=()
step() {  # step NAME TIMEOUT_S COMMAND...: runs it, logs to OUT/NAME.log, records a failure
  local name=$1 limit=$2
  shift 2
  local t0=$(date +%s)
  if timeout "$limit" "$@" >"$out/$name.log" 2>&1; then
    echo "gpu-check: $name passed ($(( $(date +%s) - t0 )) s)"
  else
    echo "gpu-check: $name FAILED ($(( $(date +%s) - t0 )) s; see $out/$name.log)"
    tail -20 "$out/$name.log"
    failed+=("$name")
  fi
}

step configure 120 cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DLARDER_WITH_CUDA=ON \
  -DLARDER_BUILD_TESTS=ON
if [[ " ${failed[*]} " == *" configure "* ]]; then
  echo "gpu-check: cmake found no CUDA toolkit (see $out/configure.log)" >&2
  exit 2
fi
step build 300 cmake --build "$build" -j"$jobs" --target cuda_device_test larder-e2e-peer \
  larder-bench
bench="$build/bin/larder-bench"

# The backend contract and the device route over CUDA (another process exports).
step cuda_device_test 120 env LARDER_BIN_DIR="$PWD/$build/bin" "$build/bin/cuda_device_test"

# The benches, each with --json, their rows appended to figures.jsonl.
bench_step() {  # bench_step NAME TIMEOUT_S ARGS...
  local name=$1 limit=$2
  shift 2
  step "$name" "$limit" "$bench" "$@" --json
  grep '^{' "$out/$name.log" >>"$out/figures.jsonl" || true
}
bench_step transfer_device 120 transfer --memory device --block-size 4M,64M --segment-size 1G \
  --duration 2
bench_step store_device 90 store --protocol device --op put,get --value-size 4M --duration 3
bench_step deployment_device 120 deployment --memory device --duration 10

echo "gpu-check: $(( $(date +%s) - started )) s in all; figures in $out/figures.jsonl"
python3 - "$out/figures.jsonl" <<'PY' || true
import json, sys
for line in open(sys.argv[1]):
    row = json.loads(line)
    keys = [k for k in ("memory", "route", "op", "block_size", "value_size", "gbps", "host_gbps",
                        "ratio_vs_host", "kv_per_s", "pd_p50_ms", "pd_p99_ms", "pd_failures",
                        "store_failures") if k in row]
    print("  " + ", ".join(f"{k}={row[k]}" for k in keys))
PY
if [ ${#failed[@]} -ne 0 ]; then
  echo "gpu-check: failed: ${failed[*]}"
  exit 1
fi
echo "gpu-check: every step passed"
