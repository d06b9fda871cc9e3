#!/usr/bin/env bash
# Runs a command; when LARDER_PHASE_LOG names a file, appends "<phase>\t<seconds>\t<exit status>"
# to it (`make run` and `make test` time their steps so; .ci/run prints the table).
# usage: scripts/timed.sh PHASE COMMAND [ARG...]
set -uo pipefail
phase=${1:?usage: scripts/timed.sh PHASE COMMAND [ARG...]}
shift
start=$(date +%s.%N)
"$@"
rc=$?
if [ -n "${LARDER_PHASE_LOG:-}" ]; then
  awk -v p="$phase" -v s="$start" -v e="$(date +%s.%N)" -v rc="$rc" \
    'BEGIN { printf "%s\t%.1f\t%d\n", p, e - s, rc }' >>"$LARDER_PHASE_LOG"
fi
exit "$rc"
