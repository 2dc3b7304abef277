"""Runtime tests: the real gpuscope, as root, tracing real CUDA programs built against the real libcudart."""
import os
import pathlib
import sqlite3
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("GPUSCOPE_BUILD", ROOT / "build"))
GPUSCOPE = BUILD / "gpuscope"
# The test programs (tests/targets): those of the build under test, or of another one (a
# sanitized gpuscope is tested on the programs of the ordinary build: tests/sanitizers.sh).
TARGETS = pathlib.Path(os.environ.get("GPUSCOPE_TARGETS", BUILD / "targets"))
CUDART = pathlib.Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "lib64" / "libcudart.so.13"


# The copy family built with --default-stream per-thread (copy_family_ptds): no per-thread forms
# exist of these.
NO_PER_THREAD = {"cudaMemcpyPeer", "cudaMemcpyPeerAsync"}


def per_thread(name):
    """The symbol a call of `name` reaches when built with --default-stream per-thread."""
    if name in NO_PER_THREAD:
        return name
    if name.startswith("cuda"):
        return name + ("_ptsz" if name.endswith("Async") else "_ptds")
    return name + ("_ptsz" if "Async" in name else "_ptds")


def pytest_collection_modifyitems(config, items):
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="runtime tests load BPF programs: run them as root")
        for item in items:
            item.add_marker(skip)


def folded(gpuscope, rec, metric):
    """The record's flame graph of `metric` in folded form: {frames, root first: value}."""
    out = gpuscope("flamegraph", rec.path, "--metric", metric, "-o", "-")
    assert out.returncode == 0, out.stderr
    stacks = {}
    for line in out.stdout.splitlines():
        path, value = line.rsplit(" ", 1)
        stacks[tuple(path.split(";"))] = int(value)
    return stacks


class Record:
    """A finished recording, read back with Python's own sqlite3 (not gpuscope's reader)."""

    def __init__(self, path, proc):
        self.path = path
        self.returncode = proc.returncode
        self.stderr = proc.stderr
        self.stdout = proc.stdout

    def query(self, sql, *args):
        with sqlite3.connect(self.path) as db:
            return db.execute(sql, args).fetchall()

    def scalar(self, sql, *args):
        rows = self.query(sql, *args)
        return rows[0][0] if rows else None

    def count(self, func, extra=""):
        return self.scalar(
            "SELECT count(*) FROM calls c JOIN functions f ON f.id = c.func WHERE f.name = ? " + extra, func)


@pytest.fixture
def record(tmp_path):
    def run(*args, timeout=120, **kw):
        out = tmp_path / "run.gpuscope"
        args = [str(a) for a in args]
        # Tests check each call's stack: every one is taken unless a test asks for sampling
        # (record's default takes them within a budget of the process's time, which a loaded
        # CI machine can make it sample).
        if not {"--stack-every", "--stack-budget"} & set(args):
            args = ["--stack-every", "1", *args]
        proc = subprocess.run([str(GPUSCOPE), "record", "-o", str(out), *args],
                              capture_output=True, text=True, timeout=timeout, **kw)
        return Record(out, proc)
    return run


@pytest.fixture
def gpuscope():
    def run(*args, timeout=60, **kw):
        return subprocess.run([str(GPUSCOPE), *map(str, args)], capture_output=True, text=True,
                              timeout=timeout, **kw)
    return run


@pytest.fixture
def agent(tmp_path):
    """Starts `gpuscope agent` with a config (agent_util.Agent); stops every one at the end."""
    from agent_util import Agent
    started = []

    def start(config="", **kw):
        a = Agent(tmp_path, config, **kw)
        started.append(a)
        return a
    yield start
    for a in started:
        a.stop()
