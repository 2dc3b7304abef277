"""`gpuscope agent` under many short-lived processes: each brings new user stacks (address
space layout randomisation), walked in BPF and sent once per process, and CPU samples bring
kernel stacks, kept in BPF stack maps whose entries the kernel never frees, so the agent
recycles them. With a small map, far more distinct kernel stacks than it holds still get
captured, and no call is given another's stack (read back by Go's pprof)."""
import re
import subprocess
import time

from agent_util import launch_profile_top, series
from conftest import TARGETS

STACK_MAP_ENTRIES = 256  # the least the agent takes: recycled at 1/32 of it, 8 distinct stacks
PROCESSES = 300  # ~20 user stacks each (cuda_ops --iterations 1)


def assert_launches_all_from_work(top):
    """cuda_ops launches only from work(): a launch given another call's stack would show
    outside it. (flat flat% sum% cum cum% name)"""
    total = float(re.search(r"of (\d+(?:\.\d+)?) total", top).group(1))
    assert total >= 4, top  # two processes' launches at least
    work = next(line.split() for line in top.splitlines() if "::work(int)" in line)
    assert float(work[3]) == total, top
    assert "launch_kernels" in top, top


def test_short_lived_processes_do_not_fill_the_stack_maps(agent, tmp_path):
    a = agent(f"budget: 1\ngpu_sample_hz: 0\ncpu_profile_hz: 999\ninterval: 1s\n"
              f"stack_map_entries: {STACK_MAP_ENTRIES}\n")
    for i in range(PROCESSES):
        assert subprocess.run([TARGETS / "cuda_ops", "--iterations", "1"], capture_output=True,
                              timeout=60).returncode == 3
        if i in (PROCESSES // 2, PROCESSES - 1):
            # The launches of the last window, after many recycles, still have their own stacks.
            assert_launches_all_from_work(launch_profile_top(a, tmp_path))
    time.sleep(1.5)  # the health gauges are refreshed each second
    m = a.metrics()
    recycles = sum(series(m, "gpuscope_agent_stack_map_recycles_total"))
    records = sum(series(m, "gpuscope_agent_events_total"))
    lost = sum(series(m, "gpuscope_agent_lost_events_total", cause="stack"))
    expired = sum(series(m, "gpuscope_agent_lost_events_total", cause="stack_expired"))
    # The maps were switched many times over (a process's start and exit in the kernel bring
    # kernel stacks: a few samples each, 8 distinct stacks a recycle)...
    assert recycles >= 8, (recycles, a.stderr())
    # ...and kernel stacks are still captured: a new one is lost only when its bucket holds
    # another (-EEXIST), at the map's low occupancy.
    assert lost <= 0.1 * records, (lost, records)
    # No call here lasts across a recycle: its record would come too late to read its stack.
    assert expired <= 0.01 * records, (expired, records)
    assert a.stop() == 0
