"""GPU times without a GPU (CI): the injection library the CUDA driver would load must leave the
program running whatever is missing, and record --gpu-times must say what it got. The GPU path
itself is checked on the GPU machine (bench/gpu/gpu_times_check.py)."""
import subprocess
import sys

from conftest import BUILD, TARGETS

INJECT = BUILD / "libgpuscope_inject.so"
# What the CUDA driver does at cuInit: load the library and call InitializeInjection.
LOADER = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); "
          "print('initialised:', lib.InitializeInjection()); print('program goes on')")


def inject(env_extra, tmp_path):
    env = {"PATH": "/usr/bin:/bin", **env_extra}
    return subprocess.run([sys.executable, "-c", LOADER, str(INJECT)], capture_output=True, text=True, env=env,
                          timeout=60)


def test_injection_library_degrades_cleanly(tmp_path):
    cases = [
        ({}, "GPUSCOPE_GPU_TRACE is not set"),
        ({"GPUSCOPE_GPU_TRACE": str(tmp_path), "GPUSCOPE_CUPTI": "/no/such/libcupti.so"},
         "GPUSCOPE_CUPTI=/no/such/libcupti.so could not be loaded: no GPU times"),
        # CUPTI is there, the GPU driver is not.
        ({"GPUSCOPE_GPU_TRACE": str(tmp_path)}, "no GPU times"),
    ]
    for env, message in cases:
        run = inject(env, tmp_path)
        assert run.returncode == 0, run.stderr
        assert run.stdout == "initialised: 1\nprogram goes on\n"
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (env, run.stderr)
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_record_gpu_times_without_a_driver(record):
    rec = record("--gpu-times", "--", TARGETS / "cuda_ops", "--iterations", 1)
    assert rec.returncode == 3, rec.stderr  # the command's own exit code, as without --gpu-times
    assert rec.count("cudaLaunchKernel") == 2
    assert rec.scalar("SELECT value FROM meta WHERE key = 'gpu_times'").startswith("none: no process wrote GPU times")
    assert rec.scalar("SELECT count(*) FROM gpu_activities") == 0


def test_gpu_times_need_a_command(gpuscope, tmp_path):
    run = gpuscope("record", "--gpu-times", "--pid", "1", "-o", tmp_path / "x")
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "--gpu-times works with record -- CMD" in lines[0], run.stderr
    assert "--gpu-trace-dir" in lines[0]


def gpu_trace_header(pid):
    """A gpu-PID.bin's gs_gpu_trace_header (src/inject/gpu_trace.h): CUPTI 13.0, no clock offset."""
    import struct
    return b"GSGPU01\0" + struct.pack("<IIq", pid, 13000, 0)


def gpu_trace_record(kind, start, end, name=b""):
    """One gs_gpu_record (src/inject/gpu_trace.h) and its name."""
    import struct
    return struct.pack("<HHIQQIIQII3I3I", kind, 0, 0, start, end, 7, 0, 0, 0, len(name), 4, 1, 1, 32, 1, 1) + name


def test_a_services_gpu_times_are_read_for_the_recording_window(tmp_path):
    """record --pid --gpu-trace-dir: a service started with the injection library writes its whole
    life's GPU times; the recording stores the window it recorded, for the processes it recorded,
    and leaves the files (still being written) alone. The file is written here as the library
    would (CI has no GPU)."""
    import time
    from conftest import GPUSCOPE
    traces = tmp_path / "traces"
    traces.mkdir()
    target = subprocess.Popen([TARGETS / "cuda_ops", "--sleep-ms", "1500", "--iterations", "1"])
    mine, other = traces / f"gpu-{target.pid}.bin", traces / "gpu-999999.bin"
    now = time.monotonic_ns()
    # Long before the recording: not stored.
    mine.write_bytes(gpu_trace_header(target.pid) +
                     gpu_trace_record(1, now - 100_000_000_000, now - 99_999_000_000, b"_Z6beforev"))
    other.write_bytes(gpu_trace_header(999999) + gpu_trace_record(1, now, now + 1000, b"_Z5otherv"))
    out = tmp_path / "svc.gpuscope"
    rec = subprocess.Popen([GPUSCOPE, "record", "-o", out, "--pid", str(target.pid), "--gpu-trace-dir", traces],
                           stderr=subprocess.PIPE, text=True)
    time.sleep(0.8)  # recording, the target still asleep
    t = time.monotonic_ns()
    with open(mine, "ab") as f:
        f.write(gpu_trace_record(1, t, t + 2000, b"_Z6duringi"))
    _, err = rec.communicate(timeout=60)
    target.wait(timeout=30)
    assert rec.returncode == 0, err
    import sqlite3
    db = sqlite3.connect(out)
    assert db.execute("SELECT name, end_ns - start_ns, pid FROM gpu_activities").fetchall() == [
        ("during(int)", 2000, target.pid)]
    summary = db.execute("SELECT value FROM meta WHERE key = 'gpu_times'").fetchone()[0]
    assert summary.startswith("cupti: 1 activities from 1 process(es)"), summary
    assert mine.exists() and other.exists()


def test_gpu_trace_dir_must_exist(gpuscope, tmp_path):
    run = gpuscope("record", "--pid", "1", "--gpu-trace-dir", tmp_path / "none", "-o", tmp_path / "x")
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "no such directory" in lines[0], run.stderr


def add_gpu_activities(rec):
    """What --gpu-times stores, made up for the two launches of a real recording (CI has no GPU):
    a 2 us kernel starting 1 us after each launch, on stream 7 (launches come microseconds apart:
    these do not overlap)."""
    import sqlite3
    with sqlite3.connect(rec.path) as db:
        launches = db.execute("SELECT c.id, c.pid, c.ts_ns FROM calls c JOIN functions f ON f.id = c.func "
                              "WHERE f.kind = 'launch' ORDER BY c.ts_ns").fetchall()
        for call_id, pid, ts in launches:
            db.execute("INSERT INTO gpu_activities(pid, kind, gpu, stream, start_ns, end_ns, name, call_id, grid_x, "
                       "grid_y, grid_z, block_x, block_y, block_z) VALUES(?, 'kernel', 0, 7, ?, ?, 'fake_kernel(int)', "
                       "?, 4, 1, 1, 32, 1, 1)", (pid, ts + 1000, ts + 3000, call_id))
    return launches


def test_gpu_time_in_flame_graph_report_and_timeline(record, gpuscope):
    import json
    from test_python import LIBCUDA_STUB, PYTHON, SCRIPTS, marked_lines
    from test_timeline import check_trace_event_format
    from conftest import CUDART
    script = str(SCRIPTS / "py_cuda.py")
    rec = record("--", PYTHON, script, CUDART, LIBCUDA_STUB)
    assert rec.returncode == 0, rec.stderr
    launches = add_gpu_activities(rec)
    assert len(launches) == 2
    at = marked_lines("py_cuda.py")

    # Flame graph: 2 us per kernel, under the Python line that launched it.
    out = gpuscope("flamegraph", rec.path, "--metric", "gpu-time", "-o", "-")
    assert out.returncode == 0, out.stderr
    [line] = out.stdout.splitlines()
    path, value = line.rsplit(" ", 1)
    assert int(value) == 4000
    assert f"Model.launch ({script}:{at['launch']});" in path and path.endswith(";fake_kernel(int)")

    # Report: busy time, the kernel with its Python line, the idle gap between the two kernels.
    doc = json.loads(gpuscope("report", "--json", rec.path).stdout)["gpu_time"]
    assert doc["kernel_ns"] == 4000
    [gpu] = doc["gpus"]
    assert gpu["busy_ns"] == 4000 and gpu["activities"] == 2
    [kernel] = doc["top_kernels"]
    assert kernel["name"] == "fake_kernel(int)" and kernel["launches"] == 2
    assert kernel["python"] == f"Model.launch ({script}:{at['launch']})"
    [gap] = gpu["longest_gaps"]
    assert gap["duration_ns"] == launches[1][2] - launches[0][2] - 2000
    # Busy share over the span the GPU was in use (first kernel to last); before it, start-up.
    span = launches[1][2] - launches[0][2] + 2000
    assert gpu["active_span_ns"] == span and abs(gpu["busy_share"] - 4000 / span) < 1e-9
    start = rec.scalar("SELECT value FROM meta WHERE key = 'start_ns'")
    assert gpu["startup_ns"] == launches[0][2] + 1000 - int(start) and gpu["startup_from"] == "command start"
    text = gpuscope("report", rec.path).stdout
    assert "GPU time (CUPTI): 4.0 µs in kernels" in text and "fake_kernel(int)" in text
    assert "start-up: " in text and "from the command's start to the first" in text

    # Timeline: the kernels on their stream's track, an arrow from each launch to its kernel.
    trace = json.loads(gpuscope("timeline", rec.path, "-o", "-").stdout)
    check_trace_event_format(trace)
    events = trace["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "gpu"]
    assert len(kernels) == 2 and {e["tid"] for e in kernels} == {7} and all(e["dur"] == 2 for e in kernels)
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(starts) == 2 and starts.keys() == ends.keys()
    for i, s in starts.items():
        assert abs(ends[i]["ts"] - s["ts"] - 1) < 1e-6 and ends[i]["pid"] == kernels[0]["pid"]


def test_record_warns_when_launches_went_untimed(record):
    """A CUPTI user that took the library's records over leaves a file with few kernels: record
    says that most launches have no GPU time. The process writes its file as the library would,
    then becomes the CUDA program (same PID), whose 1,200 launches are recorded."""
    # The file's bytes, with the header's PID field left to the process (it is known there alone).
    pid_at = 8  # after the magic
    content = gpu_trace_header(0) + gpu_trace_record(1, 1000, 3000, b"_Z6stolenv")
    writer = ("import os, struct, sys; b = bytearray.fromhex(sys.argv[1]); "
              f"b[{pid_at}:{pid_at + 4}] = struct.pack('<I', os.getpid()); "
              "open(os.path.join(os.environ['GPUSCOPE_GPU_TRACE'], f'gpu-{os.getpid()}.bin'), 'wb').write(b); "
              "os.execv(sys.argv[2], sys.argv[2:])")
    rec = record("--gpu-times", "--", sys.executable, "-c", writer, content.hex(), TARGETS / "cuda_ops",
                 "--iterations", 600)
    assert rec.returncode == 3, rec.stderr
    assert rec.count("cudaLaunchKernel") == 1200
    summary = rec.scalar("SELECT value FROM meta WHERE key = 'gpu_times'")
    assert summary.startswith("cupti: 1 activities from 1 process(es)"), summary
    assert "only 0 of 1200 kernel launches have a GPU time" in summary, summary
    assert "only 0 of 1200 kernel launches have a GPU time" in rec.stderr
