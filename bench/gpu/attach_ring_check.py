#!/usr/bin/env python3
"""`record --pid` of a process started with libgpuscope_launches.so preloaded (its ring in standby,
claimed by gpuscope: no trap per launch), checked against torch.profiler counting the same steps
inside each recording: launches per kernel name equal, every kernel named although every module was
loaded and every function looked up before gpuscope attached, none lost; then the ring claimed a
second time (the first recording gave it back). The probes (a trap per launch) on the same process
are shown beside.

    sudo python3 bench/gpu/attach_ring_check.py --gpuscope build-static/gpuscope \
        --hooks build-static/libgpuscope_launches.so [--workload train_step] [--count-steps 10]

Recordings, in order: probes (--launch-probes both: runtime and driver, as attached processes get
them), in-process, in-process again. In each, the workload runs --count-steps steps under
torch.profiler (ab_workload.py's "count"); the record's launches in those steps' span are compared
with the profiler's by (demangled) name. Prints per recording the totals, the names with equal
counts, the unnamed launches, what was lost, the ring's meta and the names that differ; then
RESULT: PASS (both in-process recordings equal to torch.profiler, claimed, nothing lost from the
ring) or FAIL."""
import argparse
import pathlib
import sqlite3
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from attach_ab import Workload, gpuscope_window  # noqa: E402


def window(args, work, mode, tmp):
    """One recording; inside it, --count-steps steps counted by torch.profiler in the workload
    (its CUPTI and the hooks do not meet: the reference runs beside the recording)."""
    counted = []
    counter = threading.Thread(target=lambda: (time.sleep(args.settle + 0.5), counted.append(work.count(args.count_steps))))
    counter.start()
    _, fig = gpuscope_window(args, work, ["--launch-probes", mode], tmp)  # records tmp/ab.gpuscope
    counter.join()
    t0, t1, theirs = counted[0]
    if not (fig["start_ns"] < t0 and t1 < (fig["end_ns"] or t1 + 1)):
        raise SystemExit(f"attach_ring_check: the counted steps fell outside the recording; make --window longer")
    db = sqlite3.connect(tmp / "ab.gpuscope")
    ours = dict(db.execute(
        "SELECT coalesce(k.demangled, '[unnamed]'), count(*) FROM calls c JOIN functions f ON f.id = c.func "
        "LEFT JOIN kernels k ON k.id = c.kernel_id WHERE c.pid = ? AND c.parent_id IS NULL "
        "AND f.kind = 'launch' AND c.ts_ns BETWEEN ? AND ? GROUP BY 1", (work.proc.pid, t0, t1)).fetchall())
    meta = dict(db.execute("SELECT key, value FROM meta WHERE key LIKE 'launch%'"))
    lost = dict(db.execute("SELECT cause, sum(count) FROM lost WHERE count > 0 GROUP BY 1"))
    db.close()
    return {"ours": ours, "theirs": dict(theirs), "meta": meta, "lost": lost,
            "claimed": meta.get("launch_ring_claimed") == str(work.proc.pid)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpuscope", default="build/gpuscope")
    ap.add_argument("--hooks", required=True, help="libgpuscope_launches.so, preloaded into the workload")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--workload", default="train_step")
    ap.add_argument("--window", type=float, default=6, help="seconds each recording lasts after --settle")
    ap.add_argument("--count-steps", type=int, default=10,
                    help="steps torch.profiler counts inside each recording (the reference)")
    ap.add_argument("--settle", type=float, default=2)
    ap.add_argument("--warmup", type=float, default=5)
    args = ap.parse_args()
    args.launch_probes = None  # each window names its own
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="attach_ring."))
    work = Workload(args.python, args.workload, preload=args.hooks)
    try:
        work.wait_steps(1, 600)
        time.sleep(args.warmup)
        got = {name: window(args, work, mode, tmp)
               for name, mode in (("probes", "both"), ("in-process", "in-process"), ("in-process again", "in-process"))}
    finally:
        work.stop()
    ok = True
    for name, g in got.items():
        ours, theirs = g["ours"], g["theirs"]
        same = sum(1 for k in theirs if ours.get(k) == theirs[k])
        print(f"{name:17} {args.count_steps} steps: launches gpuscope={sum(ours.values())} "
              f"torch.profiler={sum(theirs.values())}; {len(theirs)} kernel names, {same} with equal counts, "
              f"{ours.get('[unnamed]', 0)} unnamed; claimed {g['claimed']}; lost {g['lost'] or 'none'}; meta "
              + ", ".join(f"{k}={v}" for k, v in sorted(g["meta"].items())))
        differ = sorted((k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k)),
                        key=lambda k: -max(ours.get(k, 0), theirs.get(k, 0)))
        for k in differ[:8]:
            print(f"    {ours.get(k, 0):6} vs {theirs.get(k, 0):6}  {k[:100]}")
        if name != "probes":  # the probes name no kernel loaded before they came
            ok &= g["claimed"] and ours == theirs and g["meta"].get("launch_ring_lost") == "0"
    print(f"RESULT: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
