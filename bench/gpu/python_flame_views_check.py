#!/usr/bin/env python3
"""Issue 29, points 3 and 4, on a real PyTorch program: bench/gpu/cnn_steps.py (import torch, a
small CNN, STEPS training steps) under `gpuscope record --gpu-times --cpu-profile 99`.

Point 3, flame graphs of a Python program: for the gpu-time, launches and cpu metrics, in each
--native view (auto, the default; none; all), prints the stacks' frames (mean, largest), how many
frames lie above the first Python frame, and the share of the weight under stacks with a frame
per address ("+0x") or, in auto, an interpreter frame (python3.X, libpython) other than the leaf;
the views must weigh the same. Writes the gpu-time flame graph in the auto and all views to --out
(cnn-gpu-time-auto.html, cnn-gpu-time-all.html).

Point 4, the report's GPU summary: per GPU, the start-up before the first kernel, the span in use,
the busy share over it and over the recording, and the longest idle gap, which must be shorter
than the start-up (import torch is start-up, not a gap).

Prints PASS or FAIL per check.

    python3 bench/gpu/python_flame_views_check.py --gpuscope build-static/gpuscope [--steps 20] [--out DIR]"""
import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
PY_FRAME = re.compile(r" \(.*:\d+\)$")
INTERPRETER = re.compile(r"^(lib)?python3(\.\d+)?")


def folded(gpuscope, rec, metric, view):
    out = subprocess.run([gpuscope, "flamegraph", rec, "--metric", metric, "--native", view, "-o", "-"],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"flamegraph --metric {metric} --native {view}: {out.stderr.strip()}")
    stacks = {}
    for line in out.stdout.splitlines():
        path, value = line.rsplit(" ", 1)
        stacks[tuple(path.split(";"))] = int(value)
    return stacks


def describe(stacks, metric):
    """Weighted figures of one view's stacks (frame [0] is the process)."""
    total = sum(stacks.values()) or 1
    py_weight = hex_weight = interp_weight = above_py = 0
    depths, above = [], []
    for stack, w in stacks.items():
        frames = stack[1:]
        depths.append(len(frames))
        if any("+0x" in f for f in frames):
            hex_weight += w
        # Markers ("[truncated stack]", handoffs) do not count as frames above the Python ones.
        named = [f for f in frames if not f.startswith("[")]
        first = next((i for i, f in enumerate(named) if PY_FRAME.search(f)), None)
        if first is None:
            continue
        py_weight += w
        above.append(first)
        above_py += w * first
        # The interpreter may be the innermost frame (a CPU sample in its own code), nowhere else.
        user = [f for f in frames if not f.endswith("_[k]")]
        if metric != "cpu":
            user = user[:-1]  # the kernel, or the kind of copy
        if any(INTERPRETER.match(f) for f in user[:-1]):
            interp_weight += w
    return {"stacks": len(stacks), "total": sum(stacks.values()),
            "mean_frames": sum(depths) / max(len(depths), 1), "max_frames": max(depths, default=0),
            "python_share": py_weight / total, "hex_share": hex_weight / total,
            "interpreter_share": interp_weight / max(py_weight, 1),
            "mean_above_first_python": above_py / max(py_weight, 1), "max_above_first_python": max(above, default=0)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpuscope", required=True)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default=os.environ.get("OUT", tempfile.gettempdir()))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    ok = True

    def check(name, passed, detail):
        nonlocal ok
        ok &= passed
        print(f"{'PASS' if passed else 'FAIL'} {name}: {detail}")

    with tempfile.TemporaryDirectory() as tmp:
        rec = os.path.join(tmp, "cnn.gpuscope")
        cmd = [args.gpuscope, "record", "--gpu-times", "--cpu-profile", "99", "-o", rec, "--", args.python,
               str(HERE / "cnn_steps.py"), str(args.steps)]
        print("$ " + " ".join(cmd), flush=True)
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        print(run.stdout.strip())
        print("\n".join("  | " + l for l in run.stderr.strip().splitlines()[-8:]))
        if run.returncode != 0:
            raise SystemExit(f"record failed: exit {run.returncode}")

        # Point 3.
        for metric in ("gpu-time", "launches", "cpu"):
            views = {v: folded(args.gpuscope, rec, metric, v) for v in ("auto", "none", "all")}
            figures = {v: describe(s, metric) for v, s in views.items()}
            for v, f in figures.items():
                print(f"{metric:9} {v:4}: {f['stacks']:5} stacks, frames mean {f['mean_frames']:.1f} max "
                      f"{f['max_frames']}; Python stacks {100 * f['python_share']:.1f}% of the weight, frames above "
                      f"their first Python frame mean {f['mean_above_first_python']:.1f} max "
                      f"{f['max_above_first_python']}; weight with a +0x frame {100 * f['hex_share']:.2f}%, "
                      f"Python weight with interpreter frames {100 * f['interpreter_share']:.2f}%")
            totals = {v: f["total"] for v, f in figures.items()}
            check(f"{metric}: every view weighs the same", len(set(totals.values())) == 1, totals)
            check(f"{metric}: no frame per address in any view",
                  all(f["hex_share"] == 0 for f in figures.values()), {v: f["hex_share"] for v, f in figures.items()})
            auto = figures["auto"]
            check(f"{metric}: auto starts at the Python module level, without the interpreter's frames",
                  auto["max_above_first_python"] == 0 and auto["interpreter_share"] == 0,
                  f"above {auto['max_above_first_python']}, interpreter {auto['interpreter_share']:.4f}")
            if metric == "gpu-time":
                heaviest = sorted(views["auto"].items(), key=lambda kv: -kv[1])[:3]
                for stack, w in heaviest:
                    print(f"  {w / 1e3:10.1f} us  " + " ; ".join(stack[1:])[:400])
                for v in ("auto", "all"):
                    page = os.path.join(args.out, f"cnn-gpu-time-{v}.html")
                    subprocess.run([args.gpuscope, "flamegraph", rec, "--metric", metric, "--native", v, "-o", page],
                                   capture_output=True, timeout=600)

        # Point 4.
        doc = json.loads(subprocess.run([args.gpuscope, "report", "--json", rec], capture_output=True, text=True,
                                        timeout=600).stdout)
        text = subprocess.run([args.gpuscope, "report", rec], capture_output=True, text=True, timeout=600).stdout
        section = text[text.find("== GPU time"):]
        print(section[:section.find("\n== ", 5)] if "\n== " in section[5:] else section)
        for g in doc["gpu_time"]["gpus"]:
            gaps = [x["duration_ns"] for x in g["longest_gaps"]]
            print(f"GPU {g['gpu']}: start-up {g['startup_ns'] / 1e9:.2f} s, in use {g['active_span_ns'] / 1e6:.1f} ms "
                  f"({g['first_ns'] / 1e9:.2f} s to {g['last_ns'] / 1e9:.2f} s), busy {g['busy_ns'] / 1e6:.2f} ms = "
                  f"{100 * g['busy_share']:.1f}% of it ({100 * g['busy_share_of_recording']:.2f}% of the recording), "
                  f"longest gap {max(gaps, default=0) / 1e6:.2f} ms, after the last {g['after_last_ns'] / 1e9:.2f} s")
            check(f"GPU {g['gpu']}: import torch is start-up, not an idle gap",
                  g["startup_ns"] > 1e9 and max(gaps, default=0) < g["startup_ns"],
                  f"start-up {g['startup_ns'] / 1e9:.2f} s, longest gap {max(gaps, default=0) / 1e9:.3f} s")
            check(f"GPU {g['gpu']}: busy share over the span in use", g["busy_share"] > g["busy_share_of_recording"],
                  f"{g['busy_share']:.3f} against {g['busy_share_of_recording']:.4f} over the recording")
    print("ALL PASS" if ok else "SOME FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
