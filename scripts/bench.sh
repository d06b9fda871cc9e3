#!/usr/bin/env bash
# Runs the transfer, store, master and replay benchmarks and the reference anchors in one session, writing JSON lines to
# bench/results/. usage: scripts/bench.sh [BUILD_DIR]
# The replay reads $LARDER_TRACE, else bench/traces/conversation_trace.jsonl (docs/replay.md); the
# anchors are the reference-peer scripts in $LARDER_ANCHORS_DIR, skipped when it is unset
# (docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=bench/results
mkdir -p "$out"
bench="$build/bin/larder-bench"
export LARDER_LOG_LEVEL=${LARDER_LOG_LEVEL:-warn}
{
  "$bench" transfer --json --transport shm --block-size 4M,64M
  "$bench" transfer --json --transport shm --block-size 64K --batch 32
  "$bench" transfer --json --transport shm --op read --block-size 4K --batch 1 --working-set 4K
  "$bench" transfer --json --transport shm --threads 2 --block-size 4M,64M
  "$bench" transfer --json --transport tcp --block-size 4M,64M
  # The ucx route over UCX's tcp, where the build has it (scripts/bench-ucx.sh compares it with
  # ucx_perftest).
  if "$bench" transfer --transport ucx --duration 0.01 --block-size 4K --op read >/dev/null 2>&1; then
    UCX_TLS=tcp "$bench" transfer --json --transport ucx --block-size 4M,64M
  fi
} | tee "$out/transfer.jsonl"
{
  "$bench" store --json --op put,get --value-size 4K --batch 128
  "$bench" store --json --op get --value-size 4M --batch 8
  "$bench" store --json --op get --value-size 4M --batch 8 --active 1
  "$bench" store --json --op get --value-size 4M --batch 8 --protocol tcp
  "$bench" store --json --op get --value-size 4M --batch 8 --active 1 --protocol tcp
  "$bench" master --json
} | tee "$out/store.jsonl"
"$bench" replay --json --requests 2000 --plot "$out/replay.svg" | tee "$out/replay.jsonl" || echo "bench: replay failed (no trace? docs/replay.md says where to get it)" >&2
anchors=${LARDER_ANCHORS_DIR:-}
if [ -n "$anchors" ] && [ -d "$anchors" ]; then
  { bash "$anchors/memcpy-bandwidth.sh"; bash "$anchors/ucx-bandwidth.sh" 4096 4194304 67108864;
    bash "$anchors/redis-ops.sh" 4096 16; } |
    tee "$out/anchors.jsonl" || echo "bench: anchors failed (see above)" >&2
else
  echo "bench: LARDER_ANCHORS_DIR ('$anchors') is not a folder; skipping reference peers" >&2
fi
