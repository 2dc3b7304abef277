#!/bin/bash
# A launch-bound Python process for the whole run, and a short-lived CUDA process every 2 s.
cd /work/main
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
python3 bench/py_launch_loop.py &
while true; do build/targets/cuda_ops --iterations 50 --threads 2 >/dev/null; sleep 2; done
