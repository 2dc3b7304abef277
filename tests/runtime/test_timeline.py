"""gpuscope timeline: the Chrome trace-event JSON that Perfetto and chrome://tracing open, read back
with Python's json module (not gpuscope's writer) and checked against the format's rules."""
import json
import os

from conftest import CUDART, ROOT, TARGETS

from test_python import LIBCUDA_STUB, PYTHON, SCRIPTS, marked_lines

FAKE_NVML = TARGETS / "fake-nvml"


def check_trace_event_format(doc):
    """The rules of the Trace Event Format (JSON object form) that viewers rely on."""
    assert isinstance(doc["traceEvents"], list)
    assert doc.get("displayTimeUnit") in ("ms", "ns")
    for e in doc["traceEvents"]:
        assert e["ph"] in ("X", "i", "C", "M", "s", "f"), e
        assert isinstance(e["name"], str) and e["name"], e
        assert isinstance(e["pid"], int), e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name") and isinstance(e["args"]["name"], str)
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        if e["ph"] in ("X", "i"):
            assert isinstance(e["tid"], int), e
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
        if e["ph"] == "i":
            assert e["s"] in ("t", "p", "g"), e
        if e["ph"] in ("s", "f"):
            assert isinstance(e["id"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "f":
            assert e["bp"] == "e", e
        if e["ph"] == "C":
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values()), e


def test_timeline_has_calls_samples_and_gpu_counters(record, gpuscope, tmp_path):
    env = {**os.environ, "LD_LIBRARY_PATH": str(FAKE_NVML)}
    script = str(SCRIPTS / "py_cuda.py")
    rec = record("--cpu-profile", 499, "--gpu-sample-hz", 50, "--", PYTHON, script, CUDART, LIBCUDA_STUB, env=env)
    assert rec.returncode == 0, rec.stderr
    out = tmp_path / "trace.json"
    run = gpuscope("timeline", rec.path, "-o", out)
    assert run.returncode == 0, run.stderr
    assert "ui.perfetto.dev" in run.stderr
    doc = json.loads(out.read_text())
    check_trace_event_format(doc)
    events = doc["traceEvents"]

    # Every recorded call is on its thread's track; calls with a return are slices.
    calls = [e for e in events if e["ph"] in ("X", "i") and e.get("cat") != "cpu_sample"]
    assert len(calls) == rec.scalar("SELECT count(*) FROM calls")
    mallocs = [e for e in calls if e["args"]["function"] == "cudaMalloc"]
    assert len(mallocs) == 3 and all(e["ph"] == "X" and e["dur"] > 0 for e in mallocs)
    at = marked_lines("py_cuda.py")
    assert all(e["args"]["python"] == f"allocate ({script}:{at['malloc']})" for e in mallocs)
    launches = [e for e in calls if e["cat"] == "launch"]
    assert len(launches) == 2
    assert launches[0]["args"]["grid"] == [4, 1, 1] and launches[0]["args"]["block"] == [32, 1, 1]

    # Tracks are named: the processes, each thread, each GPU.
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events if e["ph"] == "M"}
    pid = rec.scalar("SELECT pid FROM processes ORDER BY first_seen_ns LIMIT 1")
    assert names[(pid, None)] == f"python3 ({pid})"
    assert any(n.startswith("GPU 0 (NVML): Fake GPU 0") for n in names.values())

    # NVML readings are counter tracks.
    util = [e for e in events if e["ph"] == "C" and e["name"] == "utilisation %"]
    assert len(util) == rec.scalar("SELECT count(*) FROM gpu_samples")
    assert {e["args"]["gpu"] for e in util} == {40, 50}

    # A window keeps only what falls in it.
    first_ts = min(e["ts"] for e in calls) / 1e6
    late = json.loads(gpuscope("timeline", rec.path, "-o", "-", "--from", first_ts + 0.0001).stdout)
    check_trace_event_format(late)
    late_calls = [e for e in late["traceEvents"] if e["ph"] in ("X", "i") and e.get("cat") != "cpu_sample"]
    assert 0 < len(late_calls) < len(calls)


def test_timeline_of_cpu_samples(record, gpuscope):
    rec = record("--cpu-profile", 199, "--", PYTHON, SCRIPTS / "py_busy.py", 0.5)
    assert rec.returncode == 0, rec.stderr
    doc = json.loads(gpuscope("timeline", rec.path, "-o", "-").stdout)
    check_trace_event_format(doc)
    samples = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_sample"]
    assert len(samples) == rec.scalar("SELECT count(*) FROM samples")
    assert sum("spin (" in e["args"].get("python", "") for e in samples) > len(samples) / 2


def test_timeline_of_a_bad_file_is_one_line(gpuscope, tmp_path):
    bad = tmp_path / "bad.gpuscope"
    bad.write_text("not a record")
    run = gpuscope("timeline", bad, "-o", tmp_path / "t.json")
    assert run.returncode != 0
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
