"""Host telemetry (bpf/host.bpf.c): where the target's threads spent their time, against what the
test made them do: spin beside a CPU hog on one CPU, sleep, fsync, wait for a slow child on a pipe."""
import subprocess
import sys
import time

from conftest import TARGETS

STATES = ("on_cpu_ns", "runnable_ns", "io_ns", "lock_ns", "fd_ns", "sleep_ns", "other_ns")


def by_thread(rec, pid):
    """{tid: {column: sum}} over the process's windows."""
    cols = ", ".join(f"sum({c})" for c in STATES)
    out = {}
    for tid, *sums in rec.query(f"SELECT tid, {cols} FROM thread_times WHERE pid = ? GROUP BY tid", pid):
        out[tid] = dict(zip(STATES, sums))
    return out


def test_windows_add_up_and_are_on_by_default(record):
    rec = record("--", sys.executable, "-c", "import time; time.sleep(0.3)")
    assert rec.returncode == 0, rec.stderr
    assert rec.scalar("SELECT value FROM meta WHERE key = 'host_telemetry'") == "1"
    rows = rec.query(f"SELECT end_ns - start_ns, {' + '.join(STATES)} FROM thread_times")
    assert rows
    # Each window's states sum to its length: every nanosecond is in exactly one.
    assert all(length == total for length, total in rows), rows[:5]
    # The sleep is seen as such, and the thread's last window says it exited.
    assert rec.scalar("SELECT sum(sleep_ns) FROM thread_times") >= 290e6
    assert rec.scalar("SELECT count(*) FROM thread_times WHERE state = 'exited'") >= 1


def test_time_in_the_kernel_is_told_from_the_threads_own(record):
    # One second copying /dev/zero into a buffer (the kernel's work: system time), a pause, one
    # second computing in Python (user time). Tick-sampled where the kernel does not account exactly.
    script = (
        "import os, time\n"
        "fd = os.open('/dev/zero', os.O_RDONLY); buf = bytearray(1 << 20)\n"
        "end = time.monotonic() + 1.0\n"
        "while time.monotonic() < end: os.readv(fd, [buf])\n"
        "time.sleep(0.3)\n"
        "end = time.monotonic() + 1.0\n"
        "x = 0\n"
        "while time.monotonic() < end: x += sum(range(1000))\n")
    rec = record("--", sys.executable, "-c", script)
    assert rec.returncode == 0, rec.stderr
    rows = rec.query("SELECT on_cpu_ns, sys_ns, sleep_ns FROM thread_times WHERE tid = pid ORDER BY start_ns")
    assert all(sys_ns <= on_cpu for on_cpu, sys_ns, _ in rows), rows
    # The pause parts the two: the windows before the one that slept, and after it.
    pause = max(range(len(rows)), key=lambda i: rows[i][2])
    first, second = rows[:pause], rows[pause + 1:]
    assert first and second, rows
    in_kernel = sum(r[1] for r in first) / sum(r[0] for r in first)
    computing = sum(r[1] for r in second) / sum(r[0] for r in second)
    assert in_kernel > 0.6, (in_kernel, computing)
    assert computing < 0.2, (in_kernel, computing)


def test_off_with_no_host_telemetry(record):
    rec = record("--no-host-telemetry", "--", "true")
    assert rec.returncode == 0, rec.stderr
    assert rec.scalar("SELECT value FROM meta WHERE key = 'host_telemetry'") == "0"
    assert rec.scalar("SELECT count(*) FROM thread_times") == 0


def test_waiting_behind_a_cpu_hog_names_the_hog(record, tmp_path):
    # A hog that is not traced, on the same CPU as the traced program.
    hog = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.2)
        rec = record("--", "taskset", "-c", "0", TARGETS / "busy_loop", "1.0")
    finally:
        hog.kill()
        hog.wait()
    assert rec.returncode == 0, rec.stderr
    pid = rec.scalar("SELECT pid FROM threads WHERE comm = 'busy_loop'")
    [t] = by_thread(rec, pid).values()
    # Two programs sharing a CPU: the traced one waited for about as long as it ran.
    assert t["runnable_ns"] > 0.3 * (t["on_cpu_ns"] + t["runnable_ns"]), t
    # ... behind the hog, named with its pid.
    names = rec.query("SELECT waited_for_pid, sum(waited_ns) FROM thread_times WHERE pid = ? AND waited_ns > 0 "
                      "GROUP BY 1 ORDER BY 2 DESC", pid)
    assert names[0][0] == hog.pid, names


def test_fsync_is_io_and_a_slow_pipe_is_fd_wait_woken_by_the_writer(record, tmp_path):
    script = tmp_path / "waits.py"
    script.write_text(f"""
import os, time
path = {str(tmp_path / 'data')!r}
with open(path, 'wb') as f:
    for _ in range(20):
        f.write(os.urandom(1 << 20))
        f.flush()
        os.fsync(f.fileno())
r, w = os.pipe()
child = os.fork()
if child == 0:
    os.close(r)
    for _ in range(5):
        time.sleep(0.08)
        os.write(w, b'x')
    os._exit(0)
os.close(w)
while os.read(r, 1):
    pass
os.waitpid(child, 0)
""")
    rec = record("--", sys.executable, str(script))
    assert rec.returncode == 0, rec.stderr
    pids = [p for (p,) in rec.query("SELECT pid FROM processes WHERE comm LIKE 'python%' ORDER BY first_seen_ns")]
    parent, child = pids[0], pids[-1]
    assert parent != child
    main = by_thread(rec, parent)[parent]
    assert main["io_ns"] > 0, main           # fsync waits uninterruptibly
    assert main["fd_ns"] >= 0.3e9, main      # five writes 80 ms apart
    # The child, followed as the target's child, slept between its writes and woke the parent.
    assert by_thread(rec, child)[child]["sleep_ns"] >= 0.3e9
    wakers = {w for (w,) in rec.query("SELECT waker_pid FROM thread_times WHERE pid = ? AND fd_ns > 0", parent)}
    assert child in wakers, wakers
