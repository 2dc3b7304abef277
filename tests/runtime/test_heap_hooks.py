"""The heap hooks of libgpuscope_launches.so (src/inject/heap_hooks.cpp), preloaded into a command
`gpuscope record` starts: large heap blocks (256 KiB and more) handed over with their stacks and
their freeing, within a rate limit whose excess is counted; the program's allocator and its bytes
left as they were, on several threads, and with the library preloaded but not asked to hand
anything over."""
import json
import os
import re
import subprocess
import time

from conftest import BUILD, TARGETS

CHURN = TARGETS / "heap_churn"


def blocks(rec):
    return dict(rec.query("SELECT op, count(*) FROM host_allocs WHERE op IN ('malloc', 'free') GROUP BY op"))


def unrecorded(rec):
    text = rec.scalar("SELECT value FROM meta WHERE key = 'heap_allocs_unrecorded'") or "0"
    return int(re.match(r"(\d+)", text).group(1))


def test_a_few_blocks_are_each_recorded_with_their_stack_and_their_freeing(record):
    rec = record("--", CHURN, 50, 1 << 20, 1)
    assert rec.returncode == 0, rec.stderr
    assert json.loads(rec.stdout) == {"blocks": 50, "wrong": 0, "failed": 0}
    # 50 blocks of 1 MiB, and the 512 KiB block each realloc round starts from: 60, all freed
    # (a block realloc moved counts as freed there).
    assert blocks(rec) == {"malloc": 60, "free": 60}, blocks(rec)
    assert unrecorded(rec) == 0
    # Each with a copy of the stack that allocated it (advise names the program's function from
    # it: test_advise.py).
    assert rec.scalar("SELECT count(stack_id) FROM host_allocs WHERE op = 'malloc'") == 60


def test_a_flood_of_blocks_is_limited_and_counted(record):
    t0 = time.monotonic()
    rec = record("--", CHURN, 20000, 1 << 20, 1)
    elapsed = time.monotonic() - t0
    assert rec.returncode == 0, rec.stderr
    assert json.loads(rec.stdout)["wrong"] == 0
    b = blocks(rec)
    # 1,000 a second after a burst of as many; the rest counted, none lost between the two.
    assert b["malloc"] <= 1000 + 1000 * elapsed + 50, (b, elapsed)
    assert b["malloc"] + unrecorded(rec) == 20000 + 4000, (b, unrecorded(rec))
    assert b["free"] == b["malloc"], b


def test_threads_keep_their_bytes_and_every_block_handed_over_is_freed(record):
    rec = record("--", CHURN, 400, 1 << 20, 8)
    assert rec.returncode == 0, rec.stderr
    assert json.loads(rec.stdout) == {"blocks": 3200, "wrong": 0, "failed": 0}
    b = blocks(rec)
    assert b["free"] == b["malloc"] and b["malloc"] + unrecorded(rec) == 3200 + 640, (b, unrecorded(rec))


def test_preloaded_without_gpuscope_the_hooks_pass_calls_on():
    env = dict(os.environ, LD_PRELOAD=str(BUILD / "libgpuscope_launches.so"))
    env.pop("GPUSCOPE_HEAP_ALLOC_MIN", None)
    run = subprocess.run([str(CHURN), "2000", str(1 << 20), "4"], capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == {"blocks": 8000, "wrong": 0, "failed": 0}
