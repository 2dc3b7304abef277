#!/usr/bin/env bash
# The agent's CPU beside one clean workload (run.py --steady), with a CPU profile of the agent
# itself: `perf record` (software cpu-clock, call graphs) on the agent from PERF_AT seconds for
# PERF_SECONDS. The profile is read where the unstripped binary is (perf buildid-cache --add it):
#   BUILD=carry-static PERF=/tmp/perf/perf OUT=/tmp/agent-perf bench/diagnose/agent_perf.sh
#   perf report -i OUT/agent.perf.data --no-children --sort comm,sym
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build-static}
OUT=${OUT:-/tmp/agent-perf}
PERF=${PERF:-perf}
WORKLOAD=${WORKLOAD:-train}
SECONDS_RUN=${SECONDS_RUN:-100}
PERF_AT=${PERF_AT:-45}
PERF_SECONDS=${PERF_SECONDS:-30}
mkdir -p "$OUT"
python3 bench/diagnose/run.py --build "$BUILD" --out "$OUT" --steady --workloads "$WORKLOAD" \
  --seconds "$SECONDS_RUN" > "$OUT/steady.txt" 2>&1 &
run=$!
sleep "$PERF_AT"
agent=$(pgrep -f "$BUILD/gpuscope agent" | head -1 || true)
if [ -n "$agent" ]; then
  "$PERF" record -e cpu-clock -F 499 -g -p "$agent" -o "$OUT/agent.perf.data" -- sleep "$PERF_SECONDS" \
    > "$OUT/perf-record.txt" 2>&1 || echo "perf record failed: $(tail -2 "$OUT/perf-record.txt")"
else
  echo "no agent found to profile"
fi
wait "$run"
tail -4 "$OUT/steady.txt"
