#!/usr/bin/env bash
# Checks the lock annotations (src/common/mutex.h) with clang's -Wthread-safety -Werror over every
# source file a CMake build compiles (its compile_commands.json: same defines and include paths),
# without generating code.
#
#   scripts/thread_safety.sh BUILD_DIR [FILE...]
#
# With FILEs, checks only those (paths absolute or relative to the source tree). JOBS files are
# checked at a time (default: every core). Exits non-zero when any file has a finding.
set -euo pipefail

build_dir=${1:?usage: scripts/thread_safety.sh BUILD_DIR [FILE...]}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
db="$build_dir/compile_commands.json"
if [[ ! -f $db ]]; then
  echo "thread_safety.sh: $db is missing: configure and build $build_dir first" >&2
  exit 2
fi
clangxx=${CLANGXX:-clang++}
if ! command -v "$clangxx" >/dev/null; then
  echo "thread_safety.sh: $clangxx not found (apt-get install clang)" >&2
  exit 2
fi
jobs=${JOBS:-$(nproc)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One command per file, with the build's defines and include paths. Sources generated in the
# build directory (protobuf) are left out: they hold no lock of ours.
/usr/bin/python3 - "$db" "$root" "$clangxx" "$work" "$@" <<'EOF'
import json, os, shlex, sys

db, root, clangxx, work, wanted = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
build = os.path.realpath(os.path.dirname(db))
wanted = {os.path.realpath(os.path.join(root, w)) for w in wanted}
seen = []
for entry in json.load(open(db)):
    path = os.path.realpath(os.path.join(entry["directory"], entry["file"]))
    if not path.startswith(root + "/") or path.startswith(build + "/"):
        continue
    if (wanted and path not in wanted) or path in seen:
        continue
    seen.append(path)
    args = entry.get("arguments") or shlex.split(entry["command"])
    keep = []
    it = iter(args[1:])
    for arg in it:
        if arg in ("-o", "-c"):
            next(it, None)
        elif arg in ("-isystem", "-I", "-D", "-include"):
            keep += [arg, next(it)]
        elif arg.startswith(("-I", "-D", "-std=", "-isystem")):
            keep.append(arg)
    cmd = [clangxx, "-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety"] + keep + [path]
    with open(os.path.join(work, "%d.cmd" % len(seen)), "w") as out:
        out.write(" ".join(shlex.quote(a) for a in cmd) + "\n")
EOF

count=$(find "$work" -name '*.cmd' | wc -l)
if [[ $count -eq 0 ]]; then
  echo "thread_safety.sh: no file to check" >&2
  exit 2
fi
echo "thread-safety analysis ($clangxx -Wthread-safety -Werror) over $count files, $jobs at a time"
find "$work" -name '*.cmd' -print0 |
  xargs -0 -P "$jobs" -n1 sh -c 'sh "$1" >"${1%.cmd}.log" 2>&1 || touch "${1%.cmd}.failed"' sh
failed=$(find "$work" -name '*.failed' | wc -l)
if [[ $failed -gt 0 ]]; then
  for f in "$work"/*.failed; do cat "${f%.failed}.log"; done
  echo "thread_safety.sh: $failed of $count files have findings (above)" >&2
  exit 1
fi
echo "thread-safety analysis: $count files, no finding"
