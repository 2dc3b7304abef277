#!/usr/bin/env python3
"""What NVML's GPU performance metrics (GPM, Hopper and later) read beside NVML's utilisation on the
diagnose suite's workloads: whether SM activity tells a GPU kept busy by tiny kernels (a small
batch) from one its kernels fill. Runs each workload alone for --seconds and prints, per second,
NVML's GPU utilisation and GPM's SM activity and occupancy, graphics, tensor, DRAM bandwidth and
the FP64/FP32/FP16/integer pipes' activity (medians over the run).

    python3 bench/gpu/gpm_probe.py [--seconds 6] [--runs train:clean,train:small_batch:2,...]
"""
import argparse
import ctypes
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
GPM_METRIC_MAX = 333  # nvml.h's array size in recent drivers; NVML reads numMetrics entries only
METRICS = {1: "graphics", 2: "sm_activity", 3: "sm_occupancy", 4: "integer", 5: "tensor", 10: "dram",
           11: "fp64", 12: "fp32", 13: "fp16"}


class Info(ctypes.Structure):
    _fields_ = [("short", ctypes.c_char_p), ("long", ctypes.c_char_p), ("unit", ctypes.c_char_p)]


class Metric(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint), ("ret", ctypes.c_int), ("value", ctypes.c_double), ("info", Info)]


class MetricsGet(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("num", ctypes.c_uint), ("s1", ctypes.c_void_p), ("s2", ctypes.c_void_p),
                ("metrics", Metric * GPM_METRIC_MAX)]


class Support(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("supported", ctypes.c_uint)]


class Util(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=6)
    ap.add_argument("--runs", default="idle,train:clean,train:small_batch:1,train:small_batch:2,cnn:clean,"
                                      "cnn:small_batch:2,infer:clean,infer:small_batch:2,train:item:2,train:pageable:2")
    a = ap.parse_args()
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    assert nvml.nvmlInit_v2() == 0
    dev = ctypes.c_void_p()
    assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0
    sup = Support(1, 0)
    r = nvml.nvmlGpmQueryDeviceSupport(dev, ctypes.byref(sup))
    print(f"nvmlGpmQueryDeviceSupport: ret {r}, supported {sup.supported}", flush=True)
    if r != 0 or not sup.supported:
        return
    samples = [ctypes.c_void_p(), ctypes.c_void_p()]
    for s in samples:
        assert nvml.nvmlGpmSampleAlloc(ctypes.byref(s)) == 0

    def read_gpm(prev, cur):
        g = MetricsGet()
        g.version, g.num, g.s1, g.s2 = 1, len(METRICS), prev, cur
        for i, m in enumerate(METRICS):
            g.metrics[i].id = m
        ret = nvml.nvmlGpmMetricsGet(ctypes.byref(g))
        return ret, {METRICS[g.metrics[i].id]: (g.metrics[i].value if g.metrics[i].ret == 0 else None)
                     for i in range(len(METRICS))}

    for run in a.runs.split(","):
        p = None
        if run != "idle":
            w, f, *i = run.split(":")
            ready = f"/tmp/gpm-probe-{os.getpid()}.ready"
            if os.path.exists(ready):
                os.unlink(ready)
            p = subprocess.Popen([sys.executable, str(ROOT / "bench/diagnose/workload.py"), "--workload", w, "--fault", f,
                                  "--intensity", i[0] if i else "1", "--seconds", str(a.seconds + 2), "--dir", "/tmp",
                                  "--ready", ready], stdout=subprocess.PIPE, text=True)
            while not os.path.exists(ready) and p.poll() is None:  # its loop starts once warm
                time.sleep(0.1)
            time.sleep(0.5)
        rows = []
        cur = 0
        t_get = time.perf_counter()
        nvml.nvmlGpmSampleGet(dev, samples[cur])
        get_cost = time.perf_counter() - t_get
        for _ in range(int(a.seconds)):
            time.sleep(1)
            nxt = 1 - cur
            t = time.perf_counter()
            nvml.nvmlGpmSampleGet(dev, samples[nxt])
            get_cost = max(get_cost, time.perf_counter() - t)
            ret, vals = read_gpm(samples[cur], samples[nxt])
            cur = nxt
            u = Util()
            nvml.nvmlDeviceGetUtilizationRates(dev, ctypes.byref(u))
            rows.append((u.gpu, vals, ret))
        out = p.communicate()[0].strip() if p else ""
        fmt = lambda v: "-" if v is None else f"{v:5.1f}"
        # Each metric's median over the run's seconds (its first second left out where there are 3 or more).
        keep = rows[1:] if len(rows) >= 3 else rows
        med = lambda xs: sorted(xs)[len(xs) // 2] if xs else None
        util = med([u for u, _, _ in keep])
        vals = {m: med([v[m] for _, v, _ in keep if v[m] is not None]) for m in METRICS.values()}
        print(f"{run:24s} util {util} " + " ".join(f"{m} {fmt(v)}" for m, v in vals.items())
              + "".join(f" ret {r}" for _, _, r in keep if r)
              + f"  | SampleGet {get_cost * 1e3:.2f} ms max | {out[-60:]}", flush=True)


if __name__ == "__main__":
    main()
