#!/usr/bin/env bash
# Installs what gpuscope needs (Debian 12, as root), builds it, records the bundled CUDA
# example and prints its report.   Usage: sudo ./setup.sh   (SETUP_NO_EXAMPLE=1 to only build)
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(build-essential cmake pkg-config clang libbpf-dev bpftool libelf-dev libdw-dev zlib1g-dev
          libzstd-dev libbz2-dev liblzma-dev libsqlite3-dev sqlite3 libfmt-dev libcli11-dev nlohmann-json3-dev libgtest-dev
          libcpp-httplib-dev libmicrohttpd-dev libyaml-cpp-dev libibverbs-dev
          python3 python3-pytest procps util-linux)

# install_missing [apt-get install options...] -- PACKAGE...
install_missing() {
  local opts=() missing=()
  while [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${opts[@]}" "${missing[@]}" >/dev/null
  fi
}
install_missing -- "${PACKAGES[@]}"
# SETUP_TEST_PACKAGES (run-tests.sh): independent readers of gpuscope's outputs for the tests.
# shellcheck disable=SC2086
[ -z "${SETUP_TEST_PACKAGES:-}" ] || install_missing --no-install-recommends -- ${SETUP_TEST_PACKAGES}

if [ ! -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then
  echo "setup: no CUDA toolkit at ${CUDA_HOME:-/usr/local/cuda}: gpuscope builds, the CUDA example and test targets do not" >&2
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"

if [ -z "${SETUP_NO_EXAMPLE:-}" ] && [ -x build/targets/cuda_ops ]; then
  echo
  echo "setup: recording the bundled example: build/gpuscope record --cpu-profile 99 -o example.gpuscope -- build/targets/cuda_ops --iterations 3"
  build/gpuscope record --cpu-profile 99 -o example.gpuscope -- build/targets/cuda_ops --iterations 3 || true
  echo
  build/gpuscope report example.gpuscope
  build/gpuscope flamegraph example.gpuscope --metric launches -o example-launches.html || true
  echo "setup: open example-launches.html in a browser for the launches' flame graph"
fi
