#!/bin/bash
# Larder as installed, used from outside its source tree (ctest install_test):
#  1. `cmake --install` of the build tree into a scratch root (DESTDIR): headers, the versioned
#     libraries, the CMake package, larder.pc, the binaries, the systemd units and their settings;
#  2. a small program (consumer/) built with find_package(Larder) and, again, with pkg-config,
#     run against the installed larder-master: a put and a get through the installed library;
#  3. `cpack -G DEB`: the library, tools and Python packages, with their files and dependencies.
# Usage: install_test.sh BUILD_DIR CONSUMER_SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
consumer=$(cd "$2" && pwd)
work=$(mktemp -d /tmp/larder-install-test.XXXXXX)
master=
cleanup() {
  if [ -n "$master" ]; then kill "$master" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "install_test: FAILED: $*" >&2
  exit 1
}
cache() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }

version=$(head -n1 "$(cache CMAKE_HOME_DIRECTORY)/VERSION")
prefix=$(cache CMAKE_INSTALL_PREFIX)
libdir=$(cache CMAKE_INSTALL_LIBDIR)
root=$work/root
echo "== cmake --install $build (prefix $prefix, DESTDIR $root)"
DESTDIR=$root cmake --install "$build" >"$work/install.log"
usr=$root$prefix

for file in include/larder/store_client.h include/larder/transfer_engine.h \
  include/larder/status.h include/larder/version.h "$libdir/liblarder.so.$version" \
  "$libdir/cmake/Larder/LarderConfig.cmake" \
  "$libdir/cmake/Larder/LarderConfigVersion.cmake" "$libdir/pkgconfig/larder.pc" \
  bin/larder-master bin/larder-client bin/larder-ctl bin/larder-bench \
  lib/systemd/system/larder-master.service lib/systemd/system/larder-client.service; do
  [ -e "$usr/$file" ] || fail "$prefix/$file was not installed"
done
soname=$(readelf -d "$usr/$libdir/liblarder.so.$version" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "liblarder.so.${version%.*}" ] || fail "liblarder's soname is '$soname'"
[ -L "$usr/$libdir/liblarder.so" ] || fail "no liblarder.so development link"

# liblarder exports the public API and nothing else: every larder symbol it defines is declared
# in include/larder (namespace larder, outside the internal namespaces), and the API is there.
exported=$(nm -D --defined-only -C "$usr/$libdir/liblarder.so.$version" | cut -d' ' -f3-)
internal=$(grep -E 'larder::(transfer|master|client|standalone|etcd|proto|wire|bench|testutil)::' \
  <<<"$exported" || true)
[ -z "$internal" ] || fail "liblarder exports internal symbols, e.g.: $(head -n3 <<<"$internal")"
for symbol in 'larder::StoreClient::Create(' 'larder::TransferEngine::Create(' 'larder::Version()' \
  'larder::Status::ToString' 'larder::AttachStoreClient('; do
  grep -qF -- "$symbol" <<<"$exported" || fail "liblarder does not export $symbol"
done
echo "liblarder exports $(grep -c 'larder::' <<<"$exported") larder symbols, none internal"
grep -q "^ExecStart=$prefix/bin/larder-master \$LARDER_MASTER_OPTIONS$" \
  "$usr/lib/systemd/system/larder-master.service" || fail "larder-master.service: ExecStart"
defaults=$(grep '^EnvironmentFile=-' "$usr/lib/systemd/system/larder-master.service" | cut -d- -f2-)
[ -f "$root$defaults" ] || fail "the settings file $defaults of larder-master.service is missing"
"$usr/bin/larder-master" --version | grep -qx "larder-master $version" || fail "--version"

# The consumer is built by the compiler that built the libraries, and links the sanitizer
# runtime when they were built with it.
cxx=$(cache CMAKE_CXX_COMPILER)
flags=""
if [ "$(cache LARDER_SANITIZE)" = "ON" ]; then
  flags="-fsanitize=address,undefined"
  # clang's shared ASan runtime, which the libraries were linked with (CMakeLists.txt); ctest
  # names the runtimes (larder_sanitizer_runtimes).
  case "${LARDER_SANITIZER_RUNTIMES:-}" in
    *libclang_rt.asan*) flags="$flags -shared-libasan -Wl,-rpath,$(dirname "$LARDER_SANITIZER_RUNTIMES")" ;;
  esac
fi
export ASAN_OPTIONS=detect_leaks=0

echo "== find_package(Larder) from $consumer"
cmake -S "$consumer" -B "$work/consumer-cmake" -DCMAKE_PREFIX_PATH="$usr" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" >"$work/consumer-cmake.log" ||
  { cat "$work/consumer-cmake.log"; fail "configuring the consumer"; }
cmake --build "$work/consumer-cmake" >"$work/consumer-build.log" 2>&1 ||
  { cat "$work/consumer-build.log"; fail "building the consumer"; }

echo "== pkg-config larder"
export PKG_CONFIG_PATH=$usr/$libdir/pkgconfig
[ "$(pkg-config --modversion larder)" = "$version" ] || fail "pkg-config --modversion"
# shellcheck disable=SC2046
"$cxx" $flags "$consumer/main.cc" -o "$work/consumer-pc" $(pkg-config --cflags --libs larder) \
  -Wl,-rpath,"$usr/$libdir" || fail "building the consumer with pkg-config"

echo "== the installed larder-master and the consumers"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$usr/bin/larder-master" --host 127.0.0.1 --port "$port" --http-port -1 >"$work/master.log" 2>&1 &
master=$!
for binary in "$work/consumer-cmake/consumer" "$work/consumer-pc"; do
  out=$(LARDER_MASTER_CONNECT_TIMEOUT=60s "$binary" "127.0.0.1:$port") ||
    { cat "$work/master.log"; fail "$binary exited with an error"; }
  [ "$out" = "ok $version" ] || fail "$binary said '$out'"
  echo "$binary: $out"
done
kill "$master"
wait "$master" 2>/dev/null || true
master=

echo "== cpack -G DEB (uncompressed: the contents are what is checked)"
(cd "$build" && cpack -G DEB -D CPACK_PACKAGE_DIRECTORY="$work/packages" \
  -D CPACK_DEBIAN_COMPRESSION_TYPE=none >"$work/cpack.log" 2>&1) ||
  { cat "$work/cpack.log"; fail "cpack"; }
arch=$(dpkg --print-architecture)
lib_deb=$work/packages/liblarder_${version}_$arch.deb
tools_deb=$work/packages/larder-tools_${version}_$arch.deb
for deb in "$lib_deb" "$tools_deb"; do [ -f "$deb" ] || fail "no $(basename "$deb")"; done
# (Each listing is read whole before it is searched: grep -q would cut dpkg-deb's pipe.)
has() { grep -qF -- "$2" <<<"$1"; }
has "$(dpkg-deb --contents "$lib_deb")" ".$prefix/$libdir/liblarder.so.$version" ||
  fail "liblarder.deb lacks liblarder.so"
has "$(dpkg-deb --contents "$lib_deb")" ".$prefix/include/larder/store_client.h" ||
  fail "liblarder.deb lacks the headers"
has "$(dpkg-deb --contents "$tools_deb")" "/lib/systemd/system/larder-master.service" ||
  fail "larder-tools.deb lacks the larder-master unit"
has "$(dpkg-deb --contents "$tools_deb")" "./etc/default/larder-client" ||
  fail "larder-tools.deb lacks /etc/default/larder-client"
has "$(dpkg-deb --contents "$tools_deb")" "$prefix/share/larder/monitoring/larder-alerts.yml" ||
  fail "larder-tools.deb lacks the Prometheus alert rules"
has "$(dpkg-deb --field "$tools_deb" Depends)" "libgrpc++" ||
  fail "larder-tools.deb does not depend on Debian's gRPC"
has "$(dpkg-deb --field "$lib_deb" Depends)" "libgrpc++" ||
  fail "liblarder.deb does not depend on Debian's gRPC"
has "$(dpkg-deb --info "$tools_deb" conffiles)" "/etc/default/larder-master" ||
  fail "larder-tools.deb: /etc/default/larder-master is not a conffile"
if [ "$(cache LARDER_BUILD_PYTHON)" != "OFF" ]; then
  py_deb=$work/packages/python3-larder_${version}_$arch.deb
  has "$(dpkg-deb --contents "$py_deb")" "/lib/python3/dist-packages/larder/__init__.py" ||
    fail "python3-larder.deb lacks the package"
fi
for deb in "$work"/packages/*.deb; do
  echo "$(basename "$deb"): $(dpkg-deb --field "$deb" Depends | cut -c1-160)"
done
echo "install_test: OK"
