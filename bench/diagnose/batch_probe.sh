#!/bin/bash
# What the suite's workloads run on the GPU at their own batch and at a small one: each run recorded
# with --gpu-times and its kernels listed by GPU time (bench/gpu/kernel_mix.py), for telling a GPU
# kept busy by small kernels from one its kernels fill. On the GPU machine, as root:
#   bash bench/diagnose/batch_probe.sh BUILD OUTDIR [workload:fault:intensity ...]
# (default: train, cnn and infer clean and at batch / 128).
set -u
build=$1 out=$2
shift 2
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(train:none:1 train:small_batch:2 cnn:none:1 cnn:small_batch:2 infer:none:1 infer:small_batch:2)
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
for run in "${runs[@]}"; do
  IFS=: read -r w f i <<<"$run"
  rec="$out/$w-$f-$i.gpuscope"
  "$build/gpuscope" record --gpu-times -o "$rec" -- python3 "$here/workload.py" --workload "$w" --fault "$f" \
    --intensity "$i" --seconds 4 --ready "$out/$w-$f-$i.ready" >"$out/$w-$f-$i.log" 2>&1 || { echo "$run: record failed"; tail -3 "$out/$w-$f-$i.log"; }
  grep -h "^workload" "$out/$w-$f-$i.log"
  python3 "$here/../gpu/kernel_mix.py" "$rec" --top 10 --since "$(cat "$out/$w-$f-$i.ready" 2>/dev/null || echo 0)"
  echo
done
