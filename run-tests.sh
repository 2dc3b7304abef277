#!/usr/bin/env bash
# Runs every test: unit tests (ctest) and the runtime suite, which loads BPF programs and
# traces real processes (as root).   Usage: sudo ./run-tests.sh
set -euo pipefail
cd "$(dirname "$0")"
SETUP_NO_EXAMPLE=1 ./setup.sh
(cd build && ctest --output-on-failure)
/usr/bin/python3 -m pytest -q tests/runtime
