"""--call-stacks eh-frame / --sample-unwind eh-frame: user stacks walked in BPF from tables compiled
from .eh_frame reach the program's entry through code built without frame pointers."""
import re

import pytest

from conftest import CUDART, ROOT, TARGETS, folded

WORK = "(anonymous namespace)::work(int)"
# Tests of what the BPF walker does make their first CUDA call after this long: until the
# walker's programs are loaded (in the background, a few hundred ms), stacks go as copies that
# user space unwinds (test_stacks_are_whole_before_the_walker_and_tables_are_in).
WALKER_LOADED_MS = 2000


def walk_counts(rec, key, names):
    """The figures of meta `key` (what record prints of its walks), in order, named by `names`."""
    text = rec.scalar(f"SELECT value FROM meta WHERE key='{key}'")
    assert text, key
    figures = [float(n) for n in re.findall(r"[0-9]+(?:\.[0-9]+)?", text)]
    assert len(figures) == len(names), text
    return dict(zip(names, figures))


EH_WALK = ("walks", "frames", "reused_pct", "rows_cached", "rows_searched", "pages")
FP_WALK = ("walks", "frames", "pages")


def call_stacks(gpuscope, rec):
    """Launches' and copies' stacks, root first (allocations fail without a driver: no bytes)."""
    out = {}
    for metric in ("launches", "memcpy-bytes"):
        out.update(folded(gpuscope, rec, metric))
    return out


def lost(rec):
    return dict(rec.query("SELECT cause, count FROM lost WHERE count > 0"))


def test_call_stacks_reach_start_without_frame_pointers(record, gpuscope):
    rec = record("--call-stacks", "eh-frame", "--", TARGETS / "cuda_ops_nofp", "--iterations", 2,
                 "--sleep-ms", WALKER_LOADED_MS)
    assert rec.returncode == 3, rec.stderr
    assert rec.scalar("SELECT value FROM meta WHERE key='call_unwinding'") == "eh-frame"
    assert "unwind tables:" in rec.stderr
    # Every call that takes a stack has one (registrations and lookups take none).
    assert rec.scalar("SELECT count(*) FROM calls c JOIN functions f ON f.id=c.func "
                      "WHERE c.stack_id IS NULL AND f.kind NOT IN ('kernel_lookup')") == 0
    stacks = call_stacks(gpuscope, rec)
    assert len(stacks) >= 6
    for chain in stacks:
        # The whole known chain: the C library's start code, main, the program's functions,
        # into libcudart (built without frame pointers too).
        assert chain[1] == "_start", chain
        assert chain.index("__libc_start_main") < chain.index("main") < chain.index(WORK), chain
        assert "[truncated stack]" not in chain, chain
    launches = folded(gpuscope, rec, "launches")
    assert sum(launches.values()) == 4
    assert all(k.index(WORK) < k.index("cudaLaunchKernel") for k in launches)
    assert any(f.startswith("(anonymous namespace)::launch_kernels") for k in launches for f in k)
    assert not {c for c in lost(rec) if c.startswith("unwind_")}, lost(rec)

    eh = walk_counts(rec, "unwind_walks", EH_WALK)  # before the next record takes its file

    # Frame pointers stop inside the program: none of those chains reaches main.
    fp = record("--call-stacks", "fp", "--", TARGETS / "cuda_ops_nofp", "--iterations", 2)
    fp_stacks = call_stacks(gpuscope, fp)
    assert fp_stacks and not any("main" in k for k in fp_stacks)
    assert max(map(len, fp_stacks)) < min(map(len, stacks))
    # What each kind of walk did, as record reports it: the frame-pointer chain is shorter.
    fpw = walk_counts(fp, "fp_walks", FP_WALK)
    assert eh["walks"] >= 6 and fpw["walks"] >= 6, (eh, fpw)
    assert fpw["frames"] < eh["frames"], (eh, fpw)
    assert 1 <= fpw["pages"] <= eh["pages"], (eh, fpw)


def test_many_threads_each_reach_their_entry(record, gpuscope):
    rec = record("--call-stacks", "eh-frame", "--", TARGETS / "cuda_ops_nofp", "--threads", 4, "--iterations", 20)
    assert rec.returncode == 3, rec.stderr
    assert rec.scalar("SELECT count(DISTINCT tid) FROM calls") == 4
    launches = folded(gpuscope, rec, "launches")
    assert sum(launches.values()) == 4 * 20 * 2
    for chain in launches:
        assert "[truncated stack]" not in chain, chain
        # The main thread from _start, the others from the C library's thread entry (clone3,
        # start_thread: unnamed in Debian's stripped libc, one frame named by the library) through
        # libstdc++'s std::thread.
        assert (chain[1] == "_start" and "main" in chain) or (
            chain[1] == "libc.so.6" and chain[2].startswith("libstdc++")), chain
        assert WORK in chain
    assert sum(v for k, v in launches.items() if "main" not in k) == 3 * 20 * 2
    assert not {c for c in lost(rec) if c.startswith("unwind_") or c == "ringbuf_full"}, lost(rec)


def test_library_loaded_late_gets_its_table(record):
    # Python maps libcudart through ctypes long after it started: the walk goes from libcudart
    # through ctypes and the interpreter (no frame pointers in Debian's) to the program's entry.
    rec = record("--call-stacks", "eh-frame", "--no-python", "--", "/usr/bin/python3",
                 ROOT / "tests/targets/late_dlopen.py", CUDART)
    assert rec.returncode == 0, rec.stderr
    modules = [m for (m,) in rec.query(
        "SELECT m.path FROM calls c JOIN functions f ON f.id = c.func JOIN stack_frames sf ON sf.stack_id = c.stack_id "
        "LEFT JOIN modules m ON m.id = sf.module_id WHERE f.name = 'cudaMalloc' ORDER BY sf.depth")]
    assert modules and "libcudart" in modules[0], modules
    assert "[truncated]" not in modules, modules
    assert any("_ctypes" in m for m in modules) and any("libffi" in m for m in modules), modules
    # The outermost frames: the interpreter's main, the C library's start, _start in the executable.
    assert "python3" in modules[-1] and "libc.so" in modules[-2], modules
    assert len(modules) > 12, modules


def alike_callers_paths(launches):
    """alike_callers' launches by (caller, depth), each chain checked whole."""
    by_path = {}
    for chain, count in launches.items():
        assert chain[1] == "_start" and "[truncated stack]" not in chain, chain
        via = [f for f in chain if "via_left" in f or "via_right" in f]
        assert len(via) == 1, chain
        nests = sum("nest" in f for f in chain)
        assert chain.index("main") < chain.index(via[0]) < chain.index("cudaLaunchKernel"), chain
        key = ("left" if "via_left" in via[0] else "right", nests - 1)
        by_path[key] = by_path.get(key, 0) + count
    return by_path


def table_figures(rec):
    """What record says of its tables: files made when their process was seen, when a walk
    needed them, and mapped files never needed."""
    text = rec.scalar("SELECT value FROM meta WHERE key='unwind_tables'")
    at_sight = int(re.search(r"(\d+) when their process was seen", text).group(1))
    on_demand = int(re.search(r"(\d+) when a walk needed them", text).group(1))
    never = int(re.search(r"(\d+) mapped files never needed", text).group(1))
    return at_sight, on_demand, never


def test_stacks_are_whole_before_the_walker_and_tables_are_in(record, gpuscope, tmp_path):
    # The default, with no table in the cache and the first launch at once: the first stacks
    # go as copies that user space unwinds, until the walker's programs and the tables are in.
    # Every stack is whole either way, and each caller is told apart.
    n = 600
    rec = record("--unwind-cache", tmp_path / "tables", "--", TARGETS / "alike_callers", n)
    assert rec.returncode == 0, rec.stderr
    assert rec.scalar("SELECT value FROM meta WHERE key='call_unwinding'") == "eh-frame"
    copies = rec.scalar("SELECT value FROM meta WHERE key='unwind_copies'")
    assert copies and int(copies.split()[0]) > 0, copies
    by_path = alike_callers_paths(folded(gpuscope, rec, "launches"))
    assert by_path == {(side, depth): n // 6 for side in ("left", "right") for depth in range(3)}, by_path
    assert not {c for c in lost(rec) if c.startswith("unwind_")}, lost(rec)


def test_tables_are_made_for_the_files_walks_need(record, gpuscope, tmp_path):
    # The interpreter and the C library get their tables when the process is seen; the CUDA
    # stand-in ctypes loads late, _ctypes and libffi when a stack first goes through them; the
    # interpreter's other libraries never. Once they are in, the driver's memsets are walked
    # whole from the tables, through all of them to the Python line that called.
    batches = 20
    # Runtime probes kept (--launch-probes both): a driver call's stack taken while its runtime
    # caller's return probe outlives its entry probe (their removal) has the kernel's return
    # trampoline for a frame, which no table covers.
    rec = record("--launch-probes", "both", "--unwind-cache", tmp_path / "tables", "--", "/usr/bin/python3",
                 ROOT / "tests/targets/load_lib.py",
                 "--sleep-ms", WALKER_LOADED_MS, TARGETS / "libnested_driver.so", "run_memsets", batches)
    assert rec.returncode == 0, rec.stderr
    at_sight, on_demand, never = table_figures(rec)
    assert at_sight >= 2 and on_demand >= 3 and never >= 1, (at_sight, on_demand, never)
    walks = walk_counts(rec, "unwind_walks", EH_WALK)
    assert walks["walks"] >= batches * 10 // 2, walks
    memsets = rec.query("SELECT c.stack_id FROM calls c JOIN functions f ON f.id = c.func "
                        "WHERE f.kind = 'memset' AND c.parent_id IS NULL")
    assert len(memsets) == batches * 10 and all(s for (s,) in memsets), memsets[:5]
    for (stack,) in set(memsets):
        frames = rec.query("SELECT m.path, p.function FROM stack_frames sf LEFT JOIN modules m ON m.id = sf.module_id "
                           "LEFT JOIN python_frames p ON m.path = '[python]' AND p.id = sf.offset "
                           "WHERE sf.stack_id = ? ORDER BY sf.depth", stack)
        paths = [path or "" for path, _ in frames]
        assert any(p.endswith("libnested_driver.so") for p in paths), frames
        assert any("_ctypes" in p for p in paths) and any("libffi" in p for p in paths), frames
        assert "<module>" in [fn for _, fn in frames] and "[truncated]" not in paths, frames


def test_frames_kept_from_the_last_walk_are_not_taken_for_other_callers(record, gpuscope):
    # Each launch's own frames lie where the last launch's did, but the callers above them
    # alternate (two look-alike callers, three depths): the walk may reuse the thread's last walk
    # only where the stack still holds what it held, so each launch keeps its own chain.
    n = 600
    rec = record("--call-stacks", "eh-frame", "--", TARGETS / "alike_callers", n, WALKER_LOADED_MS)
    assert rec.returncode == 0, rec.stderr
    by_path = alike_callers_paths(folded(gpuscope, rec, "launches"))
    # i % 2 picks the caller and (i / 2) % 3 the depth: every pair n / 6 times.
    assert by_path == {(side, depth): n // 6 for side in ("left", "right") for depth in range(3)}, by_path
    # The same few call sites over and over: steps come from the last walk or the row cache, and
    # the tables are searched only for what neither holds.
    w = walk_counts(rec, "unwind_walks", EH_WALK)
    assert w["walks"] >= n and w["reused_pct"] > 0, w
    assert w["rows_cached"] > w["rows_searched"], w
    assert w["rows_cached"] + w["rows_searched"] <= w["frames"] * (1 - w["reused_pct"] / 100) + 0.1, w


@pytest.mark.parametrize("target", ["busy_loop", "busy_loop_nofp"])
def test_cpu_samples_walked_from_tables(record, gpuscope, target):
    rec = record("--cpu-profile", 199, "--sample-unwind", "eh-frame", "--", TARGETS / target, 1)
    assert rec.returncode == 0, rec.stderr
    assert rec.scalar("SELECT value FROM meta WHERE key='sample_unwinding'") == "eh-frame"
    stacks = folded(gpuscope, rec, "cpu")
    total = sum(stacks.values())
    assert total > 100

    def share(frame):
        return sum(v for k, v in stacks.items() if frame in k) / total
    assert share("main") > 0.95 and share("_start") > 0.95, [k for k in stacks if "main" not in k][:3]
    spin = [k for k in stacks if "spin_in_user_space" in k]
    assert spin and all(k.index("main") < k.index("spin_in_user_space") for k in spin)
    assert share("spin_in_user_space") > 0.5
    reads = [k for k in stacks if "read_from_dev_zero" in k]
    assert reads and all(k.index("main") < k.index("read_from_dev_zero") for k in reads)
    assert share("[truncated stack]") < 0.03


def test_deep_recursion_is_walked_whole(record, gpuscope):
    # 100 frames of recursion: deeper than the 16 KiB a dwarf copy holds, not than the walker goes.
    rec = record("--cpu-profile", 199, "--sample-unwind", "eh-frame", "--", TARGETS / "deep_stack")
    assert rec.returncode == 0, rec.stderr
    stacks = folded(gpuscope, rec, "cpu")
    spinning = {k: v for k, v in stacks.items() if "recurse" in k}
    assert sum(spinning.values()) / sum(stacks.values()) > 0.8
    whole = {k: v for k, v in spinning.items() if "[truncated stack]" not in k}
    assert sum(whole.values()) / sum(spinning.values()) > 0.95, list(spinning)[:2]
    # Every whole stack reaches the program's start; all but a sample or two hold the 101 frames.
    # A sample can land in the descent (CI, fresh clone: one of ~100 held 16 frames, main on down,
    # whole): the process preempted on its way down is sampled where it resumes.
    for k in whole:
        assert k[1] == "_start" and k.count("recurse") >= 1, k
    deepest = sum(v for k, v in whole.items() if k.count("recurse") == 101)
    assert deepest / sum(whole.values()) > 0.95, list(whole)[:2]


@pytest.mark.parametrize("alive_ms", [0, 400])
def test_a_stack_copy_over_pages_never_touched_is_unwound_whole(record, gpuscope, alive_ms):
    # A copy of the stack is what is unwound until a table is made (and always with dwarf). A
    # frame with 12 KiB of locals it never writes, on a fresh thread's stack, leaves pages unmapped
    # between its callee's frame and its own return address: the copy cannot read them at the probe. (On a
    # loaded 2-core machine, CPython's main thread had such a page under its outermost frames,
    # and the copy, cut to the 2 KiB before it, lost main and the C library's start.) The pages
    # are read from the live stack, or taken as the zeros they hold once the process is gone.
    rec = record("--call-stacks", "dwarf", "--", TARGETS / "sparse_stack", CUDART, alive_ms)
    assert rec.returncode == 0, rec.stderr
    [(stack, nbytes)] = folded(gpuscope, rec, "memcpy-bytes").items()
    assert nbytes == 64
    # The thread's start (in the C library) to the call: whole, no frame missing.
    assert stack[1:] == ("libc.so.6", "worker", "under_sparse_frame", "cudaMemcpy", "HtoH (pageable)"), stack
    holes = rec.scalar("SELECT value FROM meta WHERE key='stack_copy_holes'")
    m = re.match(r"(\d+) pieces of stack copies not mapped at the probe: (\d+) read from the live stack, "
                 r"(\d+) taken as zeros", holes or "")
    assert m and int(m[1]) >= 1, holes
    # Read back while the program sleeps after the call. Gone at once, zeros, unless gpuscope
    # read them before it could exit (on CI once, 2 of 2 read live): every piece is one or the other.
    if alive_ms:
        assert int(m[2]) == int(m[1]), holes
    else:
        assert int(m[2]) + int(m[3]) == int(m[1]), holes


def test_compiled_tables_are_read_back_from_the_cache(record, gpuscope, tmp_path):
    # A second run of the same program reads its libraries' tables back (by build id) and walks
    # the same stacks; an unusable cache directory only means compiling again.
    cache = tmp_path / "tables"

    def run(cache_dir):
        rec = record("--call-stacks", "eh-frame", "--unwind-cache", cache_dir, "--",
                     TARGETS / "cuda_ops_nofp", "--iterations", 2)
        assert rec.returncode == 3, rec.stderr
        tables = rec.scalar("SELECT value FROM meta WHERE key='unwind_tables'")
        stacks = {chain[1:]: v for chain, v in call_stacks(gpuscope, rec).items()}  # without "comm (pid)"
        return int(tables.split(" from the cache")[0].rsplit("(", 1)[1]), stacks

    cached, stacks = run(cache)
    assert cached == 0
    files = len(list(cache.glob("*.gsut")))
    assert files >= 3  # the program, libcudart, libc, ...
    cached, again = run(cache)
    assert cached == files
    assert again == stacks
    cached, unusable = run("/proc/no-such-dir")
    assert cached == 0 and unusable == stacks
