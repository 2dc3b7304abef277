#!/usr/bin/env python3
"""GPU times (issue 5): per kernel name, the total GPU time `gpuscope record --gpu-times` measures
for train_step.py's profiled steps against torch.profiler's for the same steps, run separately
(two CUPTI users cannot share a process), and the kernel counts of both. With --runs N, N runs of
each, interleaved: medians are compared, and torch.profiler's own run-to-run spread per kernel is
shown beside the difference (a kernel's time moves between executions of the same program).

With --pacing profiler, gpuscope's runs also run torch.profiler with CPU activity only, which
uses no CUPTI: the host then launches at the full profiler's pace, so kernels meet the same
neighbours and idle gaps in both kinds of run.

With --nsys, Nsight Systems (`nsys profile -t cuda`, its own CUPTI session) measures the same
steps too, paced as gpuscope's runs are: a third measurement, to tell a difference between
gpuscope and torch.profiler that gpuscope makes from one that torch.profiler's runs make.

    python3 bench/gpu/gpu_times_check.py --gpuscope build-static/gpuscope [--steps 5] [--runs 3]
        [--pacing profiler] [--nsys [PATH]]"""
import argparse
import ctypes
import json
import os
import pathlib
import sqlite3
import statistics
import subprocess
import sys
import tempfile

from overhead import find_nsys

HERE = pathlib.Path(__file__).resolve().parent


def profiler_run(args, tmp, r):
    """torch.profiler's kernels: {name: (count, us)}."""
    path = os.path.join(tmp, f"truth{r}.json")
    subprocess.run([args.python, str(HERE / "train_step.py"), path, "--steps", str(args.steps)], check=True)
    truth = json.load(open(path))
    return {n: (truth["kernels"][n], truth["kernel_us"].get(n, 0)) for n in truth["kernels"]}, step_ms(truth)


def pacing_flags(args):
    """train_step.py's flags for the runs that are not torch.profiler's own."""
    return ["--profile-cpu-only"] if args.pacing == "profiler" else []


def gpuscope_run(args, tmp, r):
    """gpuscope's kernels in the profiled window ({name: (count, us)}), its record's meta, the
    kernels tied to their launch (all, tied) and the GPU time by Python line."""
    ours_path, rec = os.path.join(tmp, f"ours{r}.json"), os.path.join(tmp, f"run{r}.gpuscope")
    run = subprocess.run([args.gpuscope, "record", "--gpu-times", "-o", rec, "--", args.python,
                          str(HERE / "train_step.py"), ours_path, "--steps", str(args.steps), "--no-profile",
                          *pacing_flags(args)], capture_output=True, text=True)
    print(run.stderr.strip())
    ours_run = json.load(open(ours_path))
    db = sqlite3.connect(rec)
    meta = dict(db.execute("SELECT key, value FROM meta"))
    # Kernels whose launch call lies in the profiled window (or, untied, that started in it).
    rows = db.execute(
        "SELECT a.name, count(*), sum(a.end_ns - a.start_ns) FROM gpu_activities a LEFT JOIN calls c ON c.id = a.call_id "
        "WHERE a.kind = 'kernel' AND a.pid = ? AND coalesce(c.ts_ns, a.start_ns) BETWEEN ? AND ? GROUP BY 1",
        (ours_run["pid"], ours_run["t0"], ours_run["t1"])).fetchall()
    tied = db.execute("SELECT count(*), count(call_id) FROM gpu_activities WHERE kind = 'kernel'").fetchone()
    lines = db.execute(
        "SELECT p.function || ' (' || p.file || ':' || p.line || ')', sum(a.end_ns - a.start_ns) FROM gpu_activities a "
        "JOIN calls c ON c.id = a.call_id JOIN stack_frames sf ON sf.stack_id = c.stack_id "
        "JOIN modules m ON m.id = sf.module_id AND m.path = '[python]' JOIN python_frames p ON p.id = sf.offset "
        "WHERE a.kind = 'kernel' AND sf.depth = (SELECT min(depth) FROM stack_frames f2 JOIN modules m2 ON "
        "m2.id = f2.module_id AND m2.path = '[python]' WHERE f2.stack_id = c.stack_id) GROUP BY 1 ORDER BY 2 DESC "
        "LIMIT 5").fetchall()
    db.close()
    os.unlink(rec)
    return {n: (c, ns / 1e3) for n, c, ns in rows}, meta, tied, lines, step_ms(ours_run)


def nsys_run(args, tmp, r):
    """Nsight Systems' kernels in the window ({name: (count, us)}) and ms a step: the kernels that
    start inside train_step.py's NVTX range (it waits for the GPU before the range ends)."""
    out_json, rep = os.path.join(tmp, f"nsys{r}.json"), os.path.join(tmp, f"nsys{r}")
    subprocess.run([args.nsys, "profile", "-t", "cuda,nvtx", "--sample=none", "--cpuctxsw=none", "--force-overwrite=true",
                    "-o", rep, "--", args.python, str(HERE / "train_step.py"), out_json, "--steps", str(args.steps),
                    "--no-profile", "--nvtx", *pacing_flags(args)], check=True, capture_output=True)
    if not os.path.exists(rep + ".nsys-rep") and os.path.exists(rep + ".qdstrm"):
        # An nsys without its importer beside it (the one Nsight Compute bundles) leaves the raw
        # stream: the importer of the desktop host directory next to it turns it into a report.
        importers = sorted(pathlib.Path(args.nsys).resolve().parents[1].glob("*/QdstrmImporter"))
        if not importers:
            raise RuntimeError("nsys left only a .qdstrm and no QdstrmImporter is installed beside it")
        subprocess.run([str(importers[0]), "-i", rep + ".qdstrm"], check=True, capture_output=True)
    subprocess.run([args.nsys, "export", "--type", "sqlite", "--force-overwrite=true", "-o", rep + ".sqlite",
                    rep + ".nsys-rep"], check=True, capture_output=True)
    db = sqlite3.connect(rep + ".sqlite")
    rows = db.execute(
        "WITH w AS (SELECT n.start, n.end FROM NVTX_EVENTS n LEFT JOIN StringIds t ON t.id = n.textId "
        "WHERE coalesce(n.text, t.value) = ?) "
        "SELECT m.value, s.value, count(*), sum(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN StringIds s ON s.id = k.demangledName LEFT JOIN StringIds m ON m.id = k.mangledName, w "
        "WHERE k.start >= w.start AND k.start <= w.end GROUP BY 1, 2",
        ("train_step window",)).fetchall()
    db.close()
    for f in (rep + ".nsys-rep", rep + ".sqlite", rep + ".qdstrm"):
        if os.path.exists(f):
            os.unlink(f)
    if not rows:
        raise RuntimeError("Nsight Systems' record has no kernels inside the NVTX window")
    kernels = {}
    for mangled, demangled, c, ns in rows:
        # Nsight's demangler spells names its own way ((bool)1, <unnamed>): the C++ runtime's, as
        # torch.profiler and gpuscope use, gives the names the other two runs have.
        name = cxx_demangle(mangled) or demangled
        count, us = kernels.get(name, (0, 0.0))
        kernels[name] = (count + c, us + ns / 1e3)
    return kernels, step_ms(json.load(open(out_json)))


def cxx_demangle(mangled):
    if not mangled or not mangled.startswith("_Z"):
        return mangled
    lib = ctypes.CDLL("libstdc++.so.6")
    lib.__cxa_demangle.restype = ctypes.c_void_p
    status = ctypes.c_int()
    out = lib.__cxa_demangle(mangled.encode(), None, None, ctypes.byref(status))
    if status.value != 0 or not out:
        return None
    name = ctypes.string_at(out).decode(errors="replace")
    ctypes.CDLL(None).free(ctypes.c_void_p(out))
    return name


def step_ms(run):
    return (run["t1"] - run["t0"]) / 1e6 / run["steps"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpuscope", default="build-static/gpuscope")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--runs", type=int, default=1,
                    help="runs of each, interleaved; per kernel the medians are compared, and with 2 or more the "
                         "spread of torch.profiler's own runs is shown beside the difference")
    ap.add_argument("--nsys", nargs="?", const="auto",
                    help="also measure with Nsight Systems (PATH, or found in the usual places when left out)")
    ap.add_argument("--json", help="write each run's {kernel: [count, us]} of both tools here")
    ap.add_argument("--pacing", choices=["free", "profiler"], default="free",
                    help="profiler: gpuscope's runs also run torch.profiler with CPU activity alone (no CUPTI), "
                         "so that the host launches at the full profiler's pace and each kernel has the same "
                         "neighbours and gaps in both kinds of run")
    args = ap.parse_args()
    # CUDA_LAUNCH_BLOCKING=1 (inherited by both kinds of run): each kernel runs alone on an idle
    # GPU, so that a kernel's time no longer depends on what ran beside it in that run.
    print(f"CUDA_LAUNCH_BLOCKING={os.environ.get('CUDA_LAUNCH_BLOCKING', 'unset')}")
    if args.nsys == "auto":
        args.nsys = find_nsys()
        print(f"Nsight Systems: {args.nsys or 'not installed on this machine: no third measurement'}")
    theirs_runs, ours_runs, nsys_runs = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.runs):
            theirs, their_ms = profiler_run(args, tmp, r)
            theirs_runs.append(theirs)
            ours, meta, tied, lines, our_ms = gpuscope_run(args, tmp, r)
            ours_runs.append(ours)
            nsys_ms = ""
            if args.nsys:
                try:
                    by_nsys, ms = nsys_run(args, tmp, r)
                    nsys_runs.append(by_nsys)
                    nsys_ms = f", Nsight Systems {ms:.2f}"
                except (subprocess.CalledProcessError, RuntimeError, sqlite3.Error) as e:
                    detail = getattr(e, "stderr", None)
                    detail = detail.decode(errors="replace")[-600:] if isinstance(detail, bytes) else ""
                    print(f"Nsight Systems failed, left out from here on: {e} {detail}")
                    args.nsys, nsys_runs = None, []
            print(f"run {r + 1}: gpu_times meta: {meta.get('gpu_times')}; kernels recorded: {tied[0]}, "
                  f"tied to their launch call: {tied[1]}; ms a step: torch.profiler {their_ms:.2f}, "
                  f"gpuscope {our_ms:.2f}{nsys_ms} (pacing {args.pacing})")

    names = set().union(*ours_runs, *theirs_runs)
    ours = {n: (statistics.median(run.get(n, (0, 0.0))[0] for run in ours_runs),
                statistics.median(run.get(n, (0, 0.0))[1] for run in ours_runs)) for n in names}
    theirs = {n: (statistics.median(run.get(n, (0, 0.0))[0] for run in theirs_runs),
                  statistics.median(run.get(n, (0, 0.0))[1] for run in theirs_runs)) for n in names}
    names = sorted(names, key=lambda n: -theirs[n][1])
    equal_counts = sum(1 for n in names if all(run.get(n, (0,))[0] == theirs_runs[0].get(n, (0,))[0]
                                               for run in ours_runs + theirs_runs))
    total_ours = sum(v[1] for v in ours.values())
    total_theirs = sum(v[1] for v in theirs.values())
    print(f"{len(names)} kernel names; {equal_counts} with equal counts in every run; GPU time in all "
          f"(median of {args.runs} run(s) each): gpuscope {total_ours:.0f} us, torch.profiler {total_theirs:.0f} us "
          f"({100 * (total_ours - total_theirs) / max(total_theirs, 1e-9):+.2f}%)")
    # Names compared without spaces: demanglers of different GCC releases write "> >" or ">>".
    squeeze = {n.replace(" ", ""): n for n in names}
    nsys_runs = [{squeeze.get(n.replace(" ", ""), n): v for n, v in run.items()} for run in nsys_runs]
    by_nsys = {n: statistics.median(run.get(n, (0, 0.0))[1] for run in nsys_runs) for n in names} if nsys_runs else {}
    if nsys_runs:
        nsys_names = set().union(*nsys_runs)
        total_nsys = sum(by_nsys.values())
        print(f"Nsight Systems: {len(nsys_names & set(names))} of the {len(names)} names, "
              f"{len(nsys_names - set(names))} others; GPU time in all {total_nsys:.0f} us "
              f"({100 * (total_ours - total_nsys) / max(total_nsys, 1e-9):+.2f}% gpuscope against it, "
              f"{100 * (total_theirs - total_nsys) / max(total_nsys, 1e-9):+.2f}% torch.profiler)")
    nsys_head = f" {'nsys us':>10} {'ours-nsys':>9} {'prof-nsys':>9}" if nsys_runs else ""
    print(f"  {'gpuscope n':>10} {'profiler n':>10} {'gpuscope us':>12} {'profiler us':>12} {'diff':>8} "
          f"{'profiler spread':>16} {'gpuscope spread':>16}{nsys_head}  kernel")
    within = within_spread = ours_nsys = theirs_nsys = 0
    for n in names:
        oc, ous = ours[n]
        tc, tus = theirs[n]
        diff = 100 * (ous - tus) / tus if tus else float("nan")
        # Each tool against itself: its runs' range, as a share of their median.
        vals = [run.get(n, (0, 0.0))[1] for run in theirs_runs]
        spread = 100 * (max(vals) - min(vals)) / tus if tus and len(vals) > 1 else float("nan")
        our_vals = [run.get(n, (0, 0.0))[1] for run in ours_runs]
        our_spread = 100 * (max(our_vals) - min(our_vals)) / ous if ous and len(our_vals) > 1 else float("nan")
        within += abs(diff) <= 2
        within_spread += abs(diff) <= 2 or (len(vals) > 1 and abs(diff) <= spread)
        nsys_cols = ""
        if nsys_runs:
            nus = by_nsys[n]
            od, td = (100 * (v - nus) / nus if nus else float("nan") for v in (ous, tus))
            ours_nsys += abs(od) <= 2
            theirs_nsys += abs(td) <= 2
            nsys_cols = f" {nus:10.1f} {od:+8.2f}% {td:+8.2f}%"
        print(f"  {oc:10.0f} {tc:10.0f} {ous:12.1f} {tus:12.1f} {diff:+7.2f}% {spread:15.2f}% {our_spread:15.2f}%"
              f"{nsys_cols}  {n[:100]}")
    print(f"{within} of {len(names)} kernel names within 2% of torch.profiler's GPU time")
    if args.runs > 1:
        print(f"{within_spread} of {len(names)} within 2% or within the spread of torch.profiler's own runs")
    if nsys_runs:
        print(f"against Nsight Systems: gpuscope within 2% for {ours_nsys} of {len(names)} names, "
              f"torch.profiler for {theirs_nsys}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": args.steps, "pacing": args.pacing, "cupti_api": os.environ.get("GPUSCOPE_CUPTI_API"),
                       "cupti_clock": os.environ.get("GPUSCOPE_CUPTI_CLOCK"),
                       "gpuscope_runs": ours_runs, "profiler_runs": theirs_runs, "nsys_runs": nsys_runs}, f, indent=1)
    print("GPU time by Python line (innermost Python frame of the launch, last run):")
    for line, ns in lines:
        print(f"  {ns / 1e3:10.1f} us  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
