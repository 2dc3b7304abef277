#!/usr/bin/env bash
# Makes the ring-buffer captures the pipeline's unit tests replay (tests/unit/test_pipeline_replay.cpp),
# as root, with the build in build/. A capture holds the records as the BPF side wrote them: after a
# change to bpf/events.h, make them again and update the figures the tests expect from the record
# written beside each (printed below).
set -euo pipefail
cd "$(dirname "$0")/../.."
CUDA=${CUDA_HOME:-/usr/local/cuda}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# A Python program calling CUDA through ctypes from known functions, a thread and a forked child;
# CPU samples walked by frame pointers (small records), calls' stacks from .eh_frame.
build/gpuscope record -q --cpu-profile 199 --sample-unwind fp -o "$tmp/py.gpuscope" \
  --capture-records tests/data/py_cuda.ring -- \
  python3 tests/targets/py_cuda.py "$CUDA/lib64/libcudart.so.13" "$CUDA/lib64/stubs/libcuda.so"
sqlite3 "$tmp/py.gpuscope" "SELECT c.pid, f.name FROM calls c JOIN functions f ON f.id = c.func ORDER BY c.id;
  SELECT 'samples', count(*) FROM samples; SELECT 'exit', pid, exit_code FROM processes WHERE pid IN (SELECT pid FROM calls);"
