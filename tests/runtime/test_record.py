"""What `gpuscope record` captures from real processes."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import CUDART, GPUSCOPE, TARGETS, Record, folded

MiB = 1 << 20
VECADD = "vecAdd(float const*, float const*, float*, int)"
SCALE = "void scale<float>(float*, float, int)"


def kernel_launches(rec):
    """Launches per demangled kernel name, each launch counted once."""
    return dict(rec.query(
        "SELECT k.demangled, count(*) FROM calls c JOIN kernels k ON k.id = c.kernel_id "
        "WHERE c.parent_id IS NULL GROUP BY k.demangled"))


def test_command_records_exact_calls_and_passes_exit_code(record):
    rec = record("--", TARGETS / "cuda_ops", "--iterations", 2)
    assert rec.returncode == 3, rec.stderr  # the command's own exit code
    assert rec.scalar("SELECT value FROM meta WHERE key='complete'") == "1"

    assert sorted(r[0] for r in rec.query(
        "SELECT bytes FROM calls c JOIN functions f ON f.id=c.func WHERE f.name='cudaMalloc'")) == [MiB, 2 * MiB, 4 * MiB]
    # cudaMallocHost is an inline wrapper in the header: libcudart sees cudaHostAlloc.
    assert rec.query("SELECT bytes FROM calls c JOIN functions f ON f.id=c.func WHERE f.name='cudaHostAlloc'") == [(8 * MiB,)]
    assert rec.count("cudaMemcpy") == 8
    assert rec.count("cudaMemcpyAsync") == 2
    assert rec.count("cudaMemset") == 2
    assert rec.count("cudaStreamSynchronize") == 2
    assert rec.count("cudaDeviceSynchronize") == 1
    assert rec.count("cudaFree") == 2
    assert rec.count("cudaFreeHost") == 1

    copies = dict(((d, b), n) for d, b, n in rec.query(
        "SELECT dir, bytes, count(*) FROM calls c JOIN functions f ON f.id=c.func "
        "WHERE f.kind='memcpy' GROUP BY dir, bytes"))
    assert copies == {("HtoD", MiB): 4, ("DtoH", 2 * MiB): 2, ("DtoH", 3 * MiB): 2, ("DtoD", 4 * MiB): 2}
    # No driver here: the allocations failed, so no host memory is known to be pinned.
    assert {r[0] for r in rec.query("SELECT DISTINCT host_mem FROM calls WHERE dir IN ('HtoD','DtoH')")} == {"pageable"}

    assert kernel_launches(rec) == {VECADD: 2, SCALE: 2}
    shapes = set(rec.query(
        "SELECT k.demangled, grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_mem "
        "FROM calls c JOIN kernels k ON k.id = c.kernel_id"))
    assert shapes == {(VECADD, 4, 2, 1, 128, 1, 1, 0), (SCALE, 8, 1, 1, 64, 2, 1, 256)}

    # Every call failed for lack of a driver, with its real return code.
    codes = {r[0] for r in rec.query("SELECT DISTINCT ret FROM calls WHERE ret IS NOT NULL")}
    assert codes and 0 not in codes
    # Durations are real: every call with a return has one.
    assert rec.scalar("SELECT count(*) FROM calls WHERE ret IS NOT NULL AND duration_ns IS NULL") == 0
    # Each call has a user stack, deduplicated.
    assert rec.scalar("SELECT count(*) FROM calls WHERE stack_id IS NULL AND func != 60") == 0
    assert rec.scalar("SELECT count(*) FROM stacks") < rec.scalar("SELECT count(*) FROM calls")
    assert rec.scalar("SELECT sum(count) FROM lost") == 0


def test_report_names_kernels_call_sites_and_leaks(record, gpuscope):
    rec = record("--", TARGETS / "cuda_ops", "--iterations", 2)
    text = gpuscope("report", rec.path)
    assert text.returncode == 0, text.stderr
    assert VECADD in text.stdout
    doc = json.loads(gpuscope("report", "--json", rec.path).stdout)
    kernels = {k["name"]: k for k in doc["kernels"]["top"]}
    assert kernels[VECADD]["launches"] == 2
    assert any("launch_kernels" in site["site"] for site in kernels[VECADD]["call_sites"])
    # The call site's source line, from the target's DWARF (nvcc -g): the vecAdd<<<...>>> line.
    source = (TARGETS.parent.parent / "tests/targets/cuda_ops.cu").read_text().splitlines()
    line = next(i + 1 for i, text in enumerate(source) if "vecAdd<<<" in text)
    assert any(site["site"].endswith(f"at cuda_ops.cu:{line}") for site in kernels[VECADD]["call_sites"]), \
        kernels[VECADD]["call_sites"]
    assert doc["lost"]["total"] == 0, doc["lost"]


def test_late_dlopen_first_call_is_recorded(record):
    """Python loads libcudart through ctypes long after start; its very first call is recorded."""
    rec = record("--", "/usr/bin/python3", TARGETS.parent.parent / "tests/targets/late_dlopen.py", CUDART)
    assert rec.returncode == 0, rec.stderr
    assert rec.query("SELECT bytes FROM calls c JOIN functions f ON f.id=c.func WHERE f.name='cudaMalloc'") == [(12345,)]
    assert rec.count("cudaFree") == 1


def test_static_cudart(record):
    rec = record("--", TARGETS / "cuda_ops_static")
    assert rec.returncode == 3, rec.stderr
    assert kernel_launches(rec) == {VECADD: 1, SCALE: 1}
    assert rec.count("cudaMalloc") == 3
    assert "static CUDA runtime" in rec.scalar("SELECT path FROM libraries")


def test_static_cudart_inside_a_late_loaded_library(record):
    """A library named like nothing CUDA, with the runtime linked in, dlopen'ed late by Python:
    its first call is recorded, and its kernel named."""
    rec = record("--", "/usr/bin/python3", TARGETS.parent.parent / "tests/targets/load_lib.py",
                 TARGETS / "libstatic_in_lib.so")
    assert rec.returncode == 0, rec.stderr
    assert rec.query("SELECT bytes FROM calls c JOIN functions f ON f.id=c.func WHERE f.name='cudaMalloc'") == [(7777,)]
    assert kernel_launches(rec) == {"lib_kernel(int*)": 1}
    assert "libstatic_in_lib.so (static CUDA runtime)" in rec.scalar("SELECT group_concat(path) FROM libraries")


def test_a_wrapper_of_the_same_name_is_one_call(record, monkeypatch):
    """A library's cudaMalloc that calls libcudart's (XLA's and Triton's driver shims do this):
    both are probed, the inner entry comes before the outer returns. Each call is recorded once,
    with the outer's arguments, and no return is left without its entry."""
    monkeypatch.setenv("SHIM_CUDART", str(CUDART))
    rec = record("--", "/usr/bin/python3", TARGETS.parent.parent / "tests/targets/load_lib.py",
                 TARGETS / "libsame_name_shim.so")
    assert rec.returncode == 0, rec.stderr
    assert "libsame_name_shim.so (static CUDA runtime)" in rec.scalar("SELECT group_concat(path) FROM libraries")
    assert rec.query("SELECT bytes FROM calls c JOIN functions f ON f.id=c.func WHERE f.name='cudaMalloc'") == [(4242,)] * 3
    assert rec.query("SELECT count FROM lost WHERE cause = 'return_orphan' AND count > 0") == []


def stack_walks(rec):
    """The user stacks the BPF side took: walks of either kind, and copies sent while a table
    the walk needed was being made (eh-frame)."""
    total = 0
    for key in ("fp_walks", "unwind_walks", "unwind_copies"):
        text = rec.scalar(f"SELECT value FROM meta WHERE key = '{key}'")
        total += int(text.split(" ", 1)[0]) if text else 0
    return total


@pytest.mark.parametrize("walk", ["fp", "eh-frame"])
def test_driver_calls_inside_runtime_calls_take_its_stack(record, gpuscope, walk):
    """A driver call made inside a runtime call is its child and shows its stack; the BPF side
    walks only the runtime call's (one walk per pair)."""
    rec = record("--call-stacks", walk, "--", "/usr/bin/python3", TARGETS.parent.parent / "tests/targets/load_lib.py",
                 TARGETS / "libnested_driver.so")
    assert rec.returncode == 0, rec.stderr
    rows = rec.query("SELECT f.name, c.id, c.parent_id, c.stack_id FROM calls c JOIN functions f ON f.id = c.func "
                     "ORDER BY c.ts_ns, c.parent_id IS NOT NULL")
    outer = [r for r in rows if r[0] in ("cudaMalloc", "cudaMemsetAsync")]
    inner = [r for r in rows if r[0] in ("cuMemAlloc_v2", "cuMemsetD8Async")]
    assert [r[0] for r in outer] == ["cudaMalloc"] + ["cudaMemsetAsync"] * 5, rows
    assert [r[0] for r in inner] == ["cuMemAlloc_v2"] + ["cuMemsetD8Async"] * 5, rows
    for o, i in zip(outer, inner):
        assert o[2] is None and o[3], o
        assert i[2] == o[1] and i[3] == o[3], (o, i)
    # The stack is the runtime call's, from Python's ctypes call down to the library's caller.
    (chain, _), = folded(gpuscope, rec, "alloc-bytes").items()
    assert any(f.startswith("<module> (") for f in chain) and "run_static" in chain, chain
    if walk == "fp":
        walks = rec.scalar("SELECT value FROM meta WHERE key = 'fp_walks'")
        assert walks.startswith("6 walks"), walks
    assert stack_walks(rec) == 6, rec.query("SELECT key, value FROM meta WHERE key LIKE '%walks' OR key LIKE '%copies'")


def memset_rows(rec):
    return rec.query("SELECT f.name, c.parent_id, c.stack_id, c.bytes FROM calls c JOIN functions f ON f.id = c.func "
                     "WHERE f.kind = 'memset' ORDER BY c.ts_ns, c.parent_id IS NOT NULL")


def test_runtime_calls_the_driver_records_lose_their_probes(record, gpuscope):
    """Once every cudaMemsetAsync seen (32 of them) made a cuMemsetD8Async, the runtime's probes
    go: the driver's probe records the later calls, each once, with its own stack, two traps a
    call instead of four."""
    batches = 60
    rec = record("--", "/usr/bin/python3", TARGETS.parent.parent / "tests/targets/load_lib.py",
                 TARGETS / "libnested_driver.so", "run_memsets", batches)
    assert rec.returncode == 0, rec.stderr
    assert "run_memsets returned 0" in rec.stdout, rec.stdout
    rows = memset_rows(rec)
    outer = [r for r in rows if r[1] is None]
    assert len(outer) == batches * 10 and all(r[3] == 4096 for r in outer), rows[:40]
    wrapped = [r for r in outer if r[0] == "cudaMemsetAsync"]
    alone = [r for r in outer if r[0] == "cuMemsetD8Async"]
    assert len(wrapped) >= 32 and len(alone) >= batches * 10 // 2, (len(wrapped), len(alone))
    # Runtime rows come first, then the driver's alone.
    assert [r[0] for r in outer] == ["cudaMemsetAsync"] * len(wrapped) + ["cuMemsetD8Async"] * len(alone)
    assert rec.scalar("SELECT value FROM meta WHERE key = 'runtime_probes_removed'").startswith("cudaMemsetAsync at ")
    # The driver's probe walks its own stack now: through the stand-in's frames up to the
    # Python line that called it.
    for stack in {r[2] for r in alone}:
        frames = rec.query("SELECT m.path, p.function FROM stack_frames sf LEFT JOIN modules m ON m.id = sf.module_id "
                           "LEFT JOIN python_frames p ON m.path = '[python]' AND p.id = sf.offset "
                           "WHERE sf.stack_id = ? ORDER BY sf.depth", stack)
        assert any((path or "").endswith("libnested_driver.so") for path, _ in frames), frames
        assert "<module>" in [fn for _, fn in frames], frames


def test_a_runtime_call_without_its_driver_call_keeps_the_probes(record):
    """A cudaMemsetAsync refused before the driver, made once the driver's probes were all in
    place, shows that the runtime's probes can see what the driver's cannot: they stay, and every
    later call is recorded by them."""
    rec = record("--", "/usr/bin/python3", TARGETS.parent.parent / "tests/targets/load_lib.py",
                 TARGETS / "libnested_driver.so", "run_refused_memset", 10)
    assert rec.returncode == 0, rec.stderr
    assert "run_refused_memset returned 0" in rec.stdout, rec.stdout
    outer = [r for r in memset_rows(rec) if r[1] is None]
    assert [r[0] for r in outer] == ["cudaMemsetAsync"] * 101, outer[:5]
    assert rec.scalar("SELECT count(*) FROM meta WHERE key = 'runtime_probes_removed'") == 0


def test_both_keeps_the_runtime_probes(record):
    rec = record("--launch-probes", "both", "--", "/usr/bin/python3", TARGETS.parent.parent / "tests/targets/load_lib.py",
                 TARGETS / "libnested_driver.so", "run_memsets", 10)
    assert rec.returncode == 0, rec.stderr
    outer = [r for r in memset_rows(rec) if r[1] is None]
    assert [r[0] for r in outer] == ["cudaMemsetAsync"] * 100
    assert rec.scalar("SELECT count(*) FROM meta WHERE key = 'runtime_probes_removed'") == 0


@pytest.mark.parametrize("mode", ["probes", "in-process"])
def test_looked_up_functions_are_named_without_a_return_probe(record, mode):
    """cuKernelGetFunction has no return probe: the function it wrote is read at the thread's
    next launch, and names that launch's kernel. In-process, the hooks record it whole (and the
    library, opened RTLD_LOCAL, reaches its own definitions through the hooks' exports)."""
    rec = record("--launch-probes", mode, "--", "/usr/bin/python3", TARGETS.parent.parent / "tests/targets/load_lib.py",
                 TARGETS / "libnested_driver.so", "run_lookups", 100)
    assert rec.returncode == 0, rec.stderr
    assert "run_lookups returned 0" in rec.stdout, rec.stdout
    assert kernel_launches(rec) == {"kernel_a": 60, "kernel_b": 40}
    lookups = rec.query("SELECT c.duration_ns, c.ts_ns < l.ts_ns FROM calls c JOIN functions f ON f.id = c.func "
                        "JOIN calls l ON l.id = (SELECT min(id) FROM calls WHERE id > c.id AND func = "
                        "(SELECT id FROM functions WHERE name = 'cuLaunchKernel')) "
                        "WHERE f.name = 'cuKernelGetFunction'")
    assert len(lookups) == 100 and all((d is None) == (mode == "probes") and before for d, before in lookups), lookups[:5]


def test_runtime_launch_keeps_its_driver_launch_across_a_lookup(record):
    """With both levels probed, a runtime launch that asks the driver for its kernel's function
    (cuKernelGetFunction, recorded at the launch after it) still folds its driver launch into
    its row: one launch each, named through the driver."""
    rec = record("--launch-probes", "both", "--", "/usr/bin/python3",
                 TARGETS.parent.parent / "tests/targets/load_lib.py", TARGETS / "libnested_driver.so",
                 "run_runtime_launches", 50)
    assert rec.returncode == 0, rec.stderr
    assert "run_runtime_launches returned 0" in rec.stdout, rec.stdout
    assert kernel_launches(rec) == {"kernel_c": 50}
    rows = rec.query("SELECT f.name, d.name FROM calls c JOIN functions f ON f.id = c.func "
                     "LEFT JOIN functions d ON d.id = c.driver_func WHERE f.kind = 'launch'")
    assert rows == [("cudaLaunchKernel", "cuLaunchKernel")] * 50, rows[:5]


def test_a_small_ring_is_drained_in_time(record):
    """Records are submitted without waking gpuscope, except the one that passes a quarter of the
    ring, once per drain: a burst that fills a 1 MiB ring faster than the 20 ms poll is drained in
    time. Without that wake-up two thirds of it were lost on the dev VM; with it 0 to 1% (the
    consumer shares two cores with the burst and gpuscope's other threads)."""
    n = 600000
    rec = record("--ringbuf-mb", "1", "--no-stacks", "--launch-probes", "both", "--", "/usr/bin/python3",
                 TARGETS.parent.parent / "tests/targets/launch_burst.py", CUDART, n)
    assert rec.returncode == 0, rec.stderr
    lost = rec.scalar("SELECT coalesce(sum(count), 0) FROM lost")
    assert lost < n // 20, rec.query("SELECT cause, count FROM lost WHERE count > 0")
    # Every launch is either recorded or counted lost (the lost may include a record of another
    # kind: host telemetry's windows share the ring).
    launches = rec.scalar("SELECT count(*) FROM calls c JOIN functions f ON f.id = c.func WHERE f.kind = 'launch'")
    assert n - lost <= launches <= n, (launches, rec.query("SELECT cause, count FROM lost WHERE count > 0"))


def test_threads_launching_at_once(record):
    rec = record("--", TARGETS / "cuda_ops", "--threads", 4, "--iterations", 50)
    assert rec.returncode == 3, rec.stderr
    assert kernel_launches(rec) == {VECADD: 200, SCALE: 200}
    assert rec.scalar("SELECT count(DISTINCT tid) FROM calls") == 4
    assert rec.scalar("SELECT sum(count) FROM lost") == 0, rec.query("SELECT cause, count FROM lost WHERE count > 0")


def test_pid_attach_to_running_process(record, tmp_path):
    go = tmp_path / "go"
    target = subprocess.Popen([TARGETS / "cuda_ops", "--wait-file", go, "--iterations", "3"])
    try:
        time.sleep(0.5)  # libcudart is loaded and mapped by now
        out = tmp_path / "pid.gpuscope"
        rec_proc = subprocess.Popen([GPUSCOPE, "record", "-o", out, "--pid", str(target.pid)],
                                    stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 30
        line = ""
        while "recording" not in line and time.time() < deadline:
            line = rec_proc.stderr.readline()
        go.touch()
        target.wait(timeout=30)
        _, err = rec_proc.communicate(timeout=30)
        assert rec_proc.returncode == 0, err
        rec = Record(out, rec_proc)
        assert kernel_launches(rec) == {VECADD: 3, SCALE: 3}
        assert rec.count("cudaMalloc") == 3
        # Attached late: host memory not seen allocated is unknown, not assumed pageable.
        assert {r[0] for r in rec.query("SELECT DISTINCT host_mem FROM calls WHERE dir='HtoD'")} == {"unknown"}
        assert rec.scalar("SELECT exit_code FROM processes WHERE pid=?", target.pid) == 3
    finally:
        target.kill()


def test_all_mode_picks_up_processes_started_later(record, tmp_path):
    out = tmp_path / "all.gpuscope"
    rec_proc = subprocess.Popen([GPUSCOPE, "record", "-o", out, "--all", "--duration", "4"],
                                stderr=subprocess.PIPE, text=True)
    line = ""
    while "recording" not in line:
        line = rec_proc.stderr.readline()
        assert line, "gpuscope ended early"
    target = subprocess.run([TARGETS / "cuda_ops", "--iterations", "2"])
    _, err = rec_proc.communicate(timeout=30)
    assert rec_proc.returncode == 0, err
    rec = Record(out, rec_proc)
    launches = dict(rec.query(
        "SELECT k.demangled, count(*) FROM calls c JOIN kernels k ON k.id=c.kernel_id "
        "JOIN processes p ON p.pid=c.pid WHERE p.comm='cuda_ops' AND c.parent_id IS NULL GROUP BY 1"))
    assert launches == {VECADD: 2, SCALE: 2}
    assert target.returncode == 3


def test_target_exiting_mid_record_leaves_complete_file(record, tmp_path):
    target = subprocess.Popen([TARGETS / "cuda_ops", "--sleep-ms", "2000", "--iterations", "1"])
    rec = record("--pid", target.pid, "--duration", 30)
    assert rec.returncode == 0, rec.stderr
    assert "exited" in rec.stderr
    assert rec.scalar("SELECT value FROM meta WHERE key='complete'") == "1"
    assert rec.count("cudaMalloc") == 3


def test_sigterm_is_forwarded_and_file_stays_readable(tmp_path, gpuscope):
    out = tmp_path / "term.gpuscope"
    proc = subprocess.Popen([GPUSCOPE, "record", "-o", out, "--", TARGETS / "cuda_ops",
                             "--iterations", "1", "--sleep-ms", "20000"], stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, err  # the command died of the forwarded signal
    assert gpuscope("report", out).returncode == 0


def test_killed_recorder_keeps_what_it_committed(tmp_path, gpuscope):
    out = tmp_path / "killed.gpuscope"
    # Far more iterations than 3 s allow (200,000 ran out in under 3 s on a fast machine, and the
    # recording then ended cleanly before the kill).
    proc = subprocess.Popen([GPUSCOPE, "record", "-o", out, "--", TARGETS / "cuda_ops",
                             "--iterations", "100000000"], stderr=subprocess.PIPE, text=True)
    time.sleep(3)
    proc.kill()
    proc.wait()
    subprocess.run(["pkill", "-f", "cuda_ops --iterations 100000000"])
    rep = gpuscope("report", "--json", out)
    assert rep.returncode == 0, rep.stderr
    doc = json.loads(rep.stdout)
    assert doc["summary"]["complete"] is False
    assert doc["kernels"]["launches"] > 0


@pytest.fixture
def stub_driver(tmp_path):
    """A directory whose libcuda.so.1 is the toolkit's driver stub: loadable, every call fails."""
    d = tmp_path / "stub-driver"
    d.mkdir()
    (d / "libcuda.so.1").symlink_to(CUDART.parent / "stubs" / "libcuda.so")
    return {**os.environ, "LD_LIBRARY_PATH": str(d)}


def test_driver_api_launches_recorded_with_shape_and_stack(record, stub_driver):
    rec = record("--", TARGETS / "driver_launch", env=stub_driver)
    assert rec.returncode == 0, rec.stderr
    rows = rec.query("SELECT grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_mem, kernel_handle, stack_id "
                     "FROM calls c JOIN functions f ON f.id=c.func WHERE f.name='cuLaunchKernel'")
    assert len(rows) == 3
    assert {r[:8] for r in rows} == {(7, 5, 3, 64, 2, 1, 1024, 0x1000)}
    assert all(r[8] is not None for r in rows)
    assert rec.scalar("SELECT ret FROM calls c JOIN functions f ON f.id=c.func WHERE f.name='cuCtxSynchronize'") == 34


def test_runtime_launch_probes_leave_once_the_driver_is_probed(record, stub_driver):
    # With probes: once libcuda is probed, launches are recorded by the driver's probe alone (one
    # trap per launch). The stub driver fails cuInit, so these launches never reach it.
    rec = record("--launch-probes", "probes", "--", TARGETS / "cuda_ops", env=stub_driver)
    assert rec.returncode == 3, rec.stderr
    assert rec.scalar("SELECT driver_probes FROM libraries WHERE path LIKE '%libcuda.so.1'") > 0
    assert rec.scalar("SELECT value FROM meta WHERE key='launch_probes'") == "driver once probed"
    assert rec.scalar("SELECT count(*) FROM meta WHERE key='runtime_launch_probes_removed_at_ns'") == 1
    assert rec.count("cudaLaunchKernel") == 0
    assert rec.count("cudaMalloc") == 3  # the other runtime probes stay

    both = record("--launch-probes", "both", "--", TARGETS / "cuda_ops", env=stub_driver)
    assert both.scalar("SELECT count(*) FROM meta WHERE key='runtime_launch_probes_removed_at_ns'") == 0
    assert both.count("cudaLaunchKernel") == 2

    # Without a driver the runtime's probes are the only ones that can see a launch: they stay,
    # with probes and in-process (the default for a command) alike.
    for mode in ("probes", "in-process"):
        alone = record("--launch-probes", mode, "--", TARGETS / "cuda_ops")
        assert alone.count("cudaLaunchKernel") == 2, mode
    # In-process with a driver: the runtime's probes go once it is probed, as with probes.
    rec = record("--", TARGETS / "cuda_ops", env=stub_driver)
    assert rec.scalar("SELECT value FROM meta WHERE key='launch_probes'") == "in-process"
    assert rec.scalar("SELECT count(*) FROM meta WHERE key='runtime_launch_probes_removed_at_ns'") == 1
    assert rec.count("cudaLaunchKernel") == 0


def test_floor_probes_trap_on_the_same_calls_and_record_none(record, tmp_path):
    # bench/gpu/attach_ab.py's "floor": the real probe set, running a program that does nothing.
    def program_runs(rec):
        assert rec.returncode == 3, rec.stderr
        return json.loads(rec.scalar("SELECT value FROM meta WHERE key='bpf_program_stats'"))
    real = program_runs(record("--bpf-stats", "--", TARGETS / "cuda_ops", "--iterations", 2))
    traps = sum(real[p]["runs"] for p in ("call_entry", "call_entry_emit", "call_return"))
    assert traps > 40
    rec = record("--floor-probes", "--bpf-stats", "--", TARGETS / "cuda_ops", "--iterations", 2)
    floor = program_runs(rec)
    assert rec.scalar("SELECT value FROM meta WHERE key='floor_probes'") == "1"
    assert rec.scalar("SELECT count(*) FROM calls") == 0
    assert not {"call_entry", "call_entry_emit", "call_return"} & set(floor)
    assert floor["calibration_hit"]["runs"] == traps
