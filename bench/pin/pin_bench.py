#!/usr/bin/env python3
"""The pinning library against pageable memory and cudaMallocHost for everything (issue 35).

Runs build/bench/pin_bench in turns, ROUNDS times each kind:
  pageable     malloc
  mallochost   cudaMallocHost for every buffer
  online       malloc under libgpuscope_pin.so (GPUSCOPE_PIN_MODE=online, the default)
  all          malloc under libgpuscope_pin.so pinning every buffer (GPUSCOPE_PIN_MODE=all)
and prints, per size, reuse, direction and sync/async, the median trial time (allocation,
registration and copies, then free) of each, the better of pageable and mallochost, online's
ratio to it (aim: within 5%), the spread (min-max over the trials) and the bytes found wrong.
Then build/bench/pin_hazards under the library, strict and relaxed.

  bench/pin/pin_bench.py [--build build] [--rounds 3] [--trials 3] [--max-mib 1024] [--json OUT]
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
    if kind in ("online", "all"):
        env["LD_PRELOAD"] = os.path.join(build, "libgpuscope_pin.so")
        env["GPUSCOPE_PIN_MODE"] = kind
        env["GPUSCOPE_PIN_REPORT"] = os.path.join(report_dir, kind)
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
    args = ap.parse_args()
    kinds = ["pageable", "mallochost", "online", "all"]
    samples = {}  # (kind, bytes, reuse, dir, async) -> [ms]
    wrong = {k: 0 for k in kinds}
    totals = {k: [] for k in kinds}
    lib = {k: [] for k in kinds}
    report_dir = tempfile.mkdtemp(prefix="pin-bench-")
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
    print(f"{'bytes':>11} {'reuse':>5} {'dir':>4} {'mode':>5} | {'pageable':>9} {'mallochost':>10} "
          f"{'online':>9} {'all':>9} | {'online/best':>11} {'spread':>15}")
    met, table = 0, []
    for c in configs:
        med = {k: statistics.median(samples[(k,) + c]) for k in kinds if (k,) + c in samples}
        best = min(med["pageable"], med["mallochost"])
        ratio = med["online"] / best
        met += ratio <= 1.05
        on = samples[("online",) + c]
        spread = f"{min(on):.3f}-{max(on):.3f}"
        size, reuse, d, a = c
        print(f"{size:>11} {reuse:>5} {d:>4} {'async' if a else 'sync':>5} | {med['pageable']:>9.3f} "
              f"{med['mallochost']:>10.3f} {med['online']:>9.3f} {med['all']:>9.3f} | {ratio:>11.3f} {spread:>15}")
        table.append({"bytes": size, "reuse": reuse, "dir": d, "async": a, **{k: med[k] for k in med},
                      "online_over_best": ratio, "online_min": min(on), "online_max": max(on)})
    print(f"online within 5% of the better of pageable and mallochost: {met}/{len(configs)} configurations")
    worst = sorted(table, key=lambda t: -t["online_over_best"])[:5]
    print("worst: " + "; ".join(f"{t['bytes']} B x{t['reuse']} {t['dir']} {'async' if t['async'] else 'sync'} "
                                f"{t['online_over_best']:.2f}" for t in worst))
    print("bytes wrong: " + ", ".join(f"{k} {wrong[k]}" for k in kinds))
    for k in kinds:
        if totals[k]:
            print(f"{k:>10}: wall {statistics.median(t['total_wall_ms'] for t in totals[k]) / 1e3:.1f} s, "
                  f"CPU {statistics.median(t['total_cpu_ms'] for t in totals[k]) / 1e3:.1f} s (median of runs)")
    for k in ("online", "all"):
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
