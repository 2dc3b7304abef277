"""Bad input gets one clear line and a non-zero exit."""
import os
import shutil
import subprocess

from conftest import CUDART, GPUSCOPE, TARGETS


def single_error_line(proc):
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert proc.returncode != 0
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("gpuscope: error: ")
    return lines[0]


def test_dead_pid(gpuscope):
    p = subprocess.Popen(["true"])
    p.wait()
    line = single_error_line(gpuscope("record", "-o", "/tmp/x.gpuscope", "--pid", p.pid))
    assert f"no process with PID {p.pid}" in line


def test_not_root(tmp_path):
    if shutil.which("setpriv") is None:
        return
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
                           str(GPUSCOPE), "record", "-o", str(tmp_path / "x"), "--", "true"],
                          capture_output=True, text=True)
    assert "root" in single_error_line(proc)


def test_unwritable_output(gpuscope):
    line = single_error_line(gpuscope("record", "-o", "/nonexistent-dir/run.gpuscope", "--", "true"))
    assert "cannot write the record file" in line


def test_command_not_found(gpuscope, tmp_path):
    line = single_error_line(gpuscope("record", "-o", tmp_path / "x", "--", "/no/such/program"))
    assert "cannot run" in line


def test_no_mode(gpuscope):
    assert "exactly one of" in single_error_line(gpuscope("record"))


def test_target_never_loads_cuda(gpuscope, tmp_path):
    proc = gpuscope("record", "-o", tmp_path / "x", "--", "sh", "-c", "exit 7")
    assert proc.returncode == 7
    assert "no CUDA library was loaded" in proc.stderr


def test_pid_without_cuda_waits_for_duration(gpuscope, tmp_path):
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        proc = gpuscope("record", "-o", tmp_path / "x", "--pid", sleeper.pid, "--duration", 1)
        assert proc.returncode == 0, proc.stderr
        assert "no CUDA library loaded yet" in proc.stderr
    finally:
        sleeper.kill()


def test_report_missing_file(gpuscope):
    assert "does not exist" in single_error_line(gpuscope("report", "/tmp/definitely-missing.gpuscope"))


def test_report_not_a_record(gpuscope, tmp_path):
    f = tmp_path / "text.gpuscope"
    f.write_text("hello\n" * 1000)
    assert "not a readable gpuscope record" in single_error_line(gpuscope("report", f))


def test_report_truncated_record(record, gpuscope, tmp_path):
    rec = record("--", TARGETS / "cuda_ops", "--iterations", 20)
    data = rec.path.read_bytes()
    cut = tmp_path / "cut.gpuscope"
    cut.write_bytes(data[: len(data) // 2])
    line = single_error_line(gpuscope("report", cut))
    assert "truncated" in line


def test_report_newer_version(record, gpuscope, tmp_path):
    import sqlite3
    rec = record("--", TARGETS / "cuda_ops")
    with sqlite3.connect(rec.path) as db:
        db.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    assert "upgrade gpuscope" in single_error_line(gpuscope("report", rec.path))


def test_output_that_is_not_a_regular_file_is_refused_and_left_alone(gpuscope, tmp_path):
    # gpuscope runs as root: -o /dev/null once replaced the device node with a record.
    before = os.stat("/dev/null")
    line = single_error_line(gpuscope("record", "-o", "/dev/null", "--", "true"))
    assert "'/dev/null' is not a regular file" in line
    after = os.stat("/dev/null")
    assert (after.st_ino, after.st_rdev, after.st_mode) == (before.st_ino, before.st_rdev, before.st_mode)
    empty = tmp_path / "dir"
    empty.mkdir()
    line = single_error_line(gpuscope("record", "-o", empty, "--", "true"))
    assert "is a directory" in line and empty.is_dir()
    assert "-o needs a file name" in single_error_line(gpuscope("record", "-o", "", "--", "true"))


def test_a_command_that_cannot_run_leaves_the_previous_record(gpuscope, tmp_path):
    prev = tmp_path / "prev.gpuscope"
    prev.write_bytes(b"an earlier record")
    line = single_error_line(gpuscope("record", "-o", prev, "--", "/no/such/program"))
    assert "cannot run" in line
    assert prev.read_bytes() == b"an earlier record"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prev.gpuscope"]  # no temporary file left


def test_duration_must_be_a_number_of_seconds(gpuscope, tmp_path):
    for bad in ("nan", "-1"):
        for cmd in (["record", "-o", tmp_path / "x", "--duration", bad, "--", "true"], ["agent", "--duration", bad]):
            line = single_error_line(gpuscope(*cmd))
            assert "--duration must be a number of seconds" in line, (cmd, line)


def test_a_duration_past_what_the_clock_reaches_is_no_limit(record):
    # Converted to nanoseconds as is, 1e12 s and inf overflowed into a deadline already past: the
    # recording stopped at once, rc 0, nothing recorded.
    for value in ("1e12", "inf"):
        rec = record("--duration", value, "--", "/usr/bin/python3", "-c",
                     "import ctypes, sys, time; time.sleep(0.3); rt = ctypes.CDLL(sys.argv[1]); "
                     "p = ctypes.c_void_p(); rt.cudaMalloc(ctypes.byref(p), 64)", CUDART)
        assert rec.returncode == 0, rec.stderr
        assert rec.count("cudaMalloc") == 1, (value, rec.stderr)


def test_messages_say_what_is_wrong(gpuscope, tmp_path):
    # Not "(not an error)", "stoll" or SQL: what is wrong with the file, in SQLite's words or ours.
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    assert "is not a readable gpuscope record (file is not a database)" in single_error_line(gpuscope("report", text))
    other = tmp_path / "other.db"
    subprocess.run(["sqlite3", other, "CREATE TABLE meta(key, value); INSERT INTO meta VALUES('format', 'x')"], check=True)
    assert "is not a readable gpuscope record (no such table: calls)" in single_error_line(gpuscope("report", other))
    # A record whose meta was damaged by hand.
    rec = tmp_path / "r.gpuscope"
    assert gpuscope("record", "-o", rec, "--", "true").returncode == 0
    subprocess.run(["sqlite3", rec, "UPDATE meta SET value = 'abc' WHERE key = 'start_ns'"], check=True)
    line = single_error_line(gpuscope("timeline", rec, "-o", tmp_path / "t.json"))
    assert "is damaged: its meta value start_ns is 'abc', not a whole number" in line
    # A config entry without a key.
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(": 5\n")
    assert f"{cfg}:1: an entry has no key name" in single_error_line(gpuscope("agent", "-c", cfg, "--duration", "1"))


def test_a_zombie_is_said_to_have_exited(gpuscope, tmp_path):
    p = subprocess.Popen(["true"])
    try:
        import time
        time.sleep(0.3)  # exited, not waited for: a zombie
        line = single_error_line(gpuscope("record", "-o", tmp_path / "x", "--pid", p.pid))
        assert f"PID {p.pid} has exited (a zombie its parent has not waited for yet)" in line
    finally:
        p.wait()


def test_the_agent_names_itself_when_not_root(tmp_path):
    if shutil.which("setpriv") is None:
        return
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
                           str(GPUSCOPE), "agent", "--duration", "1"], capture_output=True, text=True)
    assert "gpuscope agent needs root" in single_error_line(proc)
