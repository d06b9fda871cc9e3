#!/bin/bash
# `pip install .` of the Python package, offline with Debian's build tools, and an import from
# outside the source tree (ctest pip_install_test). The extension comes from BUILD_DIR (setup.py
# builds the target larder_python there, which is up to date in a built tree).
# Usage: pip_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
source_dir=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
work=$(mktemp -d /tmp/larder-pip-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
python=/usr/bin/python3
version=$(head -n1 "$source_dir/VERSION")

echo "== pip install --no-build-isolation $source_dir"
LARDER_BUILD_DIR=$build "$python" -m pip install --no-build-isolation --no-deps --no-index \
  --disable-pip-version-check --target "$work/site" "$source_dir" >"$work/pip.log" 2>&1 ||
  { cat "$work/pip.log"; echo "pip_test: FAILED: pip install" >&2; exit 1; }

# An extension built with the sanitizers needs their runtimes loaded first (ctest names them).
if [ -n "${LARDER_SANITIZER_RUNTIMES:-}" ]; then
  export LD_PRELOAD=$LARDER_SANITIZER_RUNTIMES ASAN_OPTIONS=detect_leaks=0
fi
cd "$work"
PYTHONPATH=$work/site PYTHONDONTWRITEBYTECODE=1 "$python" - "$work/site" "$version" <<'PY'
import os, sys
site, version = sys.argv[1], sys.argv[2]
import larder
assert larder.__file__.startswith(site), f"imported {larder.__file__}, not the installed package"
assert larder.__version__ == version, f"__version__ {larder.__version__!r}, VERSION {version!r}"
assert larder.parse_size("4KiB") == 4096
extension = [f for f in os.listdir(os.path.dirname(larder.__file__)) if f.startswith("_larder")]
print(f"pip_test: OK: larder {larder.__version__} from {os.path.dirname(larder.__file__)}: {extension}")
PY
