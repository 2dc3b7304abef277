"""Python frames: CUDA calls and CPU samples of CPython processes show the Python functions and
lines that made them, merged with the native stack where the interpreter runs them."""
import functools
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from conftest import CUDART, ROOT, TARGETS, folded

SCRIPTS = ROOT / "tests" / "targets"
# Debian's own interpreter (3.11 on Debian 12) where there is one: the one users run.
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
LIBCUDA_STUB = CUDART.parent / "stubs" / "libcuda.so"


def interpreters():
    """Debian's interpreter, and other CPython versions where this machine has them (pyenv's, or
    GPUSCOPE_TEST_PYTHONS=path:path): CI's fresh Debian 12 has 3.11 only."""
    found = [PYTHON]
    extra = [p for p in os.environ.get("GPUSCOPE_TEST_PYTHONS", "").split(":") if p]
    extra += [str(p) for p in sorted(pathlib.Path.home().glob(".pyenv/versions/3.1[02-9]*/bin/python3"))]
    for p in extra:
        if os.access(p, os.X_OK) and p not in found:
            found.append(p)
    return found


@functools.cache
def minor_version(python):
    return int(subprocess.run([python, "-c", "import sys; print(sys.version_info[1])"], capture_output=True,
                              text=True, check=True).stdout)


def named(python, qualname):
    """A function's name as gpuscope shows it: its qualname, or before 3.11 (whose code objects
    have none) its name."""
    return qualname.rsplit(".", 1)[-1] if minor_version(python) < 11 else qualname


def marked_lines(script):
    """{"malloc": 16, ...} from the script's "# line: NAME" comments."""
    lines = {}
    for n, text in enumerate((SCRIPTS / script).read_text().splitlines(), 1):
        m = re.search(r"# line: (\w+)", text)
        if m:
            lines[m.group(1)] = n
    return lines


def python_stacks(rec, func):
    """Per call of `func`: its Python frames, innermost first, as (function, file, line)."""
    rows = rec.query(
        "SELECT c.id, p.function, p.file, p.line FROM calls c JOIN functions f ON f.id = c.func "
        "JOIN stack_frames sf ON sf.stack_id = c.stack_id JOIN modules m ON m.id = sf.module_id AND m.path = '[python]' "
        "JOIN python_frames p ON p.id = sf.offset WHERE f.name = ? ORDER BY c.id, sf.depth", func)
    stacks = {}
    for call, *frame in rows:
        stacks.setdefault(call, []).append(tuple(frame))
    return list(stacks.values())


@pytest.mark.parametrize("python", interpreters())
def test_cuda_calls_show_python_functions_and_lines(record, gpuscope, python):
    script = str(SCRIPTS / "py_cuda.py")
    rec = record("--", python, script, CUDART, LIBCUDA_STUB)
    assert rec.returncode == 0, rec.stderr
    assert "runs Python 3." in rec.stderr
    at = marked_lines("py_cuda.py")

    mallocs = python_stacks(rec, "cudaMalloc")
    assert len(mallocs) == 3
    expected = [("allocate", script, at["malloc"]), (named(python, "Model.step"), script, at["step"]),
                ("main", script, at["main"]), ("<module>", script, at["module"])]
    assert all(s == expected for s in mallocs), mallocs

    # Through the driver API, from a method.
    launches = python_stacks(rec, "cuLaunchKernel")
    assert len(launches) == 2
    launch = named(python, "Model.launch")
    assert all(s == [(launch, script, at["launch"]), ("main", script, at["main_launch"]),
                     ("<module>", script, at["module"])] for s in launches), launches

    # Another thread: its own stack, down to the threading module that started it.
    [sync] = python_stacks(rec, "cudaDeviceSynchronize")
    assert sync[0] == ("in_thread", script, at["sync"])
    assert [f[0] for f in sync[1:]] == [named(python, n) for n in
                                        ("Thread.run", "Thread._bootstrap_inner", "Thread._bootstrap")]
    assert sync[1][1].endswith("threading.py")

    # A forked child inherits the interpreter: its calls are walked too.
    [child] = python_stacks(rec, "cudaFree")
    assert child == [("in_child", script, at["child"]), ("main", script, at["fork"]), ("<module>", script, at["module"])]
    assert rec.scalar("SELECT count(DISTINCT pid) FROM calls") == 2

    assert rec.scalar("SELECT count FROM lost WHERE cause = 'python_frame_unnamed'") == 0
    assert rec.scalar("SELECT count FROM lost WHERE cause = 'python_stack'") == 0

    # The report names the Python line each kernel was launched from.
    doc = gpuscope("report", "--json", rec.path)
    assert doc.returncode == 0, doc.stderr
    import json
    [kernel] = json.loads(doc.stdout)["kernels"]["top"]
    assert kernel["call_sites"][0]["python"] == f"{launch} ({script}:{at['launch']})"
    text = gpuscope("report", rec.path).stdout
    assert f"from {launch} ({script}:{at['launch']}) via " in text


def test_a_thread_that_calls_cuda_before_it_runs_python_shows_its_frames_once_it_does(record):
    """A native thread's first CUDA call finds no Python thread state; once ctypes gives it one
    (a callback into Python), its next call must show the callback's frame. A build that kept
    "no thread state" for 100 ms lost those frames (and, with CPU samples taken while CPython
    started, the main thread's: 3 to 12 of 75 cudaMalloc calls in 25 runs)."""
    script = str(SCRIPTS / "py_late_thread.py")
    rec = record("--", PYTHON, script, CUDART, TARGETS / "liblate_python_thread.so")
    assert rec.returncode == 0, rec.stderr
    assert "py_late_thread: 0" in rec.stdout
    assert rec.count("cudaMalloc") == 2
    assert python_stacks(rec, "cudaMalloc") == [[("callback", script, marked_lines("py_late_thread.py")["callback"])]]


@pytest.mark.parametrize("walk, by_name", [("fp", False), ("eh-frame", False), ("fp", True)])
def test_work_handed_to_an_engine_thread_shows_the_python_line_that_asked(record, gpuscope, walk, by_name):
    """As PyTorch's autograd engine runs loss.backward()'s kernels on a thread of its own, a
    stand-in engine (a library named libtorch_cpu.so whose Engine::execute waits for a thread it
    starts) launches from its worker thread. Those launches' stacks go on, past the worker's start
    and a frame naming the handoff, into the stack of the Engine::execute call: the Python lines.
    by_name: the worker launches outside Engine::thread_main, as a frame-pointer walk cut short in
    libtorch would see it; its thread's name ("pt_autograd_0") says it is the engine's."""
    script = str(SCRIPTS / "py_backward.py")
    standin = TARGETS / "torch-standin" / "libtorch_cpu.so"
    rec = record("--call-stacks", walk, "--", PYTHON, script, CUDART, standin, *(["--by-name"] if by_name else []))
    assert rec.returncode == 0, rec.stderr
    assert "probing [torch autograd engine thread]" in rec.stderr
    at = marked_lines("py_backward.py")

    # The caller's own call is its own; the worker's three launches are under its lines.
    assert python_stacks(rec, "cudaMalloc") == [[("train_step", script, at["own_call"]),
                                                 ("<module>", script, at["module"])]]
    launches = python_stacks(rec, "cudaLaunchKernel")
    assert len(launches) == 3, launches
    assert all(s == [("backward", script, at["backward"]), ("train_step", script, at["step"]),
                     ("<module>", script, at["module"])] for s in launches), launches
    tids = rec.query("SELECT DISTINCT c.tid FROM calls c JOIN functions f ON f.id = c.func ORDER BY f.name")
    assert len(tids) == 2, tids

    # Root first: the caller's Python and native frames down to Engine::execute, the handoff,
    # then the worker's own stack from its thread's start to the call.
    [worker] = folded(gpuscope, rec, "launches")
    names = [f.split("(")[0] if "::" in f else f for f in worker]
    execute = names.index("torch::autograd::Engine::execute")
    handoff = worker.index("[torch autograd engine thread]")
    inner = names.index("launch_kernels" if by_name else "torch::autograd::Engine::thread_main")
    assert execute < handoff < inner < names.index("cudaLaunchKernel"), worker
    assert ("torch::autograd::Engine::thread_main" in names) != by_name, worker
    assert any(f.startswith("<module> (") for f in worker[:execute]), worker
    # Known by its thread's name alone, the worker's walk missed frames: marked so.
    assert ("[truncated stack]" in worker) == by_name, worker
    if by_name:
        assert worker.index("[truncated stack]") == handoff + 1, worker
    assert rec.scalar("SELECT count FROM lost WHERE cause = 'handoff_unstitched'") == 0


def test_python_frames_take_the_place_of_the_eval_loop(record):
    # With stacks unwound from copies, the native walk passes through the interpreter: each
    # _PyEval_EvalFrameDefault frame is replaced by the Python frames it was running.
    script = str(SCRIPTS / "py_cuda.py")
    rec = record("--call-stacks", "dwarf", "--", PYTHON, script, CUDART)
    assert rec.returncode == 0, rec.stderr
    rows = rec.query(
        "SELECT m.path, p.function FROM calls c JOIN functions f ON f.id = c.func "
        "JOIN stack_frames sf ON sf.stack_id = c.stack_id LEFT JOIN modules m ON m.id = sf.module_id "
        "LEFT JOIN python_frames p ON m.path = '[python]' AND p.id = sf.offset "
        "WHERE f.name = 'cudaDeviceSynchronize' ORDER BY sf.depth")
    kinds = ["py" if path == "[python]" else os.path.basename(path or "?") for path, _ in rows]
    first_py = kinds.index("py")
    # Native frames lead into the innermost Python frame: ctypes and the interpreter's call path.
    assert any(k.startswith("_ctypes") for k in kinds[:first_py]), kinds
    # in_thread ran in an eval loop of its own (called from C by Thread.run), so native frames
    # separate it from Thread.run's frames, and the stack goes on past the last Python frame
    # to the thread's start in the C library.
    py_runs = "".join("p" if k == "py" else "n" for k in kinds).strip("n").split("n")
    assert len([r for r in py_runs if r]) >= 2, kinds
    assert kinds[-1].startswith("libc.so"), kinds
    names = [fn for _, fn in rows if fn]
    assert names == ["in_thread", "Thread.run", "Thread._bootstrap_inner", "Thread._bootstrap"]


@pytest.mark.parametrize("python", interpreters())
def test_cpu_samples_show_the_python_line_running(record, gpuscope, python):
    rec = record("--cpu-profile", 199, "--", python, SCRIPTS / "py_busy.py", 1)
    assert rec.returncode == 0, rec.stderr
    at = marked_lines("py_busy.py")
    script = str(SCRIPTS / "py_busy.py")
    out = gpuscope("flamegraph", rec.path, "--metric", "cpu", "-o", "-")
    assert out.returncode == 0, out.stderr
    total = in_loop = 0
    chain = f"<module> ({script}:{at['module']});main ({script}:{at['main']});spin ({script}:"
    for line in out.stdout.splitlines():
        path, value = line.rsplit(" ", 1)
        total += int(value)
        # Only the Python frames: before 3.11 each runs in a C call of its own, and the native
        # frames of those calls lie between them.
        python_only = ";".join(f for f in path.split(";") if f.endswith(")") and " (" in f)
        if chain in python_only:
            in_loop += int(value)
    # About a second of spinning out of the interpreter's whole run (start-up included).
    assert in_loop / total > 0.6, out.stdout[-3000:]
    lines = rec.query("SELECT DISTINCT line FROM python_frames WHERE function = 'spin'")
    assert {at["loop"], at["loop"] + 1} & {l for (l,) in lines}


@pytest.mark.skipif(not shutil.which("go"), reason="Go's pprof reads the profile")
def test_pprof_carries_python_files_and_lines(record, gpuscope, tmp_path):
    rec = record("--cpu-profile", 199, "--", PYTHON, SCRIPTS / "py_busy.py", 0.5)
    assert rec.returncode == 0, rec.stderr
    prof = tmp_path / "cpu.pb.gz"
    assert gpuscope("flamegraph", rec.path, "--metric", "cpu", "-o", prof).returncode == 0
    top = subprocess.run(["go", "tool", "pprof", "-top", "-lines", str(prof)], capture_output=True, text=True,
                         timeout=120)
    assert top.returncode == 0, top.stderr
    at = marked_lines("py_busy.py")
    assert re.search(rf"spin \(.*\) .*py_busy\.py:({at['loop']}|{at['loop'] + 1})\b", top.stdout), top.stdout


def test_no_python_flag_keeps_stacks_native(record):
    rec = record("--no-python", "--", PYTHON, SCRIPTS / "py_cuda.py", CUDART)
    assert rec.returncode == 0, rec.stderr
    assert python_stacks(rec, "cudaMalloc") == []
    assert rec.scalar("SELECT value FROM meta WHERE key = 'python_stacks'") == "0"


@pytest.mark.parametrize("python", interpreters())
def test_deep_python_stacks_are_walked_whole(record, python):
    # The walk copies a page of the interpreter's data stack at a time: 100 frames span several
    # pages, a generator's frame lies outside them, and map() enters the interpreter again from C
    # every tenth level (3.12+: a shim frame on the C stack each time).
    script = str(SCRIPTS / "py_deep.py")
    nest = 100
    rec = record("--", python, script, CUDART, nest)
    assert rec.returncode == 0, rec.stderr
    at = marked_lines("py_deep.py")
    [stack] = python_stacks(rec, "cudaMalloc")
    expected = [("from_generator", script, at["malloc"]), ("nest", script, at["leaf"])]
    for depth in range(1, nest + 1):
        expected.append(("nest", script, at["through_c" if depth % 10 == 5 else "nest"]))
    expected.append(("<module>", script, at["module"]))
    assert stack == expected, stack


def test_python_stacks_stay_right_past_the_number_held(record):
    # 9,000 distinct Python stacks, twice over: more than the two generations of 4,096 the
    # recorder holds at once, so it drops the older ones, and the BPF side must send them again
    # when they come back. Every launch must still get its own stack: the function its grid
    # names, recursed as deep as its block says.
    functions, depths = 300, 30
    rec = record("--", PYTHON, SCRIPTS / "py_many_stacks.py", CUDART, functions, depths)
    assert rec.returncode == 0, rec.stderr
    assert int(rec.scalar("SELECT value FROM meta WHERE key = 'python_stack_generations'")) >= 2
    rows = rec.query(
        "SELECT c.id, c.grid_x, c.block_x, p.function FROM calls c JOIN functions f ON f.id = c.func "
        "JOIN stack_frames sf ON sf.stack_id = c.stack_id JOIN modules m ON m.id = sf.module_id AND m.path = '[python]' "
        "JOIN python_frames p ON p.id = sf.offset WHERE f.name = 'cudaLaunchKernel' ORDER BY c.id, sf.depth")
    stacks = {}
    for call, grid_x, block_x, function in rows:
        stacks.setdefault(call, (grid_x, block_x, []))[2].append(function)
    assert rec.count("cudaLaunchKernel") == 2 * functions * depths
    assert len(stacks) == 2 * functions * depths
    wrong = [(g, b, names) for g, b, names in stacks.values()
             if names != ["go"] + [f"f{g - 1}"] * b + ["<module>"]]
    assert not wrong, wrong[:3]
    assert rec.scalar("SELECT count FROM lost WHERE cause = 'python_frame_unnamed'") == 0
    assert rec.scalar("SELECT count FROM lost WHERE cause = 'python_stack'") == 0


def test_a_code_object_made_where_a_freed_one_was_has_its_own_name(record):
    # Each function's code object takes the address of the one before it, freed: every call
    # must still show the function that made it, not the first one seen at that address.
    n = 20
    rec = record("--", PYTHON, SCRIPTS / "py_reused_code.py", CUDART, n)
    assert rec.returncode == 0, rec.stderr
    frees = python_stacks(rec, "cudaFree")
    assert len(frees) == n
    assert [[f[0::2] for f in s[:-2]] for s in frees] == [[(f"f{i}", i + 2)] * (i + 1) for i in range(n)], frees


INTERPRETER_FRAME = re.compile(r"^(lib)?python3(\.\d+)?")
LIBRARY = re.compile(r"^([\w.+-]+\.so(\.[\d.]+)?|python3(\.\d+)?)$")  # a library's name, standing for its unnamed frames


def python_frames(stack):
    return [f for f in stack if re.search(r" \(.*:\d+\)$", f)]


@pytest.mark.parametrize("python", interpreters())
def test_flame_graph_views_of_a_python_program(record, gpuscope, python, tmp_path):
    """py_layers.py launches through layers of Python called from C (functools.reduce, a qsort
    callback), so the interpreter's, libc's, ctypes' and libffi's native frames lie between its
    Python frames, as libtorch_python's and python3.X's do in PyTorch. The default flame graph
    shows the Python frames and the native code below the innermost one, without the
    interpreter's frames; --native none the Python frames and the CUDA function; --native all
    every frame. In every view a library's unsymbolised frames are one frame named by the library."""
    script = str(SCRIPTS / "py_layers.py")
    steps = 3
    rec = record("--call-stacks", "eh-frame", "--cpu-profile", 199, "--", python, script, CUDART, steps, 0.5)
    assert rec.returncode == 0, rec.stderr
    at = marked_lines("py_layers.py")

    def view(metric, native=None):
        out = gpuscope("flamegraph", rec.path, "--metric", metric, *(["--native", native] if native else []), "-o", "-")
        assert out.returncode == 0, out.stderr
        stacks = {}
        for line in out.stdout.splitlines():
            path, value = line.rsplit(" ", 1)
            stacks[tuple(path.split(";"))] = int(value)
        return stacks

    auto, none, every = view("launches"), view("launches", "none"), view("launches", "all")
    assert view("launches", "auto") == auto
    for stacks in (auto, none, every):
        assert sum(stacks.values()) == 3 * steps
        for stack in stacks:
            assert not any("+0x" in f for f in stack), stack  # runs of unnamed frames: the library's name
            assert not any(a == b and LIBRARY.match(a) for a, b in zip(stack, stack[1:])), stack
    linear = f"{named(python, 'Linear.forward')} ({script}:{at['linear']})"
    chain = [f"<module> ({script}:{at['module']})", f"main ({script}:{at['main']})",
             f"train_step ({script}:{at['step']})", f"from_native ({script}:{at['qsort']})"]
    for stack, n in auto.items():
        py = python_frames(stack)
        assert py[:4] == chain, stack
        assert n == (2 * steps if py[-1] == linear else steps), (stack, n)
        first, last = stack.index(py[0]), stack.index(py[-1])
        # Nothing of the interpreter's: not above the Python frames, not between them, not below.
        assert first == 1 and python_frames(stack[first:last + 1]) == list(stack[first:last + 1]), stack
        assert not any(INTERPRETER_FRAME.match(f) for f in stack[1:]), stack  # [0]: the process
        # Below the innermost Python frame: ctypes' and libffi's code, then the CUDA function.
        below = stack[last + 1:]
        assert below[-2:] == ("cudaLaunchKernel", "[unnamed kernel]"), stack
        assert any(f.startswith("_ctypes") for f in below) and any(f.startswith("libffi") for f in below), stack
    assert {python_frames(k)[:4] == chain and k[-2:] == ("cudaLaunchKernel", "[unnamed kernel]")
            and len(k) == len(python_frames(k)) + 3 for k in none} == {True}, none
    for stack in every:
        first = stack.index(python_frames(stack)[0])
        assert any(f in ("_start", "Py_BytesMain", "__libc_start_main") for f in stack[:first]), stack
        between = stack[first:stack.index(python_frames(stack)[-1])]
        assert len(python_frames(between)) < len(between) - 4, stack  # python3.X's own frames, ctypes'...
        assert any(f.startswith("libc.so") or f.startswith("qsort") for f in between), stack

    # Other metrics and formats: the same views.
    cpu_auto, cpu_all = view("cpu"), view("cpu", "all")
    assert sum(cpu_auto.values()) == sum(cpu_all.values()) == sum(view("cpu", "none").values())
    spin = f"spin ({script}:"
    spinning = {k: v for k, v in cpu_auto.items() if any(f.startswith(spin) for f in k)}
    assert sum(spinning.values()) > 0.3 * sum(cpu_auto.values()), cpu_auto
    for stack in spinning:
        inner = stack[stack.index(next(f for f in stack if f.startswith(spin))) + 1:]
        # Spinning in the interpreter: at most its innermost frame (an unnamed one: its library's name).
        assert len([f for f in inner if INTERPRETER_FRAME.match(f)]) <= 1, stack
        assert not any(INTERPRETER_FRAME.match(f) for f in stack[1:-1]) or stack[-1].endswith("_[k]"), stack
    copies = view("memcpy-bytes")
    assert sum(copies.values()) == 1 << 20 and all(k[-2] == "cudaMemcpy" for k in copies), copies

    doc = json.loads(gpuscope("report", "--json", rec.path).stdout)
    sites = [c for k in doc["kernels"]["top"] for c in k["call_sites"]]
    assert sites and all("+0x" not in c["site"] for c in sites), sites  # a library's unnamed frame: its name
    assert {c["python"] for c in sites} == {linear, f"{named(python, 'Activation.forward')} ({script}:{at['activation']})"}

    trace = json.loads(gpuscope("timeline", rec.path, "-o", "-").stdout)
    launches = [e for e in trace["traceEvents"] if e.get("cat") == "launch"]
    assert len(launches) == 3 * steps
    for e in launches:
        frames = e["args"]["stack"].split(" ← ")
        assert frames[0] == "cudaLaunchKernel" and "+0x" not in e["args"]["stack"], e
        assert python_frames(frames)[0] == e["args"]["python"], e  # the innermost Python frame, within reach

    if shutil.which("go"):
        prof = tmp_path / "launches.pb.gz"
        assert gpuscope("flamegraph", rec.path, "--metric", "launches", "-o", prof).returncode == 0
        traces = subprocess.run(["go", "tool", "pprof", "-traces", str(prof)], capture_output=True, text=True,
                                timeout=120, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin",
                                                  "GOCACHE": str(tmp_path)})
        assert traces.returncode == 0, traces.stderr
        assert "cudaLaunchKernel" in traces.stdout and "+0x" not in traces.stdout, traces.stdout
        assert not any(INTERPRETER_FRAME.match(line.split()[-1]) for line in traces.stdout.splitlines()
                       if line.split()), traces.stdout
