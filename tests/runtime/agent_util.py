"""Running `gpuscope agent` in the runtime tests and reading what it serves: shared by
test_agent.py and test_stack_recycling.py (the `agent` fixture is in conftest.py)."""
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import contextlib
import time
import urllib.error
import urllib.request

import pytest

from conftest import GPUSCOPE


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, token=None, timeout=10):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read()


class Agent:
    def __init__(self, tmp_path, config, env=None, args=(), wrapper=()):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = tmp_path / "agent.yaml"
        self.config.write_text(f"listen: 127.0.0.1:{self.port}\n" + config)
        self.log = open(tmp_path / "agent.log", "w+")
        self.proc = subprocess.Popen([*wrapper, GPUSCOPE, "agent", "--config", self.config, *map(str, args)],
                                     stderr=self.log, env={**os.environ, **(env or {})})
        deadline = time.time() + 30
        while "serving /metrics" not in self.stderr():
            assert self.proc.poll() is None, f"agent exited: {self.stderr()}"
            assert time.time() < deadline, self.stderr()
            time.sleep(0.05)

    def stderr(self):
        self.log.flush()
        return pathlib.Path(self.log.name).read_text()

    def metrics(self, token=None):
        return parse_exposition(http_get(self.url + "/metrics", token)[1].decode())

    def wait_for(self, predicate, timeout=20, what="a condition"):
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = self.metrics()
            if predicate(m):
                return m
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}; agent said:\n{self.stderr()}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)
        self.log.close()
        return self.proc.returncode


def parse_exposition(text):
    """(name, frozenset(labels)) -> value, parsed here from the text format (Prometheus's own
    parser reads it in the tests that scrape with a real server)."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$', line)
        assert m, line
        labels = frozenset(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        out[(m.group(1), labels)] = float(m.group(4))
    return out


def series(metrics, name, **match):
    """Values of a metric's series whose labels include `match`."""
    return [v for (n, labels), v in metrics.items()
            if n == name and all((k, str(val)) in labels for k, val in match.items())]


def go_pprof_top(path, tmp_path, *args):
    if not shutil.which("go"):
        pytest.fail("Go's pprof (golang-go) reads the profiles: run ./run-tests.sh, which installs it")
    top = subprocess.run(["go", "tool", "pprof", "-top", "-nodecount=80", *args, str(path)], capture_output=True,
                         text=True, timeout=120,
                         env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "GOCACHE": str(tmp_path / "gocache")})
    assert top.returncode == 0, top.stderr
    return top.stdout


def fetch_profile(agent, path, token=None, timeout=20):
    """A profile the agent serves, waited for while it answers 404 (no window ended yet)."""
    deadline = time.time() + timeout
    while True:
        try:
            return http_get(agent.url + path, token)[1]
        except urllib.error.HTTPError as err:
            assert err.code == 404 and time.time() < deadline, err
            time.sleep(0.5)


def launch_profile_top(agent, tmp_path):
    """The last window's launch profile, as `go tool pprof -top -cum` reads it."""
    path = tmp_path / "launches.pb.gz"
    path.write_bytes(fetch_profile(agent, "/debug/pprof/cuda_launches"))
    return go_pprof_top(path, tmp_path, "-cum")


@contextlib.contextmanager
def process_churn():
    """Two shell loops starting /bin/true and ls, as on a busy node: processes start and exit
    around the ones under test all the time."""
    loops = [subprocess.Popen(["bash", "-c", cmd], start_new_session=True, stdout=subprocess.DEVNULL)
             for cmd in ("while :; do /bin/true; done", "while :; do ls / >/dev/null; done")]
    try:
        yield
    finally:
        for loop in loops:
            os.killpg(loop.pid, signal.SIGKILL)
            loop.wait()


def last_export_of(agent, proc, timeout=60):
    """What the agent exported last for `proc` (running), as {(name, labels): value} of its
    series: scraped every 50 ms until it has exited and its series are gone (an exited process
    is exported once more, then dropped), so the figures are those of its whole life."""
    last, deadline = None, time.time() + timeout
    while time.time() < deadline:
        m = agent.metrics()
        mine = {k: v for k, v in m.items() if ("pid", str(proc.pid)) in k[1]}
        if any(name == "gpuscope_kernel_launches_total" for name, _ in mine):
            last = mine
        elif last is not None and proc.poll() is not None:
            return last
        time.sleep(0.05)
    raise AssertionError(f"PID {proc.pid}: no final export within {timeout} s (last: {last}; none: it was never "
                         f"found, or found after it exited); agent said:\n{agent.stderr()}")
