"""The in-process launch hooks (libgpuscope_launches.so, issue 33) against a stand-in driver:
launches reached as the runtime reaches them (dlsym, cuGetProcAddress, through itself, the
per-thread variants) are all in the rings gpuscope reads, with their arguments and their
functions' names; the program runs as it would without them; a forked child has its own ring;
nothing is announced by a program that never launches; a process started with the hooks by its
owner keeps its ring in standby for `record --pid`."""
import json
import mmap
import os
import struct
import subprocess
import time

from conftest import BUILD, CUDART, GPUSCOPE, TARGETS, Record, folded

DRAIN = BUILD / "bench" / "launch_ring_drain"
HOOKS = BUILD / "libgpuscope_launches.so"
FAKE_DRIVER = TARGETS / "fake-cuda"


def run(args, env=None, **kw):
    full = dict(os.environ, LD_LIBRARY_PATH=str(FAKE_DRIVER), **(env or {}))
    return subprocess.run([str(a) for a in args], env=full, capture_output=True, text=True, timeout=120, **kw)


def drained(*target):
    out = run([DRAIN, "--lib", HOOKS, "--every-us", 500, "--", *target])
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    # The program's own JSON line, if it prints one, then the rings'.
    return (json.loads(lines[0]) if len(lines) > 1 else None), json.loads(lines[-1])


def test_every_launch_is_in_the_rings_with_its_arguments():
    n, threads = 3000, 3
    program, rings = drained(TARGETS / "driver_lookups", "--launches", n, "--threads", threads, "--fork")
    assert program["failed"] == 0 and program["driver_counted"] == 4 * n * threads, program
    assert rings["exit"] == 0 and rings["lost"] == 0 and rings["refused"] == 0, rings
    assert rings["out_of_order"] == 0 and rings["fields_wrong"] == 0, rings
    parent = rings["processes"].pop(str(program["pid"]))
    # cuLaunchKernel (1), its per-thread variant (2), cuLaunchKernelEx found with dlsym (3),
    # cuGraphLaunch found through cuGetProcAddress's own pointer (7): n of each per thread.
    assert parent["by_api"] == {"1": n * threads, "2": n * threads, "3": n * threads, "7": n * threads}, parent
    # Each function named once, as the driver names it (cuFuncGetName); graphs are not functions.
    names = {"0x1000": "_Z12fake_kernel1Pfi", "0x2000": "_Z12fake_kernel2v", "0x3000": "_Z12fake_kernel3Pd"}
    assert parent["names"] == names and rings["names_twice"] == 0 and rings["names_lost"] == 0, rings
    # The child's launches, in a ring of its own, with the names again.
    (child,) = rings["processes"].values()
    assert child["by_api"] == {"1": n, "2": n, "3": n, "7": n} and child["names"] == names, child


def test_calls_bound_to_the_driver_symbols_reach_the_exports():
    # driver_launch links libcuda and calls cuLaunchKernel by name: the preload's export comes first.
    program, rings = drained(TARGETS / "driver_launch")
    assert rings["exit"] == 0 and rings["lost"] == 0, rings
    (ring,) = rings["processes"].values()
    assert ring["by_api"] == {"1": 3}, rings


def test_a_full_ring_counts_what_it_could_not_hold():
    # No directory to announce a ring in: one line, and the program goes on.
    out = run([TARGETS / "driver_lookups", "--launches", 100],
              env={"LD_PRELOAD": str(HOOKS), "GPUSCOPE_LAUNCH_RING": "/nonexistent-dir"})
    assert out.returncode == 0 and json.loads(out.stdout)["failed"] == 0, out.stderr
    assert out.stderr.count("launches go unrecorded") == 1, out.stderr
    # 64 slots, 80000 launches as fast as the stand-in driver takes them: what the reader could not
    # keep up with is counted, and nothing is read twice.
    program, rings = drained("env", "GPUSCOPE_LAUNCH_RING_SLOTS=64", TARGETS / "driver_lookups", "--launches", 20000)
    (ring,) = rings["processes"].values()
    assert ring["launches"] + rings["lost"] == 4 * 20000, rings
    assert ring["launches"] >= 64


def test_paused_hooks_hand_launches_straight_to_the_driver():
    # A benchmark's switch (the ring header's `paused`, set here from the start): nothing of the
    # launches is written, and each still reaches the driver; the function lookups still are.
    program, rings = drained("env", "GPUSCOPE_LAUNCH_PAUSED=1", TARGETS / "driver_lookups", "--launches", 500,
                             "--library-kernels", 30)
    assert program["failed"] == 0 and program["driver_counted"] == 4 * 500 + 30, program
    (ring,) = rings["processes"].values()
    assert ring["by_api"] == {"9": 30} and rings["lost"] == 0, rings


def test_the_program_runs_as_without_the_hooks():
    plain = run([TARGETS / "driver_lookups", "--launches", 10])
    hooked = run([TARGETS / "driver_lookups", "--launches", 10], env={"LD_PRELOAD": str(HOOKS)})
    assert plain.returncode == hooked.returncode == 0, hooked.stderr
    strip = lambda s: {k: v for k, v in json.loads(s).items() if k not in ("pid", "ns_per_launch")}
    assert strip(plain.stdout) == strip(hooked.stdout)
    # The real libcudart, no driver here: its calls fail as they do without the hooks.
    for target in ("cuda_ops", "launch_count"):
        plain = run([TARGETS / target])
        hooked = run([TARGETS / target], env={"LD_PRELOAD": str(HOOKS)})
        assert (plain.returncode, plain.stdout) == (hooked.returncode, hooked.stdout), (target, hooked.stderr)


def test_a_ring_only_for_programs_that_look_the_driver_up():
    program, rings = drained("python3", "-c", "print(1)")
    assert rings["exit"] == 0 and rings["rings"] == 0 and rings["refused"] == 0, rings
    # The real libcudart on the stand-in driver: it looks entry points up (a ring is made then,
    # before any launch could come), fails to start, and runs on as without the hooks.
    program, rings = drained("python3", "-c", "import ctypes; ctypes.CDLL(%r).cudaFree(None)" % str(CUDART))
    assert rings["exit"] == 0 and rings["processes"] == {} and rings["refused"] == 0, rings


def launch_rows(rec):
    """(function, process's role, count, grid x, block x, shared memory, streams, with a stack) per launch kind."""
    parent = rec.scalar("SELECT min(pid) FROM calls")
    return {(name, "parent" if pid == parent else "child"): rest for name, pid, *rest in rec.query(
        "SELECT f.name, c.pid, count(*), sum(c.grid_x), sum(c.block_x), sum(c.shared_mem), "
        "count(DISTINCT c.stream), count(c.stack_id) FROM calls c JOIN functions f ON f.id = c.func "
        "WHERE f.kind IN ('launch', 'graph_launch') GROUP BY 1, 2")}


def test_record_in_process_has_the_launches_the_probes_record(record, tmp_path):
    n = 300
    env = dict(os.environ, LD_LIBRARY_PATH=str(FAKE_DRIVER))
    target = [TARGETS / "driver_lookups", "--launches", n, "--threads", 2, "--fork"]
    shm_before = set(os.listdir("/dev/shm"))
    probed = launch_rows(record("--", *target, env=env))
    rec = record("--launch-probes", "in-process", "--", *target, env=env)
    assert rec.returncode == 0, rec.stderr
    hooked = launch_rows(rec)
    assert len(probed) == 8 and {k: v[:5] for k, v in hooked.items()} == {k: v[:5] for k, v in probed.items()}
    # Every launch's stack in the parent (the fixture's --stack-every 1), each handed to the probe
    # on gpuscope_launch_stack. (A forked child's are not all unwound, in either mode.)
    assert all(v[5] == probed[k][5] for k, v in hooked.items() if k[1] == "parent"), (hooked, probed)
    assert hooked[("cuLaunchKernel", "parent")][0] == 2 * n and hooked[("cuGraphLaunch", "child")][0] == n
    assert hooked[("cuLaunchKernel", "parent")][5] == 2 * n
    meta = dict(rec.query("SELECT key, value FROM meta WHERE key LIKE 'launch%'"))
    # Every launch went to the probe for its stack: none through the rings.
    # Three functions named by each process's ring.
    assert meta == {"launch_probes": "in-process", "launch_ring_launches": "0", "launch_ring_lost": "0",
                    "launch_ring_processes": "2", "launch_ring_names": "6"}, meta
    assert set(os.listdir("/dev/shm")) == shm_before  # the rings' directory is gone


def test_record_in_process_takes_one_stack_in_n_and_leaves_its_own_frames_out(record, gpuscope):
    n = 4000
    env = dict(os.environ, LD_LIBRARY_PATH=str(FAKE_DRIVER))
    rec = record("--launch-probes", "in-process", "--stack-every", 4, "--", TARGETS / "driver_lookups",
                 "--launches", n, env=env)
    assert rec.returncode == 0, rec.stderr
    rows = dict(((w, bool(missing)), count) for w, missing, count in rec.query(
        "SELECT coalesce(stack_weight, 1), stack_id IS NULL, count(*) FROM calls GROUP BY 1, 2"))
    # Weight 4 with a stack or 0 without: Binomial(4n, 1/4) within 6 sigma.
    assert set(rows) == {(4, False), (0, True)} and sum(rows.values()) == 4 * n, rows
    assert abs(rows[(4, False)] - n) <= 6 * (4 * n * 3 / 16) ** 0.5, rows
    # Those left out came through the ring; those taken, through the probe.
    assert rec.scalar("SELECT value FROM meta WHERE key = 'launch_ring_launches'") == str(rows[(0, True)])
    stacks = folded(gpuscope, rec, "launches")  # kernel launches: not cuGraphLaunch's
    assert sum(stacks.values()) == 4 * rec.scalar(
        "SELECT count(*) FROM calls c JOIN functions f ON f.id = c.func WHERE f.kind = 'launch' AND c.stack_weight = 4")
    # Each stack starts where the program called the driver: the hooks' frames are left out.
    frames = {f for chain in stacks for f in chain}
    assert "launches" in frames and not any("gpuscope_launch_stack" in f or "Wrap" in f for f in frames), frames


def test_a_library_kernel_is_named_by_the_function_asked_for_before_each_launch(record):
    # As cuBLASLt launches: cuLibraryGetKernel once (probed in every mode), cuKernelGetFunction
    # before each launch (in the ring with the hooks), the function only on the launcher's stack.
    env = dict(os.environ, LD_LIBRARY_PATH=str(FAKE_DRIVER))
    target = [TARGETS / "driver_lookups", "--launches", 1, "--library-kernels", 600]
    # The hooks time launches with the TSC where the kernel does (this machine, CI's), else with
    # CLOCK_MONOTONIC: either reads in the probes' clock, in the calls' order.
    # The default is in-process for a command.
    for mode in (["--launch-probes", "probes"], [], ["--launch-probes", "in-process", "--stack-every", 3],
                 ["--launch-probes", "in-process", "--no-stacks"], ["--launch-probes", "in-process", "monotonic"]):
        in_process = "probes" not in mode
        clock = {"GPUSCOPE_LAUNCH_CLOCK": "monotonic"} if "monotonic" in mode else {}
        rec = record(*[m for m in mode if m != "monotonic"], "--", *target, env=dict(env, **clock))
        assert rec.returncode == 0, (mode, rec.stderr)
        named = dict(rec.query("SELECT k.name, count(*) FROM calls c JOIN kernels k ON k.id = c.kernel_id GROUP BY 1"))
        assert {k: v for k, v in named.items() if k.startswith("lib_")} == {"lib_kernel_a": 300,
                                                                               "lib_kernel_b": 300}, (mode, named)
        # The stand-in's other kernels have no lookup to name them: the rings do, from the driver.
        others = {k: v for k, v in named.items() if not k.startswith("lib_")}
        assert others == ({"_Z12fake_kernel1Pfi": 1, "_Z12fake_kernel2v": 1, "_Z12fake_kernel3Pd": 1}
                          if in_process else {}), (mode, named)
        calls = rec.query("SELECT f.name, c.ts_ns, c.duration_ns FROM calls c JOIN functions f ON f.id = c.func "
                          "WHERE c.tid = c.pid ORDER BY c.ts_ns, c.id")
        lookups = [name for name, _, _ in calls if name != "cuLaunchKernel"]
        assert lookups == ["cuLibraryGetKernel"] * 2 + ["cuKernelGetFunction"] * 600, (mode, lookups[:4])
        # Each library kernel's launch right after its lookup, and ended before the next lookup.
        lib = [(n, t, d) for n, t, d in calls if n in ("cuKernelGetFunction", "cuLaunchKernel")][-1200:]
        assert [n for n, _, _ in lib] == ["cuKernelGetFunction", "cuLaunchKernel"] * 600, mode
        # (Probed launches have no return probe: no duration.)
        # The stand-in's launch takes nanoseconds: under the TSC's steps on a VM (10 ns on the dev VM)
        # some read as 0.
        durations = [d for n, _, d in lib if n == "cuLaunchKernel" and in_process]
        assert all(d is not None and 0 <= d < 50_000_000 for d in durations), mode
        assert sum(d > 0 for d in durations) > len(durations) // 2 or not in_process, mode
        assert all(t1 + d1 <= t2 for (_, t1, d1), (_, t2, _) in zip(lib, lib[1:]) if d1 is not None), mode
        if in_process:
            assert rec.scalar("SELECT value FROM meta WHERE key = 'launch_ring_launches'") == str(
                rec.scalar("SELECT count(*) FROM calls c JOIN functions f ON f.id = c.func "
                           "WHERE f.kind IN ('launch', 'graph_launch') AND c.stack_id IS NULL")), mode


def test_record_in_process_probes_the_launches_of_a_process_without_the_hooks(record, gpuscope):
    env = dict(os.environ, LD_LIBRARY_PATH=str(FAKE_DRIVER))
    rec = record("--launch-probes", "in-process", "--", "env", "-u", "LD_PRELOAD", TARGETS / "driver_lookups",
                 "--launches", 5, env=env)
    assert rec.returncode == 0, rec.stderr
    pid = json.loads(rec.stdout)["pid"]
    assert f"PID {pid} (driver_lookups) runs without libgpuscope_launches.so" in rec.stderr, rec.stderr
    assert rec.scalar("SELECT value FROM meta WHERE key = 'launch_probed_processes'") == str(pid)
    # Its launches are all there, taken by its own probes (with their stacks: --stack-every 1).
    assert rec.query("SELECT count(*), count(stack_id) FROM calls") == [(20, 20)]
    out = gpuscope("record", "--launch-probes", "in-process", "--all", "-o", "/dev/null")
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert "works with record -- CMD, and with --pid" in out.stderr


STANDBY_ENV = {"LD_LIBRARY_PATH": str(FAKE_DRIVER), "LD_PRELOAD": str(HOOKS)}


def standby_target(go, before=200, after=300, then=None, env=None):
    """driver_lookups started with the hooks by its owner (no gpuscope): `before` launches of each
    kind and of two library kernels, then waiting for `go` before `after` more (and for `then`
    before it ends)."""
    env = dict(os.environ, **STANDBY_ENV, **(env or {}))
    env.pop("GPUSCOPE_LAUNCH_RING", None)
    then = ["--then-wait", str(then)] if then else []
    target = subprocess.Popen([str(TARGETS / "driver_lookups"), "--launches", str(before), "--library-kernels",
                               str(before), "--wait-file", str(go), "--after", str(after), *then],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert target.stderr.readline() == "waiting\n"
    return target


def ring_state(pid):
    """(paused, reader_pid) of the process's ring in standby, read through its memfd."""
    with open(f"/proc/{pid}/maps") as f:
        line = next(line for line in f if "/memfd:gpuscope-launches" in line)
    with open(f"/proc/{pid}/map_files/{line.split()[0]}", "rb") as f:
        header = mmap.mmap(f.fileno(), 256, access=mmap.ACCESS_READ)
        reader_pid, _, _, paused = struct.unpack_from("<IIII", header, 32)
        header.close()
    return paused, reader_pid


def start_record(out, *args):
    rec = subprocess.Popen([str(GPUSCOPE), "record", "-o", str(out), *map(str, args)], stderr=subprocess.PIPE,
                           text=True)
    err = ""
    while "recording PID" not in err:
        line = rec.stderr.readline()
        assert line, err
        err += line
    return rec, err


def read_back(path):
    return Record(path, subprocess.CompletedProcess([], 0, "", ""))


def by_kernel(rec):
    return {(f, k): (n, stacks) for f, k, n, stacks in rec.query(
        "SELECT f.name, coalesce(k.name, ''), count(*), count(c.stack_id) FROM calls c "
        "JOIN functions f ON f.id = c.func LEFT JOIN kernels k ON k.id = c.kernel_id "
        "WHERE f.kind IN ('launch', 'graph_launch') GROUP BY 1, 2")}


def test_record_pid_claims_the_ring_of_a_process_started_with_the_hooks(tmp_path):
    go, n = tmp_path / "go", 300
    target = standby_target(go, after=n)
    try:
        # In standby: paused, nobody reading; the launches so far went straight to the driver.
        assert ring_state(target.pid) == (1, 0)
        rec_proc, err = start_record(tmp_path / "a.gpuscope", "--stack-every", 3, "--pid", target.pid)
        assert f"PID {target.pid} (driver_lookups): launches read from its launch ring" in err, err
        assert ring_state(target.pid) == (0, rec_proc.pid)
        # A second gpuscope finds the ring taken: it probes the launches, one trap each.
        second, err2 = start_record(tmp_path / "b.gpuscope", "--stack-every", 1, "--pid", target.pid)
        assert f"has its launch ring read by another gpuscope (PID {rec_proc.pid})" in err2, err2
        go.touch()
        assert json.loads(target.communicate(timeout=60)[0])["failed"] == 0
        for p in (rec_proc, second):
            _, rest = p.communicate(timeout=60)
            assert p.returncode == 0, rest
    finally:
        target.kill()
    # Exactly the launches made while it recorded, named, though every function was looked up
    # (and its name given) before gpuscope came.
    expected = {("cuLaunchKernel", "_Z12fake_kernel1Pfi"): n, ("cuLaunchKernel_ptsz", "_Z12fake_kernel2v"): n,
                ("cuLaunchKernelEx", "_Z12fake_kernel3Pd"): n, ("cuGraphLaunch", ""): n,
                ("cuLaunchKernel", "lib_kernel_a"): n // 2, ("cuLaunchKernel", "lib_kernel_b"): n // 2}
    claimed = read_back(tmp_path / "a.gpuscope")
    rows = by_kernel(claimed)
    assert {k: v[0] for k, v in rows.items()} == expected, rows
    meta = dict(claimed.query("SELECT key, value FROM meta WHERE key LIKE 'launch%'"))
    assert meta["launch_probes"] == "in-process" and meta["launch_ring_claimed"] == str(target.pid), meta
    assert meta["launch_ring_lost"] == "0" and meta["launch_ring_names"] == "5", meta
    # One launch in 3 handed to the probe for its stack, the rest through the ring.
    stacked = sum(v[1] for v in rows.values())
    assert int(meta["launch_ring_launches"]) == sum(expected.values()) - stacked, (meta, stacked)
    assert 0.2 < stacked / sum(expected.values()) < 0.5, rows
    probed = read_back(tmp_path / "b.gpuscope")
    assert sum(v[0] for v in by_kernel(probed).values()) == sum(expected.values())
    assert dict(probed.query("SELECT key, value FROM meta WHERE key = 'launch_probed_processes'")) == {
        "launch_probed_processes": str(target.pid)}


def test_a_claimed_ring_goes_back_to_standby_and_probes_leave_it_alone(tmp_path, record):
    go = tmp_path / "go"
    target = standby_target(go)
    try:
        rec = record("--pid", target.pid, "--duration", 1)
        assert rec.returncode == 0 and "launches read from its launch ring" in rec.stderr, rec.stderr
        assert ring_state(target.pid) == (1, 0)
        # Probes asked for: the ring is not claimed.
        rec_proc, err = start_record(tmp_path / "p.gpuscope", "--launch-probes", "probes", "--pid", target.pid)
        assert ring_state(target.pid) == (1, 0) and "launch ring" not in err, err
        go.touch()
        target.communicate(timeout=60)
        rec_proc.communicate(timeout=60)
    finally:
        target.kill()
    probed = read_back(tmp_path / "p.gpuscope")
    assert probed.scalar("SELECT value FROM meta WHERE key = 'launch_probes'") != "in-process"
    assert sum(v[0] for v in by_kernel(probed).values()) == 5 * 300


def test_a_ring_whose_gpuscope_was_killed_goes_back_to_standby(tmp_path):
    # 64 slots: the claimed ring fills at once once nobody reads it (and the launches handed over
    # for their stacks go to a probe that is gone).
    go, then = tmp_path / "go", tmp_path / "then"
    target = standby_target(go, after=20000, then=then, env={"GPUSCOPE_LAUNCH_RING_SLOTS": "64"})
    try:
        rec_proc, err = start_record(tmp_path / "k.gpuscope", "--pid", target.pid)
        assert ring_state(target.pid) == (0, rec_proc.pid), err
        rec_proc.kill()
        rec_proc.wait(timeout=30)
        # 100,000 launches: at the 65,536th the hooks could not hand over, they find the reader gone.
        go.touch()
        assert target.stderr.readline() == "waiting\n"
        assert ring_state(target.pid) == (1, 0)
        then.touch()
        assert json.loads(target.communicate(timeout=60)[0])["failed"] == 0
    finally:
        target.kill()
