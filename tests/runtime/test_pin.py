"""`gpuscope pin` and libgpuscope_pin.so (issue 35) in front of real programs.

Without a GPU the real CUDA programs' calls fail: the library must leave them running as they
would without it. Its bookkeeping (what it registers, when it unregisters, what a forked child
does) is checked against the stand-in driver (tests/targets/fake_cuda.c), which keeps the
registered ranges as the real driver does; bench/pin/pin_hazards.cu checks the same hazards with
the bytes that reach a real GPU."""
import json
import os
import subprocess
import sys

import pytest

from conftest import BUILD, GPUSCOPE, TARGETS

FAKE_CUDA = TARGETS / "fake-cuda"


def pin(*args, env=None, timeout=120):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([str(GPUSCOPE), "pin", *map(str, args)], capture_output=True, text=True, env=e,
                          timeout=timeout)


def checks(stdout):
    """{check name: "ok" or "WRONG ..."} from pin_bookkeeping's output."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith("check "):
            name, verdict = line[len("check "):].split(": ", 1)
            out[name] = verdict
    return out


def test_bookkeeping_against_the_standin_driver(tmp_path):
    report = tmp_path / "pin.json"
    out = pin("--report", report, "--", TARGETS / "pin_bookkeeping", env={"LD_LIBRARY_PATH": str(FAKE_CUDA)})
    assert out.returncode == 0, out.stdout + out.stderr
    got = checks(out.stdout)
    assert set(got) == {"pinned", "madvise", "realloc", "free_reuse", "contents", "async_waits", "own_register",
                        "fork", "unpinned_free", "never_given_back"}
    assert all(v == "ok" for v in got.values()), got
    doc = json.loads(report.read_text())
    main = [p for p in doc["processes"] if not p["child"]]
    assert len(main) == 1, doc
    p = main[0]
    # Pinned on its copies, re-pinned after madvise, reused from the pool by the batches' line.
    assert p["registrations"] >= 2 and p["pool_hits"] >= 30 and p["pinned_copies"] > p["pageable_copies"], p
    assert p["waits"] == 1 and p["register_failures"] == 0, p
    assert "buffers pinned" in out.stderr and "allocations given a pinned buffer from the pool" in out.stderr


def test_a_profile_lets_the_next_run_pin_from_the_first_allocation(tmp_path):
    env = {"LD_LIBRARY_PATH": str(FAKE_CUDA)}
    profile, first, second = tmp_path / "sites", tmp_path / "first.json", tmp_path / "second.json"
    out = pin("--profile", profile, "--report", first, "--", TARGETS / "pin_bookkeeping", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = profile.read_text().splitlines()
    assert lines[0].startswith("# gpuscope pin profile 1")
    sites = [l.split() for l in lines[1:]]
    # The batches' line: 41 buffers, all copied.
    assert any(int(f) >= 40 and int(c) == int(f) for _, f, c, _ in sites), lines
    out = pin("--use", profile, "--report", second, "--", TARGETS / "pin_bookkeeping", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert all(v == "ok" for v in checks(out.stdout).values())
    before = json.loads(first.read_text())["processes"][0]
    after = json.loads(second.read_text())["processes"][0]
    assert after["pageable_copies"] < before["pageable_copies"], (before, after)


def test_the_checks_fail_where_the_library_would_be_wrong():
    # Relaxed: the asynchronous copy of a pinned buffer no longer waits (the check sees it).
    out = pin("--relaxed", "--", TARGETS / "pin_bookkeeping", env={"LD_LIBRARY_PATH": str(FAKE_CUDA)})
    got = checks(out.stdout)
    assert got["async_waits"].startswith("WRONG") and out.returncode == 1, got
    # Without the library nothing is registered: the pinning checks fail, the program runs.
    plain = subprocess.run([str(TARGETS / "pin_bookkeeping")], capture_output=True, text=True,
                           env=dict(os.environ, LD_LIBRARY_PATH=str(FAKE_CUDA)))
    got = checks(plain.stdout)
    assert got["pinned"].startswith("WRONG") and got["free_reuse"].startswith("WRONG"), got


DRAIN = BUILD / "bench" / "launch_ring_drain"
HOOKS = BUILD / "libgpuscope_launches.so"


@pytest.mark.parametrize("hooks_first", [True, False])
def test_with_records_launch_hooks_both_see_their_calls(hooks_first):
    """`record --launch-probes in-process` preloads its launch hooks; both libraries stand in for
    dlsym and cuGetProcAddress and each hands the other's on, in either order: every launch is in
    the hooks' rings, and the pin library's bookkeeping is as without the hooks."""
    env = dict(os.environ, LD_LIBRARY_PATH=str(FAKE_CUDA))
    drain = [str(DRAIN), "--lib", str(HOOKS), "--every-us", "500", "--"]
    pinned = [str(GPUSCOPE), "pin", "--"]

    def run(program):
        # LD_PRELOAD gets the outer one's library first.
        cmd = (pinned + drain if hooks_first else drain + pinned) + [str(p) for p in program]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    n = 500
    lines = [line for line in run([TARGETS / "driver_lookups", "--launches", n]).splitlines() if line.startswith("{")]
    program, rings = json.loads(lines[0]), json.loads(lines[-1])
    assert program["failed"] == 0 and rings["lost"] == 0, (program, rings)
    ring = rings["processes"][str(program["pid"])]
    assert ring["by_api"] == {"1": n, "2": n, "3": n, "7": n}, ring
    got = checks(run([TARGETS / "pin_bookkeeping"]))
    assert got and all(v == "ok" for v in got.values()), got


@pytest.mark.parametrize("program", ["cuda_ops", "cuda_ops_static", "pageable_copies"])
def test_real_cuda_programs_run_as_without_it(program):
    # Their CUDA calls fail here (no GPU): the library never gets to register, and must change nothing.
    plain = subprocess.run([str(TARGETS / program)], capture_output=True, text=True, timeout=120)
    pinned = pin("--", TARGETS / program)
    assert pinned.returncode == plain.returncode
    assert pinned.stdout == plain.stdout
    assert "gpuscope pin:" in pinned.stderr


PYTHON_JOB = r"""
import os, sys
bufs = [bytearray(bytes((i + k) % 256 for k in range(256)) * 4096 * 3) for i in range(20)]   # 3 MiB each: served here
grown = bytearray()
for i in range(64):
    grown += bytes([i]) * (256 << 10)                           # realloc past the threshold, again and again
digest = sum(sum(b[::4093]) for b in bufs) + sum(grown[::4093])
pid = os.fork()
if pid == 0:
    os._exit(0 if sum(sum(b[::4093]) for b in bufs) + sum(grown[::4093]) == digest else 1)
_, status = os.waitpid(pid, 0)
del bufs[::2]
print(digest, len(grown), status)
"""


def test_python_with_large_buffers_realloc_and_fork_runs_as_without_it():
    plain = subprocess.run([sys.executable, "-c", PYTHON_JOB], capture_output=True, text=True, timeout=120)
    out = pin("--", sys.executable, "-c", PYTHON_JOB)
    assert out.returncode == plain.returncode == 0, out.stderr
    assert out.stdout == plain.stdout and out.stdout.split()[-1] == "0"
    assert "large buffers served" in out.stderr


def test_exit_status_and_signals_pass_through():
    assert pin("--", "sh", "-c", "exit 3").returncode == 3
    assert pin("--", "sh", "-c", "kill -9 $$").returncode == 128 + 9


@pytest.mark.parametrize("args,says", [
    (["--mode", "fast", "--", "true"], "--mode 'fast': give online, all or off"),
    (["--cap", "lots", "--", "true"], "--cap 'lots' is not a size"),
    (["--", "/nonexistent/program"], "cannot run /nonexistent/program"),
    (["--copy-table", "/nonexistent/table", "--", "true"], "--copy-table /nonexistent/table: no such file"),
    (["--use", "/nonexistent/profile", "--", "true"], "--use /nonexistent/profile: no such file"),
])
def test_bad_input_is_one_line_and_fails(args, says):
    out = pin(*args)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], out.stderr
