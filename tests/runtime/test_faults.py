"""Faults in gpuscope itself never harm a target: whatever kills gpuscope, no process is left
stopped, and what was recorded stays readable."""
import os
import signal
import sqlite3
import subprocess
import sys
import time

from conftest import CUDART, GPUSCOPE


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
        guards = [p for p, comm in kids.items() if comm == "gpuscope-guard"]
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


def test_no_guardian_outlives_a_recording(record):
    # A normal end: the guardian exits with gpuscope (its pipe's end), leaving nothing behind.
    rec = record("--", "sleep", "0.2")
    assert rec.returncode == 0, rec.stderr
    left = subprocess.run(["pgrep", "-x", "gpuscope-guard"], capture_output=True, text=True).stdout.split()
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
