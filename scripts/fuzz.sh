#!/usr/bin/env bash
# Runs every libFuzzer target of a fuzz build (make fuzz) for SECONDS each, one after the other,
# or until it has run RUNS inputs when RUNS is given (whichever comes first); TARGETS, when given,
# names the targets to run instead of all of them.
# Each target starts from a copy of its seed corpus (fuzz/corpus/<target>) plus its past crashes
# (fuzz/regressions/<target>), in <build>/fuzz-corpus/<target>, so the tree is never written. A crash
# leaves its input in <build>/fuzz-crashes/<target>/ and fails the run; copy it into
# fuzz/regressions/<target>/ with the fix, and the test build replays it from then on.
# Prints one JSON line per target: {"target", "seconds", "executions", "exec_per_s", "coverage",
# "features", "corpus_inputs", "crashed"}.
# usage: scripts/fuzz.sh BUILD_DIR [SECONDS [RUNS [TARGET...]]]   (RUNS 0: no limit on runs)
#
#        scripts/fuzz.sh --replay TARGET_BINARY DIR...
# runs the target once over every file in the DIRs (a missing DIR is skipped: a target may have no
# regressions yet), without fuzzing: the replay tests of a fuzz build.
set -euo pipefail
if [ "${1:-}" = --replay ]; then
  target=${2:?usage: scripts/fuzz.sh --replay TARGET_BINARY DIR...}
  shift 2
  inputs=()
  for dir in "$@"; do
    [ -d "$dir" ] || continue
    while IFS= read -r -d '' file; do inputs+=("$file"); done < <(find "$dir" -type f -print0 | sort -z)
  done
  [ ${#inputs[@]} -gt 0 ] || { echo "fuzz: no inputs to replay in $*" >&2; exit 1; }
  echo "fuzz: replaying ${#inputs[@]} inputs through $target"
  exec "$target" -rss_limit_mb=4096 "${inputs[@]}"
fi
cd "$(dirname "$0")/.."
usage="usage: scripts/fuzz.sh BUILD_DIR [SECONDS [RUNS [TARGET...]]]"
build=${1:?$usage}
seconds=${2:-300}
runs=${3:-0}
shift $(( $# < 3 ? $# : 3 ))
case "$seconds$runs" in *[!0-9]*) echo "fuzz: SECONDS and RUNS are whole numbers; $usage" >&2; exit 2;; esac
bin="$build/bin/fuzz"
[ -d "$bin" ] || { echo "fuzz: no fuzz targets in $bin (build with make fuzz)" >&2; exit 2; }
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for target in "$bin"/*; do [ -x "$target" ] && targets+=("$(basename "$target")"); done
fi
limit=()
[ "$runs" -gt 0 ] && limit=(-runs="$runs")
failed=0
for name in "${targets[@]}"; do
  target="$bin/$name"
  [ -x "$target" ] || { echo "fuzz: no target $name in $bin" >&2; exit 2; }
  corpus="$build/fuzz-corpus/$name"
  crashes="$build/fuzz-crashes/$name"
  log="$build/fuzz-logs/$name.log"
  mkdir -p "$corpus" "$crashes" "$(dirname "$log")"
  for seeds in "fuzz/corpus/$name" "fuzz/regressions/$name"; do
    [ -d "$seeds" ] && cp -n "$seeds"/* "$corpus"/ 2>/dev/null || true
  done
  rc=0
  start=$(date +%s)
  LARDER_LOG_LEVEL=off "$target" -max_total_time="$seconds" "${limit[@]}" -print_final_stats=1 \
    -artifact_prefix="$crashes/" -timeout=10 -rss_limit_mb=4096 "$corpus" >"$log" 2>&1 || rc=$?
  took=$(( $(date +%s) - start ))
  [ "$took" -gt 0 ] || took=1
  execs=$(awk '/stat::number_of_executed_units/{print $2}' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | awk '{print $2}')
  ft=$(grep -oE 'ft: [0-9]+' "$log" | tail -1 | awk '{print $2}')
  inputs=$(find "$corpus" -type f | wc -l)
  crashed=false
  if [ "$rc" -ne 0 ]; then crashed=true; failed=1; fi
  echo "{\"target\":\"$name\",\"seconds\":$took,\"executions\":${execs:-0},\"exec_per_s\":$(( ${execs:-0} / took )),\"coverage\":${cov:-0},\"features\":${ft:-0},\"corpus_inputs\":$inputs,\"crashed\":$crashed}"
  if [ "$crashed" = true ]; then
    echo "fuzz: $name failed (exit $rc); its log: $log; inputs: $crashes/" >&2
    tail -40 "$log" >&2
  fi
done
exit "$failed"
