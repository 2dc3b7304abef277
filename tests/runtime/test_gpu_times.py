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
