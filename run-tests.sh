#!/usr/bin/env bash
# Runs every test: unit tests (ctest), the runtime suite, which loads BPF programs and traces
# real processes (as root), and both again under sanitizers with the fuzz targets
# (tests/sanitizers.sh).   Usage: sudo ./run-tests.sh
set -euo pipefail
cd "$(dirname "$0")"
# The tests also need independent readers of gpuscope's outputs: a real browser for the HTML
# flame graph, Go's pprof for the pprof profile.
SETUP_NO_EXAMPLE=1 SETUP_TEST_PACKAGES="chromium golang-go prometheus protobuf-compiler" ./setup.sh
(cd build && ctest --output-on-failure)
/usr/bin/python3 -m pytest -q tests/runtime
# The same code with AddressSanitizer and UndefinedBehaviorSanitizer, and a short run of each fuzz
# target (build-sanitize/).
tests/sanitizers.sh
