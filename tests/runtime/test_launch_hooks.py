"""The in-process launch hooks (libgpuscope_launches.so, issue 33) against a stand-in driver:
launches reached as the runtime reaches them (dlsym, cuGetProcAddress, through itself, the
per-thread variants) are all in the rings gpuscope reads, with their arguments; the program runs as
it would without them; a forked child has its own ring; nothing is announced by a program that
never launches."""
import json
import os
import subprocess

from conftest import BUILD, CUDART, TARGETS, folded

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
    # The child's launches, in a ring of its own.
    (child,) = rings["processes"].values()
    assert child["by_api"] == {"1": n, "2": n, "3": n, "7": n}, child


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
    assert meta == {"launch_probes": "in-process", "launch_ring_launches": "0", "launch_ring_lost": "0",
                    "launch_ring_processes": "2"}, meta
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
        assert named == {"lib_kernel_a": 300, "lib_kernel_b": 300}, (mode, named)
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
    out = gpuscope("record", "--launch-probes", "in-process", "-p", os.getpid(), "-o", "/dev/null")
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert "works with record -- CMD" in out.stderr
