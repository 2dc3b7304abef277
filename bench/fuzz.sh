#!/usr/bin/env bash
# Fuzzes gpuscope's parsers of untrusted input with libFuzzer (ASan + UBSan): ELF files and their
# call frame information, record files (report, flame graph, timeline), ring-buffer call records,
# the agent's YAML config. Prints, per target, the executions and the crashes found; a crash's
# input is kept under $OUT/crashes/TARGET/.
#
#   bench/fuzz.sh [SECONDS_PER_TARGET]   (default 60; issue 30 asks for >= 10 million executions each)
#   TARGETS="fuzz_decode_call" bench/fuzz.sh 600
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-60}
BUILD=${BUILD:-build-fuzz}
OUT=${OUT:-$BUILD/runs}
FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1"
if [[ ! -f $BUILD/CMakeCache.txt ]]; then
  CC=clang CXX=clang++ cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUSCOPE_TESTS=OFF -DGPUSCOPE_FUZZ=ON \
    -DCMAKE_C_FLAGS="$FLAGS" -DCMAKE_CXX_FLAGS="$FLAGS" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
fi
TARGETS=${TARGETS:-"fuzz_unwind_table fuzz_record_reader fuzz_decode_call fuzz_agent_config"}
cmake --build "$BUILD" -j"$(nproc)" --target $TARGETS >/dev/null

# Seeds: real inputs of each kind.
seeds() {
  local dir=$OUT/seeds/$1
  mkdir -p "$dir"
  case $1 in
    fuzz_unwind_table) for f in /bin/true /usr/lib/x86_64-linux-gnu/libz.so.1 "$BUILD"/fuzz/fuzz_agent_config; do
                         [[ -f $f ]] && head -c 4000000 "$f" > "$dir/$(basename "$f")"; done ;;
    fuzz_record_reader) if [[ $(id -u) == 0 && -x build/gpuscope && ! -f $dir/true.gpuscope ]]; then
                          # Small pages: a record's 64 KiB pages make even an empty one ~2 MB.
                          build/gpuscope record -q -o "$dir/true.gpuscope" -- true >/dev/null 2>&1 || true
                          sqlite3 "$dir/true.gpuscope" "PRAGMA page_size=512; VACUUM;" 2>/dev/null || true; fi ;;
    fuzz_agent_config) cp deploy/agent.yaml "$dir/" ;;
    fuzz_decode_call) head -c 4096 /dev/urandom > "$dir/random" ;;
  esac
  echo "$dir"
}

for t in $TARGETS; do
  corpus=$OUT/corpus/$t
  mkdir -p "$corpus" "$OUT/crashes/$t"
  log=$OUT/$t.log
  set +e
  ASAN_OPTIONS=detect_leaks=0 "$BUILD/fuzz/$t" -max_total_time="$SECONDS_EACH" -max_len=1048576 -timeout=30 \
    -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$OUT/crashes/$t/" "$corpus" "$(seeds "$t")" >"$log" 2>&1
  rc=$?
  set -e
  runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || true)
  [[ -n $runs ]] || runs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
  crashes=$(find "$OUT/crashes/$t" -type f | wc -l)
  echo "$t: ${runs:-?} executions in ${SECONDS_EACH}s, $crashes crash(es), exit $rc (log $log)"
done
