"""NVML metrics: recorded and reported where NVML is there, a clear one-line notice where it is
not. CI has no NVIDIA driver: the first test is the real situation there; the others load the
stand-in library tests/targets/fake_nvml.c (the real one is checked on the GPU machine by
bench/gpu/nvml_check.py)."""
import json
import os

import pytest

from conftest import TARGETS

FAKE_NVML = TARGETS / "fake-nvml"


def has_real_nvml():
    return any(os.path.exists(os.path.join(d, "libnvidia-ml.so.1"))
               for d in ("/usr/lib/x86_64-linux-gnu", "/usr/local/nvidia/lib64", "/usr/lib64"))


@pytest.mark.skipif(has_real_nvml(), reason="this machine has NVML")
def test_without_nvml_the_recording_goes_on(record, gpuscope):
    rec = record("--", TARGETS / "busy_loop", 0.2)
    assert rec.returncode == 0, rec.stderr
    notices = [l for l in rec.stderr.splitlines() if "GPU metrics are off" in l]
    assert len(notices) == 1, rec.stderr
    assert "libnvidia-ml.so.1" in notices[0]
    assert rec.scalar("SELECT value FROM meta WHERE key = 'gpu_metrics'").startswith("off: ")
    assert rec.scalar("SELECT count(*) FROM gpu_samples") == 0
    text = gpuscope("report", rec.path).stdout
    assert "no GPU metrics: off: libnvidia-ml.so.1" in text


@pytest.fixture
def fake_nvml():
    return {**os.environ, "LD_LIBRARY_PATH": str(FAKE_NVML)}


def test_samples_processes_and_events_are_recorded(record, gpuscope, fake_nvml):
    rec = record("--gpu-sample-hz", 50, "--", TARGETS / "busy_loop", 1.5, env=fake_nvml)
    assert rec.returncode == 0, rec.stderr
    assert "GPU metrics are off" not in rec.stderr
    assert rec.scalar("SELECT value FROM meta WHERE key = 'gpu_metrics'") == "nvml, driver fake-1.0"
    assert rec.query("SELECT idx, uuid, name, memory_total, power_limit_mw FROM gpus ORDER BY idx") == [
        (0, "GPU-fake-0", "Fake GPU 0", 80 << 30, 700000), (1, "GPU-fake-1", "Fake GPU 1", 80 << 30, 700000)]
    # About 1.5 s at 50 Hz, each tick reading both GPUs.
    for gpu in (0, 1):
        n = rec.scalar("SELECT count(*) FROM gpu_samples WHERE gpu = ?", gpu)
        assert 50 <= n <= 100, n
    row = rec.query("SELECT gpu_util, mem_util, mem_used, power_mw, temperature_c, sm_clock_mhz, mem_clock_mhz, "
                    "throttle_reasons, pcie_tx_kbs, pcie_rx_kbs, ecc_corrected FROM gpu_samples WHERE gpu = 1 LIMIT 1")
    # GPU 1 has no PCIe counters and neither GPU has ECC: NULL, not zero.
    assert row == [(50, 20, 2 << 30, 200000, 55, 1980, 2619, 0x4, None, None, None)]
    assert rec.scalar("SELECT pcie_rx_kbs FROM gpu_samples WHERE gpu = 0 LIMIT 1") == 3000
    # The recorded command is the process NVML says uses GPU 0.
    pid = rec.scalar("SELECT pid FROM processes")
    assert rec.query("SELECT DISTINCT gpu, pid, sm_util, used_memory FROM gpu_process_samples") == [
        (0, pid, 35, 512 << 20)]
    assert rec.query("SELECT gpu, kind, value FROM gpu_events") == [(0, "xid", 79)]
    # GPM (GPU 0 only), read on the slow ticks (once a second) from the second on.
    assert rec.query("SELECT DISTINCT sm_active, sm_occupancy, tensor_active, dram_active FROM gpu_samples "
                     "WHERE gpu = 0 AND sm_active IS NOT NULL") == [(30.0, 15.0, 5.0, 25.0)]
    assert rec.scalar("SELECT count(sm_active) FROM gpu_samples WHERE gpu = 1") == 0

    doc = json.loads(gpuscope("report", "--json", rec.path).stdout)["gpus"]
    g0, g1 = doc["devices"]
    assert g0["gpu_util"]["mean"] == 40 and g1["gpu_util"]["max"] == 50
    assert g1["throttle_samples"] == {"sw_power_cap": g1["samples"]}
    assert g0["processes"][0]["pid"] == pid and g0["processes"][0]["recorded"]
    text = gpuscope("report", rec.path).stdout
    assert "GPU 0 Fake GPU 0 (GPU-fake-0)" in text
    assert "clocks held back by: sw_power_cap 100%" in text
    assert "XID 79 at" in text
    assert f"PID {pid} busy_loop: SM 35% mean, 35% max; memory 512.00 MiB max" in text
    assert "SMs active 30% mean (occupancy 15%), tensor cores 5%, DRAM bandwidth 25% (GPM; utilisation 40%" in text


def test_gpu_sampling_can_be_turned_off(record, fake_nvml):
    rec = record("--gpu-sample-hz", 0, "--", TARGETS / "busy_loop", 0.2, env=fake_nvml)
    assert rec.returncode == 0, rec.stderr
    assert rec.scalar("SELECT count(*) FROM gpus") == 0
    assert rec.scalar("SELECT value FROM meta WHERE key = 'gpu_metrics'") == "off (--gpu-sample-hz 0)"
