#!/usr/bin/env bash
# Everything issue 2 asks of the GPU machine, in one run: the PyTorch validation against
# torch.profiler, then the overhead and event-rate benchmarks. Writes to ${OUT:-/tmp/gpuscope-out}.
#   BUILD=build-static bench/gpu/run_on_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build-static}
OUT=${OUT:-/tmp/gpuscope-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
TORCH_LIB=$($PY -c 'import os, nvidia.cu13 as m; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64:${TORCH_LIB}"

{
  echo "== machine"; date -u; uname -r; nvidia-smi -L; echo "commit: ${GPUSCOPE_COMMIT:-unknown (set GPUSCOPE_COMMIT)}"
  echo "== validation: PyTorch training loop vs torch.profiler"
  $BUILD/gpuscope record -o "$OUT/train.gpuscope" -- $PY bench/gpu/train_step.py "$OUT/truth.json" --steps 5
  echo "gpuscope exit: $?"
  $PY bench/gpu/compare.py "$OUT/train.gpuscope" "$OUT/truth.json"
  $BUILD/gpuscope report --top 8 "$OUT/train.gpuscope" > "$OUT/train-report.txt"
  head -60 "$OUT/train-report.txt"
} 2>&1 | tee "$OUT/validation.txt"

if [ -z "${SKIP_BENCH:-}" ]; then
{
  echo "== overhead per call and event rate: real <<<1,32>>> launches"
  $PY bench/uprobe_cost.py --build "$BUILD" --mode real --calls 50000 --rounds 5 --rate-threads ${RATE_THREADS:-1,4,16} \
      --rate-calls ${RATE_CALLS:-1600000} --json "$OUT/cost-real.json"
} 2>&1 | tee "$OUT/bench.txt"
fi
rm -f "$OUT"/*.gpuscope
