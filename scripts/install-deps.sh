#!/usr/bin/env bash
# Installs the Debian packages Larder needs to build and test, when they are missing.
# Uses sudo when not root. Safe to run repeatedly: it does nothing when everything is present.
set -euo pipefail

packages=(
  cmake
  g++
  make
  libspdlog-dev
  libfmt-dev
  libcli11-dev
  nlohmann-json3-dev
  libssl-dev
  libgtest-dev
  libgmock-dev
  clang-format
  pkg-config
  libgrpc++-dev
  libabsl-dev
  libprotobuf-dev
  protobuf-compiler
  protobuf-compiler-grpc
  libcpp-httplib-dev
  libre2-dev
  libxxhash-dev
  liburing-dev
  zlib1g-dev
  libbrotli-dev
  gnuplot-nox
  pybind11-dev
  python3-dev
  python3-pytest
  python3-numpy
  python3-torch
  python3-pip
  python3-setuptools
  python3-wheel
  python3-yaml
  dpkg-dev
  etcd-server
  etcd-client
  libucx-dev
  ucx-utils
  clang
  libclang-rt-14-dev
  gdb
  ccache
  chromium
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
