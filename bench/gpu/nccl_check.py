#!/usr/bin/env python3
"""NCCL's calls as gpuscope records them against what a torch.distributed job issued (issues 34,
36): one process per GPU (torchrun), all-reduce, all-gather, reduce-scatter and send/recv at sizes
from 8 KB to 256 MB, each rank logging its own calls; then every rank's record compared with its
log: each logged call present once, in order, with its function, elements and type; the
communicators' ranks and sizes, and one identity for a communicator across its ranks.

    sudo gpuscope record [--gpu-times] -o nccl.gpuscope -- torchrun --standalone --nproc_per_node 2 \\
        bench/gpu/nccl_check.py worker DIR
    python3 bench/gpu/nccl_check.py compare nccl.gpuscope DIR
    # the collectives' GPU times against torch.profiler's, in a run of their own:
    torchrun --standalone --nproc_per_node 2 bench/gpu/nccl_check.py worker REFDIR 3 profile
    python3 bench/gpu/nccl_check.py compare nccl.gpuscope DIR --reference REFDIR --gpuscope build/gpuscope

Prints per rank the calls logged and recorded, those missing or differing, the calls NCCL made that
the log does not list (PyTorch's own: a barrier, a communicator's set-up), and RESULT: PASS or FAIL."""
import argparse
import json
import os
import pathlib
import sqlite3
import subprocess
import sys

SIZES = [8 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]


def worker(args):
    import contextlib
    import tempfile
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    log = []
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) if args.profile else contextlib.nullcontext()
    with prof:
        calls(args, torch, dist, rank, world, log)
    kernel_us = []
    if args.profile:
        trace = os.path.join(tempfile.mkdtemp(), "trace.json")
        prof.export_chrome_trace(trace)
        with open(trace) as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel" and "nccl" in e["name"].lower()]
        kernel_us = [e["dur"] for e in sorted(events, key=lambda e: e["ts"])]
    dist.destroy_process_group()
    out = pathlib.Path(args.log) / f"rank{rank}.json"
    out.write_text(json.dumps({"pid": os.getpid(), "rank": rank, "world": world, "calls": log, "kernel_us": kernel_us}))


def calls(args, torch, dist, rank, world, log):
    for size in SIZES:
        n = size // 4  # float32 elements
        x = torch.ones(n, device="cuda")
        gathered = torch.empty(n * world, device="cuda")
        scattered = torch.empty(n // world, device="cuda")
        for _ in range(args.repeat):
            dist.all_reduce(x)
            log.append(["ncclAllReduce", n, "float32"])
            dist.all_gather_into_tensor(gathered, x)
            log.append(["ncclAllGather", n, "float32"])
            dist.reduce_scatter_tensor(scattered, x)
            log.append(["ncclReduceScatter", n // world, "float32"])
            if world >= 2 and rank < 2:
                if rank == 0:
                    dist.send(x, 1)
                    log.append(["ncclSend", n, "float32"])
                else:
                    dist.recv(x, 0)
                    log.append(["ncclRecv", n, "float32"])
    torch.cuda.synchronize()


def compare(args):
    db = sqlite3.connect(args.record)
    ok = True
    ids = {}  # rank -> comm_ids of its communicators
    for path in sorted(pathlib.Path(args.log).glob("rank*.json")):
        mine = json.loads(path.read_text())
        pid, rank, world = mine["pid"], mine["rank"], mine["world"]
        rows = db.execute(
            "SELECT f.name, n.count, n.datatype, n.comm, c.ret FROM calls c JOIN functions f ON f.id = c.func "
            "JOIN nccl_calls n ON n.call_id = c.id WHERE c.pid = ? AND f.kind IN ('collective', 'p2p') "
            "ORDER BY c.ts_ns, c.id", (pid,)).fetchall()
        inits = db.execute(
            "SELECT f.name, n.rank, n.nranks, n.comm_id, n.comm, c.ret FROM calls c JOIN functions f ON f.id = c.func "
            "JOIN nccl_calls n ON n.call_id = c.id WHERE c.pid = ? AND f.kind = 'comm_init' ORDER BY c.ts_ns",
            (pid,)).fetchall()
        # The logged calls, in order, as a subsequence of the recorded ones.
        i, extra = 0, []
        for name, count, dtype, comm, ret in rows:
            want = mine["calls"][i] if i < len(mine["calls"]) else None
            if want and [name, count, dtype] == want:
                i += 1
            else:
                extra.append((name, count, dtype))
        found = i == len(mine["calls"])
        ok &= found and len(rows) > 0
        print(f"rank {rank} (PID {pid}): {len(mine['calls'])} calls logged, {len(rows)} recorded, "
              f"{i} of the logged found in order{'' if found else ' (next missing: ' + str(mine['calls'][i]) + ')'}; "
              f"{len(extra)} more: {sorted(set(extra))[:6]}")
        ok &= all(r[4] in (0, None) for r in rows)  # None: probed at entry only, no result
        for name, r, n, comm_id, comm, ret in inits:
            print(f"  {name}: rank {r} of {n}, id {comm_id}, comm {comm and hex(comm)}, result {ret}")
        world_inits = [x for x in inits if x[2] == world]
        ok &= bool(world_inits) and all(x[1] == rank and x[5] in (0, 7) for x in world_inits)
        ids[rank] = {x[3] for x in world_inits}
    common = set.intersection(*ids.values()) if ids else set()
    print(f"communicators of all {len(ids)} ranks with one identity: {sorted(common)}")
    ok &= bool(common)
    if args.reference:
        ok &= compare_times(args)
    print(f"RESULT: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def call_gpu_us(db, pid):
    """Each collective or send of process `pid`, in order: the GPU time of NCCL's kernels launched
    from its thread after its entry (or its group's ncclGroupEnd's) and before its return where
    that was probed, else before the thread's next NCCL call; first start to last end, µs. (As
    src/report/nccl_collectives.cpp ties them.)"""
    entries = {}
    for tid, ts in db.execute("SELECT c.tid, c.ts_ns FROM calls c JOIN functions f ON f.id = c.func "
                              "WHERE c.pid = ? AND f.api = 'nccl' ORDER BY c.ts_ns", (pid,)):
        entries.setdefault(tid, []).append(ts)

    def span(tid, t0, duration):
        if duration is not None:
            return t0, t0 + duration
        later = [t for t in entries.get(tid, []) if t > t0]
        return t0, (later[0] - 1 if later else 2**62)
    rows = db.execute(
        "SELECT c.tid, c.ts_ns, c.duration_ns, n.group_id FROM calls c "
        "JOIN functions f ON f.id = c.func JOIN nccl_calls n ON n.call_id = c.id "
        "WHERE c.pid = ? AND f.kind IN ('collective', 'p2p') ORDER BY c.ts_ns, c.id", (pid,)).fetchall()
    ends = {(tid, g): span(tid, t0, d) for tid, g, t0, d in db.execute(
        "SELECT c.tid, n.group_id, c.ts_ns, c.duration_ns FROM calls c "
        "JOIN functions f ON f.id = c.func JOIN nccl_calls n ON n.call_id = c.id "
        "WHERE c.pid = ? AND f.name = 'ncclGroupEnd' AND n.group_id IS NOT NULL", (pid,))}
    out = []
    for tid, t0, duration, group in rows:
        t0, t1 = span(tid, t0, duration)
        if group is not None:
            t0, t1 = ends.get((tid, group), (t0, t1))
        first = db.execute(
            "SELECT min(a.start_ns), max(a.end_ns) FROM gpu_activities a JOIN calls l ON l.id = a.call_id "
            "LEFT JOIN kernels k ON k.id = l.kernel_id WHERE a.kind = 'kernel' AND l.tid = ? AND l.ts_ns BETWEEN ? AND ? "
            "AND (k.name IS NULL OR k.name LIKE 'nccl%' OR k.demangled LIKE 'nccl%')", (tid, t0, t1)).fetchone()
        out.append((first[1] - first[0]) / 1e3 if first[0] is not None else None)
    return out


def collective_times(per_rank):
    """Per (function, size): the mean over a collective's instances of its time, each instance's
    being the shortest of its ranks' kernels. A kernel waits for the ranks that arrive after its
    own: the last rank to arrive waits for none, and its kernel is the collective's transfer.
    `per_rank`: rank -> (its logged calls, their GPU µs in order)."""
    ranks = list(per_rank.values())
    n = min(len(calls) for calls, _ in ranks)
    sums = {}
    for i in range(n):
        name, count, _ = ranks[0][0][i]
        if name in ("ncclSend", "ncclRecv"):
            name = "ncclSend/Recv"
        times = [us[i] for _, us in ranks if us[i] is not None]
        if len(times) == len(ranks):
            sums.setdefault((name, count * 4), []).append(min(times))
    return {k: sum(v) / len(v) for k, v in sums.items()}


def compare_times(args):
    """The collectives' times from gpuscope's record (--gpu-times) against torch.profiler's NCCL
    kernels in a run of its own (--reference: its worker logs), per function and size, each
    collective timed by its last-arriving rank's kernel (collective_times)."""
    db = sqlite3.connect(args.record)
    ours = {}
    for path in pathlib.Path(args.log).glob("rank*.json"):
        mine = json.loads(path.read_text())
        ours[mine["rank"]] = (mine["calls"], call_gpu_us(db, mine["pid"]))
    theirs = {}
    for path in pathlib.Path(args.reference).glob("rank*.json"):
        ref = json.loads(path.read_text())
        if len(ref["kernel_us"]) != len(ref["calls"]):
            print(f"rank {ref['rank']}: {len(ref['kernel_us'])} NCCL kernels for {len(ref['calls'])} calls: not paired")
            return False
        theirs[ref["rank"]] = (ref["calls"], ref["kernel_us"])
    mine, ref = collective_times(ours), collective_times(theirs)
    world = len(ours)
    ok, big = True, 0
    print(f"{'function':18} {'size':>10} {'gpuscope µs':>12} {'torch.profiler µs':>18} {'diff':>7} {'busbw GB/s':>10}")
    for key in sorted(set(mine) & set(ref)):
        diff = (mine[key] - ref[key]) / ref[key]
        name, size = key
        factor = {"ncclAllReduce": 2 * (world - 1) / world}.get(name, (world - 1) / world if name in (
            "ncclAllGather", "ncclReduceScatter") else 1)
        algbytes = size * world if name in ("ncclAllGather", "ncclReduceScatter") else size
        print(f"{name:18} {size:>10} {mine[key]:12.1f} {ref[key]:18.1f} {diff:+7.1%} {algbytes / mine[key] / 1e3 * factor:10.1f}")
        if size >= 16 << 20:  # large messages: times a separate run repeats
            big += 1
            ok &= abs(diff) <= 0.05
    missing = sorted(set(ref) - set(mine))
    print(f"timed: {len(mine)} (function, size) by gpuscope, {len(ref)} by torch.profiler; missing: {missing[:6]}; "
          f"{big} of 16 MB and more compared (aim: within 5%)")
    return ok and not missing and big > 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    w = sub.add_parser("worker")
    w.add_argument("log", help="where each rank writes its log (a positional: torchrun takes options as its own)")
    w.add_argument("repeat", type=int, nargs="?", default=3)
    w.add_argument("profile", nargs="?", default="", help="'profile': under torch.profiler (the reference run)")
    c = sub.add_parser("compare")
    c.add_argument("record")
    c.add_argument("log")
    c.add_argument("--reference", help="the logs of a run of the worker with 'profile'")
    c.add_argument("--gpuscope", default="build/gpuscope")
    args = ap.parse_args()
    return worker(args) if args.mode == "worker" else compare(args)


if __name__ == "__main__":
    sys.exit(main())
