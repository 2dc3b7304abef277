#!/usr/bin/env python3
"""What `record --gpu-times` costs the training step, by which CUPTI activities it asks for
(issue 5's overhead figure), beside the plain record and torch.profiler, rounds interleaved.
For each GPU-times variant it also says how many kernels were tied to their launch call: the
API records exist only to tie them.

    python3 bench/gpu/cupti_api_cost.py --gpuscope build-static/gpuscope [--rounds 3] [--steps 30]"""
import argparse
import json
import os
import pathlib
import sqlite3
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent

# name -> (record?, extra record flags, environment)
VARIANTS = {
    "baseline": (False, [], {}),
    "record": (True, [], {}),
    "gpu-times callbacks": (True, ["--gpu-times"], {"GPUSCOPE_CUPTI_API": "callbacks"}),
    "gpu-times callbacks CUPTI clock": (True, ["--gpu-times"], {"GPUSCOPE_CUPTI_API": "callbacks", "GPUSCOPE_CUPTI_CLOCK": "cupti"}),
    "gpu-times API activities": (True, ["--gpu-times"], {"GPUSCOPE_CUPTI_API": "runtime,driver"}),
    "gpu-times driver activity": (True, ["--gpu-times"], {"GPUSCOPE_CUPTI_API": "driver"}),
    "gpu-times no API records": (True, ["--gpu-times"], {"GPUSCOPE_CUPTI_API": "none"}),
    "torch.profiler": (False, [], {}),
}


def run(args, name, tmp):
    recorded, flags, env_extra = VARIANTS[name]
    truth, rec = os.path.join(tmp, "t.json"), os.path.join(tmp, "r.gpuscope")
    cmd = [args.python, str(HERE / "train_step.py"), truth, "--steps", str(args.steps), "--warmup", "5"]
    if name != "torch.profiler":
        cmd.append("--no-profile")
    if recorded:
        cmd = [args.gpuscope, "record", "-q", *flags, "-o", rec, "--"] + cmd
    env = dict(os.environ, **env_extra)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        print(f"{name}: exit {p.returncode}: {p.stderr.strip()[-500:]}", file=sys.stderr)
        return None, None
    t = json.load(open(truth))
    step_ms = (t["t1"] - t["t0"]) / t["steps"] / 1e6
    tied = None
    if "--gpu-times" in flags:
        db = sqlite3.connect(rec)
        total, with_call = db.execute("SELECT count(*), count(call_id) FROM gpu_activities WHERE kind = 'kernel'").fetchone()
        tied = (total, with_call)
        db.close()
    for f in (truth, rec):
        if os.path.exists(f):
            os.unlink(f)
    return step_ms, tied


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpuscope", default="build-static/gpuscope")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names from VARIANTS")
    args = ap.parse_args()
    names = args.variants.split(",")
    times = {n: [] for n in names}
    ties = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for n in names:
                ms, tied = run(args, n, tmp)
                if ms is not None:
                    times[n].append(ms)
                if tied:
                    ties[n] = tied
                print(f"round {r + 1} {n:32} {ms if ms is None else round(ms, 3)} ms/step"
                      + (f"  kernels tied {tied[1]}/{tied[0]}" if tied else ""), flush=True)
    base = statistics.median(times["baseline"]) if times.get("baseline") else None
    print(f"\ntrain_step.py, {args.steps} steps, {args.rounds} interleaved rounds")
    print(f"  {'variant':32} {'median ms':>10} {'min..max':>16} {'added ms':>9}  kernels tied")
    for n in names:
        if not times[n]:
            print(f"  {n:32} failed")
            continue
        med = statistics.median(times[n])
        added = f"{med - base:9.3f}" if base else ""
        tied = f"{ties[n][1]}/{ties[n][0]}" if n in ties else ""
        print(f"  {n:32} {med:10.3f} {min(times[n]):7.3f}..{max(times[n]):<7.3f} {added}  {tied}")
    print(json.dumps({"steps": args.steps, "times_ms": times, "kernels_tied": ties}))


if __name__ == "__main__":
    main()
