#!/usr/bin/env bash
# Runs every test: unit tests (ctest) and the runtime suite, which loads BPF programs and
# traces real processes (as root).   Usage: sudo ./run-tests.sh
set -euo pipefail
cd "$(dirname "$0")"
SETUP_NO_EXAMPLE=1 ./setup.sh
# Independent readers of gpuscope's outputs, needed by the tests only: a real browser for the
# HTML flame graph, Go's pprof for the pprof profile.
TEST_PACKAGES=(chromium golang-go)
missing=()
for p in "${TEST_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "run-tests: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
(cd build && ctest --output-on-failure)
/usr/bin/python3 -m pytest -q tests/runtime
