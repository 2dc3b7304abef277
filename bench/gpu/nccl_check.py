#!/usr/bin/env python3
"""NCCL's calls as gpuscope records them against what a torch.distributed job issued (issues 34,
36): one process per GPU (torchrun), all-reduce, all-gather, reduce-scatter and send/recv at sizes
from 8 KB to 256 MB, each rank logging its own calls; then every rank's record compared with its
log: each logged call present once, in order, with its function, elements and type; the
communicators' ranks and sizes, and one identity for a communicator across its ranks.

    sudo gpuscope record -o nccl.gpuscope -- torchrun --standalone --nproc_per_node 2 \\
        bench/gpu/nccl_check.py worker DIR
    python3 bench/gpu/nccl_check.py compare nccl.gpuscope DIR

Prints per rank the calls logged and recorded, those missing or differing, the calls NCCL made that
the log does not list (PyTorch's own: a barrier, a communicator's set-up), and RESULT: PASS or FAIL."""
import argparse
import json
import os
import pathlib
import sqlite3
import sys

SIZES = [8 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]


def worker(args):
    import torch
    import torch.distributed as dist
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    log = []
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
    dist.destroy_process_group()
    out = pathlib.Path(args.log) / f"rank{rank}.json"
    out.write_text(json.dumps({"pid": os.getpid(), "rank": rank, "world": world, "calls": log}))


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
        ok &= all(r[4] == 0 for r in rows)
        for name, r, n, comm_id, comm, ret in inits:
            print(f"  {name}: rank {r} of {n}, id {comm_id}, comm {comm and hex(comm)}, result {ret}")
        world_inits = [x for x in inits if x[2] == world]
        ok &= bool(world_inits) and all(x[1] == rank and x[5] in (0, 7) for x in world_inits)
        ids[rank] = {x[3] for x in world_inits}
    common = set.intersection(*ids.values()) if ids else set()
    print(f"communicators of all {len(ids)} ranks with one identity: {sorted(common)}")
    ok &= bool(common)
    print(f"RESULT: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    w = sub.add_parser("worker")
    w.add_argument("log", help="where each rank writes its log (a positional: torchrun takes options as its own)")
    w.add_argument("repeat", type=int, nargs="?", default=3)
    c = sub.add_parser("compare")
    c.add_argument("record")
    c.add_argument("log")
    args = ap.parse_args()
    return worker(args) if args.mode == "worker" else compare(args)


if __name__ == "__main__":
    sys.exit(main())
