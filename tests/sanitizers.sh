#!/usr/bin/env bash
# gpuscope built with AddressSanitizer and UndefinedBehaviorSanitizer (clang; -O0 to keep the
# build short on CI's two cores): the unit tests, the runtime tests that feed it the most varied
# input, and every fuzz target for a few seconds from its seeds. Any sanitizer report fails the
# run, also one from a gpuscope that a test ran and did not look at (each report is written to a
# file under $BUILD/sanitizer-logs, which must stay empty).
#
#   tests/sanitizers.sh               (run-tests.sh runs it last, after the ordinary build's tests)
#   FUZZ_SECONDS=60 tests/sanitizers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-sanitize}
FUZZ_SECONDS=${FUZZ_SECONDS:-5}
FUZZ_TARGETS="fuzz_unwind_table fuzz_debug_info fuzz_python_binary fuzz_record_reader fuzz_decode_call
              fuzz_python_records fuzz_stack_copy fuzz_agent_config fuzz_agent_http"

if [[ ! -f $BUILD/CMakeCache.txt ]]; then
  CC=clang CXX=clang++ cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=None -DCMAKE_C_FLAGS="-O0 -g" -DCMAKE_CXX_FLAGS="-O0 -g" \
    -DGPUSCOPE_SANITIZE=ON -DGPUSCOPE_FUZZ=ON >/dev/null
fi
# shellcheck disable=SC2086
# The launch hooks, which record preloads into the commands it starts (not sanitized: they run
# inside the traced programs).
cmake --build "$BUILD" -j"$(nproc)" --target gpuscope gpuscope_launches gpuscope_unit_tests $FUZZ_TARGETS

BUILD=$(cd "$BUILD" && pwd)
LOGS=$BUILD/sanitizer-logs
rm -rf "$LOGS"
mkdir -p "$LOGS"
# A report ends the process with exit code 86 (a test expecting another code fails), and goes
# to a file too. Leaks are reported at exit.
export ASAN_OPTIONS="halt_on_error=1:exitcode=86:detect_leaks=1:log_path=$LOGS/asan:strip_path_prefix=$PWD/"
export UBSAN_OPTIONS="halt_on_error=1:exitcode=86:print_stacktrace=1:log_path=$LOGS/ubsan:strip_path_prefix=$PWD/"
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"

# ASan's frames at -O0 are several times larger: deep recursions that fit in 8 MiB in the
# ordinary build (JSON of a flame graph 1,024 frames deep) need more here.
ulimit -s 65536

failed=0
echo "sanitizers: unit tests"
# Left out: the overhead budget's tests that burn CPU and weigh probe costs against the CPU time
# this process used (the sanitizers add to it as they go).
"$BUILD/tests/gpuscope_unit_tests" --gtest_brief=1 \
  --gtest_filter='-Budget.AlwaysOnProbesTakeTheirShareAndLateHitsStillCount:Budget.SlowSwitchesLengthenTheOffPeriodNotTheShareObserved:Budget.TheFirstEstimateComesAfterHalfASecond:Budget.AProcessFarOverItsBudgetIsCutBackAfterAFifthOfASecond:Budget.AnOnPeriodsLaunchesCountForTheCycleAsItIsLived' \
  || failed=1

echo "sanitizers: runtime tests"
# The programs traced are the ordinary build's; the gpuscope tracing them is the sanitized one.
# Left out: tests that measure rates or overheads (an -O0 build with sanitizers is several times
# slower), --gpu-times (its library goes into other processes, not built here), and the kill -9
# loops (the kernel's detaching is what they wait for; test_faults.py runs them on the ordinary
# build).
GPUSCOPE_BUILD=$BUILD GPUSCOPE_TARGETS=$PWD/build/targets /usr/bin/python3 -m pytest -q -p no:cacheprovider \
  tests/runtime/test_bad_input.py tests/runtime/test_faults.py tests/runtime/test_record.py \
  tests/runtime/test_timeline.py tests/runtime/test_copies.py \
  --deselect tests/runtime/test_record.py::test_a_small_ring_is_drained_in_time \
  --deselect tests/runtime/test_faults.py::test_kill_9_at_random_moments_of_a_recording \
  --deselect tests/runtime/test_faults.py::test_kill_9_of_the_agent_at_random_moments_leaves_no_process_stopped \
  || failed=1

echo "sanitizers: fuzz targets, ${FUZZ_SECONDS}s each"
rm -rf "$BUILD/fuzz-runs"
# shellcheck disable=SC2086
BUILD=$BUILD NO_BUILD=1 TARGETS="$FUZZ_TARGETS" OUT="$BUILD/fuzz-runs" bench/fuzz.sh "$FUZZ_SECONDS" || failed=1

if compgen -G "$LOGS/*" >/dev/null; then
  echo "sanitizers: reports:"
  for f in "$LOGS"/*; do
    echo "--- $f"
    head -60 "$f"
  done
  failed=1
fi
if ((failed)); then
  echo "sanitizers: FAILED"
  exit 1
fi
echo "sanitizers: no reports"
