#!/usr/bin/env python3
"""What NVML's GPM metrics (Hopper and later) say beside the utilisation NVML reports, once a
second, while something runs on the GPU: is SM activity the signal that tells tiny kernels back
to back (NVML's "busy" near 100%) from a GPU that is really used?

    python3 bench/gpm_probe.py [--device 0] [--seconds 10] [-- COMMAND ...]

With a command, it runs the command and samples until it ends. Prints, per second: NVML's
utilization.gpu, and GPM's graphics (any kernel running), SM active (share of SMs busy), SM
occupancy (warps resident of the maximum), any tensor pipe, DRAM bandwidth: all percent."""
import argparse
import ctypes
import subprocess
import sys
import time

GPM_METRICS = [("graphics", 1), ("sm_active", 2), ("sm_occupancy", 3), ("tensor", 5), ("dram_bw", 10)]
METRIC_SLOTS = 256  # at least the library's NVML_GPM_METRIC_MAX; it reads numMetrics of them


class MetricInfo(ctypes.Structure):
    _fields_ = [("shortName", ctypes.c_char_p), ("longName", ctypes.c_char_p), ("unit", ctypes.c_char_p)]


class Metric(ctypes.Structure):
    _fields_ = [("metricId", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint), ("value", ctypes.c_double),
                ("metricInfo", MetricInfo)]


class MetricsGet(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("numMetrics", ctypes.c_uint), ("sample1", ctypes.c_void_p),
                ("sample2", ctypes.c_void_p), ("metrics", Metric * METRIC_SLOTS)]


class Support(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("isSupportedDevice", ctypes.c_uint)]


class Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("command", nargs="*")
    a = ap.parse_args()
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as e:
        sys.exit(f"gpm_probe: cannot load NVML ({e}): run it where the NVIDIA driver is installed")

    def check(what, rc):
        if rc != 0:
            nvml.nvmlErrorString.restype = ctypes.c_char_p
            sys.exit(f"gpm_probe: {what} failed: {nvml.nvmlErrorString(rc).decode()}")

    check("nvmlInit_v2", nvml.nvmlInit_v2())
    dev = ctypes.c_void_p()
    check("nvmlDeviceGetHandleByIndex_v2", nvml.nvmlDeviceGetHandleByIndex_v2(a.device, ctypes.byref(dev)))
    support = Support(version=1)
    check("nvmlGpmQueryDeviceSupport", nvml.nvmlGpmQueryDeviceSupport(dev, ctypes.byref(support)))
    if not support.isSupportedDevice:
        sys.exit("gpm_probe: this GPU does not offer GPM metrics (Hopper and later do)")
    samples = [ctypes.c_void_p(), ctypes.c_void_p()]
    for s in samples:
        check("nvmlGpmSampleAlloc", nvml.nvmlGpmSampleAlloc(ctypes.byref(s)))
    proc = subprocess.Popen(a.command) if a.command else None
    end = time.monotonic() + a.seconds
    print("t_s   nvml_util  " + "  ".join(f"{n:>12}" for n, _ in GPM_METRICS), flush=True)
    check("nvmlGpmSampleGet", nvml.nvmlGpmSampleGet(dev, samples[0]))
    t0, k = time.monotonic(), 0
    while (proc.poll() is None) if proc else time.monotonic() < end:
        time.sleep(1)
        k ^= 1
        cost0 = time.perf_counter()
        check("nvmlGpmSampleGet", nvml.nvmlGpmSampleGet(dev, samples[k]))
        get = MetricsGet(version=1, numMetrics=len(GPM_METRICS), sample1=samples[k ^ 1], sample2=samples[k])
        for i, (_, mid) in enumerate(GPM_METRICS):
            get.metrics[i].metricId = mid
        check("nvmlGpmMetricsGet", nvml.nvmlGpmMetricsGet(ctypes.byref(get)))
        cost = (time.perf_counter() - cost0) * 1e6
        util = Utilization()
        nvml.nvmlDeviceGetUtilizationRates(dev, ctypes.byref(util))
        cols = [f"{get.metrics[i].value:12.1f}" if get.metrics[i].nvmlReturn == 0 else f"{'err ' + str(get.metrics[i].nvmlReturn):>12}"
                for i in range(len(GPM_METRICS))]
        print(f"{time.monotonic() - t0:5.1f} {util.gpu:9d}  " + "  ".join(cols) + f"   ({cost:.0f} µs)", flush=True)
    for s in samples:
        nvml.nvmlGpmSampleFree(s)
    nvml.nvmlShutdown()
    return proc.returncode if proc else 0


if __name__ == "__main__":
    sys.exit(main())
