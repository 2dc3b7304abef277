"""Faults in gpuscope itself never harm a target: whatever kills gpuscope, no process is left
stopped, and what was recorded stays readable."""
import contextlib
import ctypes
import os
import random
import shutil
import signal
import sqlite3
import struct
import subprocess
import sys
import time

from conftest import CUDART, GPUSCOPE, TARGETS


def children(pid):
    """{child pid: comm} of a process."""
    out = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            for c in f.read().split():
                try:
                    with open(f"/proc/{c}/comm") as g:
                        out[int(c)] = g.read().strip()
                except OSError:
                    pass
    return out


def state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def wait_for(what, timeout=20):
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        got = what()
        if got:
            return got
        time.sleep(0.02)
    return what()


def test_a_process_stopped_at_its_library_load_is_continued_when_gpuscope_is_killed(tmp_path):
    # The worst moment: the BPF side has stopped a process at its CUDA library's load and gpuscope,
    # which continues it once the probes are in place, is killed first (here: frozen, then kill -9;
    # a crash or the OOM killer are the same). With --all the process is any on the node.
    rec = subprocess.Popen([str(GPUSCOPE), "record", "--all", "-o", str(tmp_path / "r.gpuscope"), "--duration", "60"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    target = None
    try:
        for line in rec.stderr:  # ready once it says what it records
            if "recording every process" in line:
                break
        kids = children(rec.pid)
        guards = [p for p, comm in kids.items() if comm == "gs-guardian"]
        assert len(guards) == 1, kids
        os.kill(rec.pid, signal.SIGSTOP)
        target = subprocess.Popen([sys.executable, "-c", "import ctypes, sys; ctypes.CDLL(sys.argv[1]); print('loaded')",
                                   str(CUDART)], stdout=subprocess.PIPE, text=True)
        assert wait_for(lambda: state(target.pid) == "T", 10), "the target was not stopped at its library's load"
        os.kill(rec.pid, signal.SIGKILL)
        rec.wait()
        out, _ = target.communicate(timeout=10)
        assert target.returncode == 0 and out == "loaded\n", (target.returncode, out)
        # The guardian is gone too.
        assert wait_for(lambda: not os.path.exists(f"/proc/{guards[0]}"), 5)
    finally:
        for p in [rec] + ([target] if target else []):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_guardian_killed_alone_ends_the_stops(tmp_path):
    # The guardian killed while gpuscope lives (an operator, the OOM killer): were gpuscope to die
    # next, nothing would continue a process it held. gpuscope says so and stops no process from
    # then on: with gpuscope frozen, a process loading the CUDA library runs to its end.
    rec = subprocess.Popen([str(GPUSCOPE), "record", "--all", "-o", str(tmp_path / "r.gpuscope"), "--duration", "60"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for line in rec.stderr:
            if "recording every process" in line:
                break
        guards = [p for p, comm in children(rec.pid).items() if comm == "gs-guardian"]
        assert len(guards) == 1
        os.kill(guards[0], signal.SIGKILL)
        for line in rec.stderr:
            if "stop guardian is gone" in line:
                break
        else:
            raise AssertionError("gpuscope did not say that its guardian was gone")
        os.kill(rec.pid, signal.SIGSTOP)
        loader = subprocess.run([sys.executable, "-c", "import ctypes, sys; ctypes.CDLL(sys.argv[1]); print('loaded')",
                                 str(CUDART)], capture_output=True, text=True, timeout=20)
        assert loader.stdout == "loaded\n", loader
        os.kill(rec.pid, signal.SIGCONT)
        rec.terminate()
        assert rec.wait(timeout=30) == 0
    finally:
        if rec.poll() is None:
            os.kill(rec.pid, signal.SIGCONT)
            rec.kill()
            rec.wait()


def test_no_guardian_outlives_a_recording(record):
    # A normal end: the guardian exits with gpuscope (its pipe's end), leaving nothing behind.
    rec = record("--", "sleep", "0.2")
    assert rec.returncode == 0, rec.stderr
    left = subprocess.run(["pgrep", "-x", "gs-guardian"], capture_output=True, text=True).stdout.split()
    assert not left, left


CUDA_THEN_SLEEP = ("import ctypes, sys, time\n"
                   "rt = ctypes.CDLL(sys.argv[1])\n"
                   "p = ctypes.c_void_p()\n"
                   "for _ in range(3): rt.cudaMalloc(ctypes.byref(p), 4096)\n"
                   "print('called', flush=True)\n"
                   "time.sleep(60)\n")


def test_a_record_killed_with_kill_9_is_readable_from_its_one_file(tmp_path):
    # The main file alone, as a user copies it: every call made more than a checkpoint's interval
    # (1 s) before the kill is in it, with the schema; no -wal file needed.
    out = tmp_path / "r.gpuscope"
    rec = subprocess.Popen([str(GPUSCOPE), "record", "-o", str(out), "--", sys.executable, "-c", CUDA_THEN_SLEEP,
                            str(CUDART)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert rec.stdout.readline() == "called\n"
        time.sleep(2.5)
        rec.kill()
        rec.wait()
    finally:
        if rec.poll() is None:
            rec.kill()
            rec.wait()
        subprocess.run(["pkill", "-KILL", "-f", "for _ in range\\(3\\)"])
    copy = tmp_path / "copied" / "r.gpuscope"
    copy.parent.mkdir()
    copy.write_bytes(out.read_bytes())
    with sqlite3.connect(f"file:{copy}?mode=ro", uri=True) as db:
        n = db.execute("SELECT count(*) FROM calls c JOIN functions f ON f.id = c.func WHERE f.name = 'cudaMalloc'")
        assert n.fetchone()[0] == 3
        assert db.execute("SELECT value FROM meta WHERE key = 'complete'").fetchone() == ('0',)
    report = subprocess.run([str(GPUSCOPE), "report", str(copy)], capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    assert "cudaMalloc" in report.stdout


@contextlib.contextmanager
def small_disk(path, megabytes):
    """A file system of that size (tmpfs) at path, for as long as the block runs."""
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)])


def test_a_full_disk_stops_the_recording_not_the_command(tmp_path):
    # 400,000 launches over 4 s make a record far larger than the 24 MiB disk (16 of them held
    # aside by gpuscope until it fills). The command runs to its end and its exit code comes
    # through; the record holds what came before the disk filled, says so, and is one file.
    with small_disk(tmp_path / "small", 24) as disk:
        out = disk / "r.gpuscope"
        rec = subprocess.run([str(GPUSCOPE), "record", "-o", str(out), "--", str(TARGETS / "launch_count"), "400000",
                              "--over", "4"], capture_output=True, text=True, timeout=120)
        assert rec.returncode == 0, rec.stderr
        assert "launch_count: 400000 launches" in rec.stdout
        full = [line for line in rec.stderr.splitlines() if "is full" in line]
        assert len(full) == 1 and "recording stops here" in full[0], rec.stderr
        assert sorted(p.name for p in disk.iterdir()) == ["r.gpuscope"]
        with sqlite3.connect(f"file:{out}?mode=ro", uri=True) as db:
            calls = db.execute("SELECT count(*) FROM calls").fetchone()[0]
            dropped = db.execute("SELECT count FROM lost WHERE cause = 'disk_full'").fetchone()[0]
            assert db.execute("SELECT value FROM meta WHERE key = 'complete'").fetchone() == ("1",)
        assert calls > 1000 and dropped > 1000, (calls, dropped)
        report = subprocess.run([str(GPUSCOPE), "report", str(out)], capture_output=True, text=True)
        assert report.returncode == 0, report.stderr
        assert "disk_full" in report.stdout


def test_a_disk_too_full_to_begin_is_one_line_and_nothing_runs(tmp_path):
    with small_disk(tmp_path / "small", 8) as disk:
        marker = tmp_path / "ran"
        rec = subprocess.run([str(GPUSCOPE), "record", "-o", str(disk / "r.gpuscope"), "--", "touch", str(marker)],
                             capture_output=True, text=True, timeout=60)
        assert rec.returncode == 1
        lines = rec.stderr.strip().splitlines()
        assert len(lines) == 1 and "free some space or choose another place with -o" in lines[0], rec.stderr
        assert not marker.exists()
        assert list(disk.iterdir()) == []


def test_the_cuda_library_replaced_on_disk_while_attached(tmp_path):
    # A package upgrade under a running job: a new file is renamed over the library's path while
    # a process runs from the old one (probed through its inode) and before the next process
    # loads the new one. Every launch of both is recorded. Then the path is overwritten with
    # something that is no library at all before the report reads it: the report still works.
    lib = tmp_path / "lib"
    lib.mkdir()
    shutil.copy(CUDART, lib / CUDART.name)
    script = (f"{TARGETS / 'launch_count'} 20000 --over 2 & sleep 1; "
              f"cp {CUDART} {lib}/new && mv {lib}/new {lib / CUDART.name}; "
              f"{TARGETS / 'launch_count'} 1007; wait")
    out = tmp_path / "r.gpuscope"
    rec = subprocess.run([str(GPUSCOPE), "record", "-o", str(out), "--", "env", f"LD_LIBRARY_PATH={lib}", "bash", "-c",
                          script], capture_output=True, text=True, timeout=120)
    assert rec.returncode == 0, rec.stderr
    assert rec.stdout.count("launches") == 2, rec.stdout
    with sqlite3.connect(f"file:{out}?mode=ro", uri=True) as db:
        counts = sorted(n for (n,) in db.execute(
            "SELECT count(*) FROM calls c JOIN functions f ON f.id = c.func WHERE f.name = 'cudaLaunchKernel' "
            "GROUP BY c.pid"))
    assert counts == [1007, 20000], counts
    (lib / CUDART.name).write_bytes(b"not a library " * 4096)
    for cmd in (["report", str(out)], ["flamegraph", str(out), "--metric", "launches", "-o", str(tmp_path / "f.folded")]):
        res = subprocess.run([str(GPUSCOPE), *cmd], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr


def session_members(sid):
    """{pid: state} of the processes in session sid."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:
            out[int(entry)] = fields[0]
    return out


def test_kill_9_at_random_moments_of_a_recording(tmp_path):
    # Start-up, attaching, the record taking its place, checkpoints, the end: gpuscope killed at
    # a random moment of each run, 10 runs to one path. The command always runs to its end,
    # never stopped; the path always holds a readable record (from the first run that began on),
    # and the temporaries of runs killed early are gone once a later run to that path starts.
    rng = random.Random(30)
    out = tmp_path / "r.gpuscope"
    for _ in range(10):
        rec = subprocess.Popen([str(GPUSCOPE), "record", "-o", str(out), "--", str(TARGETS / "launch_count"), "2000",
                                "--over", "0.5"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
        time.sleep(rng.uniform(0, 1.0))
        rec.kill()
        rec.wait()
        left = wait_for(lambda: not session_members(rec.pid) or None, 30)
        assert left, f"still there 30 s after the kill: {session_members(rec.pid)}"
        if out.exists():
            with sqlite3.connect(f"file:{out}?mode=ro", uri=True) as db:
                assert db.execute("SELECT value FROM meta WHERE key = 'format'").fetchone() is not None
    rec = subprocess.run([str(GPUSCOPE), "record", "-o", str(out), "--", str(TARGETS / "launch_count"), "10"],
                         capture_output=True, text=True, timeout=60)
    assert rec.returncode == 0, rec.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.gpuscope"]


def files_made_in(directory, during):
    """The names of files created in a directory while `during()` runs (inotify)."""
    libc = ctypes.CDLL(None, use_errno=True)
    in_create, in_moved_to = 0x100, 0x80
    fd = libc.inotify_init1(os.O_NONBLOCK)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    try:
        assert libc.inotify_add_watch(fd, str(directory).encode(), in_create | in_moved_to) >= 0
        during()
        names, data = [], b""
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(fd, 65536):
                data += chunk
        while data:
            _wd, _mask, _cookie, size = struct.unpack_from("iIII", data)
            names.append(data[16:16 + size].rstrip(b"\0").decode())
            data = data[16 + size:]
        return names
    finally:
        os.close(fd)


def test_a_record_at_its_place_never_has_a_rollback_journal(tmp_path):
    # A -journal beside the record is hot once its writer is killed, and a read-only reader
    # cannot roll it back ("attempt to write a readonly database"): the record takes its place
    # and ends (replacing an earlier one too) without one.
    out = tmp_path / "r.gpuscope"

    def two_recordings():
        for _ in range(2):
            rec = subprocess.run([str(GPUSCOPE), "record", "-o", str(out), "--", str(TARGETS / "launch_count"), "10"],
                                 capture_output=True, text=True, timeout=60)
            assert rec.returncode == 0, rec.stderr

    made = files_made_in(tmp_path, two_recordings)
    assert "r.gpuscope" in made
    assert "r.gpuscope-journal" not in made, made
    with sqlite3.connect(f"file:{out}?mode=ro", uri=True) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # one file to copy around


def test_kill_9_of_the_agent_at_random_moments_leaves_no_process_stopped(agent):
    # Processes load the CUDA library over and over (each is held at the load while the agent
    # attaches) and the agent is killed at a random moment, 3 times: every loader finishes.
    rng = random.Random(31)
    loader = ("import ctypes, sys, time\n"
              "for _ in range(10):\n"
              "    ctypes.CDLL(sys.argv[1]); time.sleep(0.01)\n")
    for _ in range(3):
        a = agent("gpu_sample_hz: 0\n")
        loaders = [subprocess.Popen([sys.executable, "-c", f"import subprocess, sys\n"
                                     f"for _ in range(5): subprocess.run([sys.executable, '-c', {loader!r}, sys.argv[1]])",
                                     str(CUDART)], start_new_session=True) for _ in range(2)]
        time.sleep(rng.uniform(0.1, 1.5))
        a.proc.kill()
        a.proc.wait()
        for p in loaders:
            p.wait(timeout=60)
            assert p.returncode == 0
        assert wait_for(lambda: not guards() or None, 10), guards()  # each guardian ends within a second


def guards():
    """The stop guardians running on the host (none once every gpuscope is gone)."""
    out = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/comm") as f:
                if f.read().strip() == "gs-guardian" and state(int(entry)) != "Z":
                    out.append(int(entry))
        except (OSError, ValueError):
            pass
    return out
