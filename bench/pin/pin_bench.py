#!/usr/bin/env python3
"""The pinning library against pageable memory and cudaMallocHost for everything (issue 35).

Runs build/bench/pin_bench in turns, ROUNDS times each kind:
  pageable     malloc
  mallochost   cudaMallocHost for every buffer
  online       malloc under libgpuscope_pin.so (GPUSCOPE_PIN_MODE=online, the default)
  use          the same, starting from the profile of one earlier online run (GPUSCOPE_PIN_USE)
  online64k    online, serving buffers from 64 KiB (GPUSCOPE_PIN_MIN_BYTES; the default is 256 KiB)
  all          malloc under libgpuscope_pin.so pinning every buffer (GPUSCOPE_PIN_MODE=all)
and prints, per size, reuse, direction and sync/async, the median trial time (allocation,
registration and copies, then free) of each, the better of pageable and mallochost, online's
ratio to it (aim: within 5%), the spread (min-max over the trials) and the bytes found wrong.
Then build/bench/pin_hazards under the library, strict and relaxed.

  bench/pin/pin_bench.py [--build build] [--rounds 3] [--trials 3] [--max-mib 1024] [--json OUT]
                         [--kinds pageable,mallochost,online,use,all]
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run_kind(build, kind, trials, max_mib, report_dir):
    env = dict(os.environ)
    alloc = "mallochost" if kind == "mallochost" else "malloc"
    if kind not in ("pageable", "mallochost"):
        env["LD_PRELOAD"] = os.path.join(build, "libgpuscope_pin.so")
        env["GPUSCOPE_PIN_MODE"] = "all" if kind == "all" else "online"
        env["GPUSCOPE_PIN_REPORT"] = os.path.join(report_dir, kind)
        if kind == "online64k":
            env["GPUSCOPE_PIN_MIN_BYTES"] = "64K"
        if kind == "use":
            env["GPUSCOPE_PIN_USE"] = os.path.join(report_dir, "profile")
        if kind == "profile":
            env["GPUSCOPE_PIN_PROFILE"] = os.path.join(report_dir, "profile")
    cmd = [os.path.join(build, "bench", "pin_bench"), "--alloc", alloc, "--trials", str(trials), "--max-mib",
           str(max_mib)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"pin_bench ({kind}) failed: {out.stderr.strip()}")
    rows = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    return rows


def reports(report_dir, kind):
    out = []
    for path in glob.glob(os.path.join(report_dir, kind + ".*.json")):
        with open(path) as f:
            out.append(json.load(f))
        os.unlink(path)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--max-mib", type=int, default=1024)
    ap.add_argument("--json")
    ap.add_argument("--kinds", default="pageable,mallochost,online,use,all")
    args = ap.parse_args()
    kinds = args.kinds.split(",")
    report_dir = tempfile.mkdtemp(prefix="pin-bench-")
    if "use" in kinds:  # one online run writes the profile the "use" runs start from
        run_kind(args.build, "profile", args.trials, args.max_mib, report_dir)
        reports(report_dir, "profile")
    samples = {}  # (kind, bytes, reuse, dir, async) -> [ms]
    wrong = {k: 0 for k in kinds}
    totals = {k: [] for k in kinds}
    lib = {k: [] for k in kinds}
    for r in range(args.rounds):
        order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]  # interleaved, each kind first once
        for kind in order:
            for row in run_kind(args.build, kind, args.trials, args.max_mib, report_dir):
                if "total_wall_ms" in row:
                    totals[kind].append(row)
                    continue
                key = (kind, row["bytes"], row["reuse"], row["dir"], row["async"])
                samples.setdefault(key, []).append(row["ms"])
                wrong[kind] += row["wrong"]
            lib[kind] += reports(report_dir, kind)
    configs = sorted({k[1:] for k in samples})
    libs = [k for k in kinds if k not in ("pageable", "mallochost")]
    print(f"{'bytes':>11} {'reuse':>5} {'dir':>4} {'mode':>5} | " + " ".join(f"{k:>10}" for k in kinds) + " | " +
          " ".join(f"{k + '/best':>14}" for k in libs))
    met, table = {k: 0 for k in libs}, []
    for c in configs:
        med = {k: statistics.median(samples[(k,) + c]) for k in kinds if (k,) + c in samples}
        best = min(med["pageable"], med["mallochost"])
        ratios = {k: med[k] / best for k in libs}
        for k in libs:
            met[k] += ratios[k] <= 1.05
        size, reuse, d, a = c
        print(f"{size:>11} {reuse:>5} {d:>4} {'async' if a else 'sync':>5} | " +
              " ".join(f"{med[k]:>10.3f}" for k in kinds) + " | " + " ".join(f"{ratios[k]:>14.3f}" for k in libs))
        row = {"bytes": size, "reuse": reuse, "dir": d, "async": a, **med}
        for k in libs:
            on = samples[(k,) + c]
            row.update({f"{k}_over_best": ratios[k], f"{k}_min": min(on), f"{k}_max": max(on)})
        table.append(row)
    for k in libs:
        print(f"{k} within 5% of the better of pageable and mallochost: {met[k]}/{len(configs)} configurations")
        worst = sorted(table, key=lambda t: -t[f"{k}_over_best"])[:5]
        print(f"  worst: " + "; ".join(f"{t['bytes']} B x{t['reuse']} {t['dir']} {'async' if t['async'] else 'sync'} "
                                       f"{t[k + '_over_best']:.2f} ({t[k + '_min']:.3f}-{t[k + '_max']:.3f} ms)"
                                       for t in worst))
    print("bytes wrong: " + ", ".join(f"{k} {wrong[k]}" for k in kinds))
    for k in kinds:
        if totals[k]:
            print(f"{k:>10}: wall {statistics.median(t['total_wall_ms'] for t in totals[k]) / 1e3:.1f} s, "
                  f"CPU {statistics.median(t['total_cpu_ms'] for t in totals[k]) / 1e3:.1f} s (median of runs)")
    for k in libs:
        main_reports = [x for x in lib[k] if not x.get("child")]
        if main_reports:
            x = main_reports[-1]
            print(f"{k:>10} library: peak pinned {x['peak_pinned_bytes'] / 2**20:.0f} MiB, registrations "
                  f"{x['registrations']} ({x['register_ms']:.0f} ms), pool hits {x['pool_hits']}, fresh pins "
                  f"{x['fresh_pins']}, copies pinned {x['pinned_copies']} / pageable {x['pageable_copies']}, "
                  f"waits {x['waits']}")
    hz_env = dict(os.environ, LD_PRELOAD=os.path.join(args.build, "libgpuscope_pin.so"))
    for relaxed in ("0", "1"):
        hz_env["GPUSCOPE_PIN_RELAXED"] = relaxed
        out = subprocess.run([os.path.join(args.build, "bench", "pin_hazards")], env=hz_env, capture_output=True,
                             text=True)
        print(f"hazards, {'relaxed' if relaxed == '1' else 'strict'}:")
        print("  " + "\n  ".join((out.stdout + out.stderr).strip().splitlines()))
    out = subprocess.run([os.path.join(args.build, "bench", "pin_hazards")], capture_output=True, text=True)
    print("hazards, without the library: " + " ".join(l.split(":", 1)[0].split()[-1] + ":" + l.split(":", 1)[1].strip()
                                                       for l in out.stdout.splitlines() if l.startswith("hazard ")))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"table": table, "wrong": wrong, "totals": totals, "library": lib}, f, indent=1)


if __name__ == "__main__":
    main()
