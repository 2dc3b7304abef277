"""NCCL's API (issue 34) against the real libnccl.so.2 of the CUDA toolkit: every call recorded
once (NCCL exports each function twice at one address), with its communicator, elements, type,
bytes, reduction, root or peer and stream, and a communicator's rank, ranks and the identity its
ranks share (a hash of the ncclUniqueId). Without a GPU the calls fail, with NCCL's own results.
Collectives, sends, receives and groups are probed at entry only (one trap a call): their results
are not recorded; communicators' making and ending are, at their return."""
import json

from conftest import TARGETS, folded

NCCL_CALLS = TARGETS / "nccl_calls"


def fnv1a(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h or 1


def test_each_nccl_call_once_with_its_arguments(record, gpuscope):
    rec = record("--", NCCL_CALLS)
    assert rec.returncode == 0, rec.stderr
    program = json.loads(rec.stdout)
    assert "NCCL functions" in rec.stderr, rec.stderr  # libnccl.so.2 probed for its API
    rows = rec.query(
        "SELECT f.name, f.api, f.kind, c.ret, c.bytes, c.stream, c.src, c.ptr, n.comm, n.count, n.datatype, n.op, "
        "n.peer, n.rank, n.nranks, n.comm_id, n.color, n.split_key, c.stack_id IS NOT NULL "
        "FROM calls c JOIN functions f ON f.id = c.func LEFT JOIN nccl_calls n ON n.call_id = c.id "
        "WHERE f.api = 'nccl' ORDER BY c.ts_ns")
    names = [r[0] for r in rows]
    assert names == ["ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommSplit", "ncclAllReduce",
                     "ncclReduceScatter", "ncclAllGather", "ncclAlltoAll", "ncclBroadcast", "ncclReduce",
                     "ncclGroupStart", "ncclSend", "ncclRecv", "ncclGroupEnd", "ncclCommDestroy"], names
    # NCCL's own results, as the program saw them, where the return is probed; none where not.
    returned = ("ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommSplit", "ncclCommDestroy")
    assert [r[3] for r in rows] == [res if name in returned else None
                                    for name, res in zip(names, program["results"])], rows
    # Entry only: no return probe gave any of them a duration.
    durations = dict(rec.query("SELECT f.name, count(c.duration_ns) FROM calls c JOIN functions f ON f.id = c.func "
                               "WHERE f.api = 'nccl' GROUP BY f.name"))
    assert {n: d for n, d in durations.items() if d} == {n: 1 for n in returned}, durations
    by = {r[0]: r for r in rows}
    # Every rank of a communicator was given the same ncclUniqueId (bytes 1, 2, 3, ... here): its
    # identity is a hash of the id's first 32 bytes (the bootstrap's magic and address).
    comm_id = f"{fnv1a(bytes(range(1, 33))):016x}"
    assert by["ncclCommInitRank"][13:16] == (2, 4, comm_id), by["ncclCommInitRank"]
    assert by["ncclCommInitRankConfig"][13:16] == (3, 8, comm_id), by["ncclCommInitRankConfig"]
    assert by["ncclCommSplit"][16:18] == (5, 7), by["ncclCommSplit"]
    stream, send, recv = 0x30, 0x100000, 0x200000
    # (bytes, stream, send, recv, count, datatype, op, root or peer)
    expected = {
        "ncclAllReduce": (4096, stream, send, recv, 1024, "float32", "sum", None),
        "ncclReduceScatter": (1024, stream, send, recv, 512, "bfloat16", "avg", None),
        "ncclAllGather": (512, stream, send, recv, 256, "float16", None, None),
        "ncclAlltoAll": (1024, stream, send, recv, 128, "int64", None, None),
        "ncclBroadcast": (64, stream, send, recv, 64, "uint8", None, 3),
        "ncclReduce": (256, stream, send, recv, 32, "float64", "max", 2),
        "ncclSend": (400, stream, send, send, 100, "int32", None, 1),
        "ncclRecv": (800, stream, recv, recv, 200, "int32", None, 3),
    }
    for name, want in expected.items():
        r = by[name]
        assert (r[4], r[5], r[6], r[7], r[9], r[10], r[11], r[12]) == want, (name, r)
        assert r[1:3] == ("nccl", "p2p" if name in ("ncclSend", "ncclRecv") else "collective"), r
        assert r[8] is None and r[18], r  # a null communicator; the call's stack
    # The send and the receive belong to their group (its ncclGroupStart's row), as do its start
    # and end; nothing else does.
    start = rec.scalar("SELECT c.id FROM calls c JOIN functions f ON f.id = c.func WHERE f.name = 'ncclGroupStart'")
    grouped = dict(rec.query("SELECT f.name, n.group_id FROM nccl_calls n JOIN calls c ON c.id = n.call_id "
                             "JOIN functions f ON f.id = c.func WHERE n.group_id IS NOT NULL"))
    assert grouped == {"ncclGroupStart": start, "ncclSend": start, "ncclRecv": start, "ncclGroupEnd": start}, grouped
    # Bytes by stack (flamegraph --metric nccl-bytes): each collective's and send's bytes under the
    # stack that called it, the leaf the function.
    leaves = {}
    for path, value in folded(gpuscope, rec, "nccl-bytes").items():
        assert "main" in path, path
        leaves[path[-1]] = leaves.get(path[-1], 0) + value
    assert leaves == {name: want[0] for name, want in expected.items()}
    # The timeline: a track per communicator of the process, a slice per collective and send.
    trace = str(rec.path) + ".trace.json"
    out = gpuscope("timeline", rec.path, "-o", trace)
    assert out.returncode == 0, out.stderr
    events = json.load(open(trace))["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"
              and e["args"]["name"].startswith("NCCL communicator")}
    assert list(tracks.values()) == ["NCCL communicator 0x0"], tracks
    slices = [e for e in events if e.get("cat") == "nccl"]
    assert [e["name"] for e in slices] == [n for n in names if n in expected], slices
    for e in slices:
        assert e["tid"] in tracks and e["args"]["bytes"] == expected[e["name"]][0], e
        assert "error" not in e["args"] and "enqueue_us" not in e["args"], e
    # The report counts them apart from CUDA's calls.
    out = gpuscope("report", rec.path)
    assert out.returncode == 0 and "NCCL" in out.stdout, out.stdout


def test_the_agent_counts_each_collective_by_communicator_and_rank(agent):
    """The agent's NCCL series (shaped like the NCCL Inspector's): each collective and send/receive
    counted once, by communicator, rank and collective, with its bytes (every call here fails, without
    a GPU: probed at entry only, that is not seen)."""
    from agent_util import series
    import subprocess
    a = agent("budget: 1\ngpu_sample_hz: 0\n")
    run = subprocess.run([str(NCCL_CALLS)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    collectives = {"AllReduce": 4096, "ReduceScatter": 1024, "AllGather": 512, "AlltoAll": 1024, "Broadcast": 64,
                   "Reduce": 256, "Send": 400, "Recv": 800}

    def count(m, name, c):
        return series(m, name, comm="nccl_calls", collective=c)

    def seen(m):
        return sum(sum(count(m, "gpuscope_nccl_calls_total", c)) for c in collectives)
    m = a.wait_for(lambda m: seen(m) == len(collectives), what="nccl_calls's collectives")
    for c, nbytes in collectives.items():
        # One series each, labelled with its communicator, rank and ranks (unknown here: no
        # communicator was made without a GPU).
        assert count(m, "gpuscope_nccl_calls_total", c) == [1.0], c
        assert count(m, "gpuscope_nccl_bytes_total", c) == [float(nbytes)], c
