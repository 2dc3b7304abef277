"""CPU sampling and flame graphs: samples land where the time went; every output format is read
back by something other than gpuscope (Go's pprof, headless Chromium)."""
import gzip
import json
import re
import shutil
import subprocess

import pytest

from conftest import TARGETS, folded

VECADD = "vecAdd(float const*, float const*, float*, int)"


def share(stacks, frame):
    total = sum(stacks.values())
    return sum(v for k, v in stacks.items() if frame in k) / total


def test_cpu_samples_land_in_the_busy_functions(record, gpuscope):
    rec = record("--cpu-profile", 199, "--", TARGETS / "busy_loop", 2)
    assert rec.returncode == 0, rec.stderr
    n = rec.scalar("SELECT count(*) FROM samples")
    assert 200 <= n <= 500, n  # 2 s at 199 Hz
    assert rec.scalar("SELECT value FROM meta WHERE key='cpu_profile_hz'") == "199"
    stacks = folded(gpuscope, rec, "cpu")
    # 75% of the time in user space, the rest mostly inside read() in the kernel.
    assert 0.6 < share(stacks, "spin_in_user_space") < 0.9
    in_read = {k: v for k, v in stacks.items() if "read_from_dev_zero" in k}
    assert 0.1 < sum(in_read.values()) / sum(stacks.values()) < 0.4
    in_kernel = [k for k in in_read if any(f.endswith("_[k]") for f in k)]
    assert in_kernel, "no kernel frames under read()"
    assert any("read_zero_[k]" in k or "iov_iter_zero_[k]" in k for k in in_kernel), in_kernel[:3]
    # Stacks reach main, root first (process, then the program's outermost frames).
    assert all(k[0].startswith("busy_loop (") for k in stacks)
    assert share(stacks, "main") > 0.9
    # The report has the profile too: the busy function first by self time.
    doc = json.loads(gpuscope("report", "--json", rec.path).stdout)
    assert doc["cpu"]["samples"] == n
    assert doc["cpu"]["top_self"][0]["function"] == "spin_in_user_space"
    assert "== CPU profile: " in gpuscope("report", rec.path).stdout


@pytest.mark.parametrize("target", ["busy_loop", "busy_loop_nofp"])
def test_sampled_stacks_reach_main_without_frame_pointers(record, gpuscope, target):
    # Unwound from .eh_frame (the default): the chain is whole whether or not the program, and
    # libc's read(), keep frame pointers.
    rec = record("--cpu-profile", 199, "--", TARGETS / target, 1)
    assert rec.returncode == 0, rec.stderr
    assert rec.scalar("SELECT value FROM meta WHERE key='sample_unwinding'") == "dwarf"
    stacks = folded(gpuscope, rec, "cpu")
    assert share(stacks, "main") > 0.95
    assert share(stacks, "_start") > 0.95
    spin = [k for k in stacks if "spin_in_user_space" in k]
    assert spin and all(k.index("main") < k.index("spin_in_user_space") for k in spin)
    reads = [k for k in stacks if "read_from_dev_zero" in k and "read" in k]
    assert reads and all(k.index("main") < k.index("read_from_dev_zero") < k.index("read") for k in reads)
    # A sample or two may fall in the dynamic loader's start-up code (hand-written, without
    # unwind information): the only stacks allowed to end cut short.
    cut = [k for k in stacks if "[truncated stack]" in k]
    assert share(stacks, "[truncated stack]") < 0.03, cut


def test_stack_deeper_than_the_copy_is_marked_truncated(record, gpuscope):
    rec = record("--cpu-profile", 199, "--", TARGETS / "deep_stack")
    assert rec.returncode == 0, rec.stderr
    stacks = folded(gpuscope, rec, "cpu")
    spinning = {k: v for k, v in stacks.items() if "recurse" in k}
    assert sum(spinning.values()) / sum(stacks.values()) > 0.8
    # What was unwound is right (recursion frames), and the root says it is not the whole stack.
    wrong = [k for k in spinning if k[1] != "[truncated stack]" or "main" in k]
    assert not wrong, wrong[:3]


def test_launch_and_copy_flame_graphs_follow_the_caller_chain(record, gpuscope):
    rec = record("--", TARGETS / "cuda_ops", "--iterations", 2)
    launches = folded(gpuscope, rec, "launches")
    assert sum(launches.values()) == 4
    vec = [k for k in launches if k[-1] == VECADD]
    assert len(vec) == 1 and launches[vec[0]] == 2
    chain = vec[0]
    # The kernel is the leaf under the CPU stack that launched it.
    assert chain.index("main") < chain.index("(anonymous namespace)::work(int)") < len(chain) - 1
    assert any(f.startswith("(anonymous namespace)::launch_kernels") for f in chain)

    copies = folded(gpuscope, rec, "memcpy-bytes")
    by_leaf = {}
    for k, v in copies.items():
        by_leaf[k[-1]] = by_leaf.get(k[-1], 0) + v
    MiB = 1 << 20
    assert by_leaf == {"HtoD (pageable)": 4 * MiB, "DtoH (pageable)": 2 * 2 * MiB + 2 * 3 * MiB, "DtoD": 2 * 4 * MiB}


@pytest.mark.skipif(not shutil.which("go"), reason="Go's pprof (golang-go) is the independent reader")
def test_pprof_is_read_by_go_pprof(record, gpuscope, tmp_path):
    rec = record("--cpu-profile", 199, "--", TARGETS / "busy_loop", 1)
    out = tmp_path / "cpu.pb.gz"
    res = gpuscope("flamegraph", rec.path, "-m", "cpu", "-o", out)
    assert res.returncode == 0, res.stderr
    assert gzip.decompress(out.read_bytes())  # gzip, as pprof files are
    top = subprocess.run(["go", "tool", "pprof", "-top", "-nodecount=50", str(out)], capture_output=True, text=True,
                         timeout=120, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "GOCACHE": str(tmp_path)})
    assert top.returncode == 0, top.stderr
    assert "Type: cpu" in top.stdout
    samples = rec.scalar("SELECT count(*) FROM samples")
    total_ms = float(re.search(r"of ([\d.]+)(ms|s) total", top.stdout).group(1)) * (
        1000 if re.search(r"of [\d.]+s total", top.stdout) else 1)
    assert abs(total_ms - samples * 1000 / 199) < 1.0  # each sample weighs one period
    spin = next(line for line in top.stdout.splitlines() if line.rstrip().endswith("spin_in_user_space"))
    assert float(spin.split()[1].rstrip("%")) > 50  # flat share


@pytest.mark.skipif(not shutil.which("chromium"), reason="headless Chromium renders the HTML")
def test_html_flame_graph_renders_in_a_browser(record, gpuscope, tmp_path):
    rec = record("--", TARGETS / "cuda_ops", "--iterations", 2)
    page = tmp_path / "launches.html"
    res = gpuscope("flamegraph", rec.path, "-m", "launches", "-o", page)
    assert res.returncode == 0, res.stderr
    html = page.read_text()
    assert "<script src" not in html and "http" not in html.split("<script>")[1]  # one file, works offline
    dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,900",
                          "--dump-dom", f"file://{page}#search=vecAdd"],
                         capture_output=True, text=True, timeout=120).stdout
    frames = re.findall(r'<div class="frame[^"]*"[^>]*>([^<]*)</div>', dom)
    assert "all" in frames and "main" in frames
    assert VECADD in [f.replace("&amp;", "&") for f in frames]
    # The search from the address ran: half the launches are vecAdd.
    assert "matched: 2 launches = 50.00% of all" in dom


def rendered_frames(page, search=""):
    """The flame graph as headless Chromium draws it: (text, background colour) per frame box, and
    the page's text."""
    dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,900",
                          "--dump-dom", f"file://{page}" + (f"#search={search}" if search else "")],
                         capture_output=True, text=True, timeout=120).stdout
    boxes = re.findall(r'<div class="frame[^"]*"([^>]*)>([^<]*)</div>', dom)
    return [(text.replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"),
             re.search(r"background(?:-color)?: ([^;\"]+)", attrs).group(1)) for attrs, text in boxes], dom


@pytest.mark.skipif(not shutil.which("chromium"), reason="headless Chromium renders the HTML")
def test_html_flame_graph_of_a_python_program_shows_its_code(record, gpuscope, tmp_path):
    # By default a Python program's flame graph shows its Python frames (in blue) and the native
    # code below them, not the interpreter's frames between them nor one box per unnamed address.
    from test_python import PYTHON, SCRIPTS
    from conftest import CUDART
    script = str(SCRIPTS / "py_layers.py")
    rec = record("--call-stacks", "eh-frame", "--", PYTHON, script, CUDART, 3)
    assert rec.returncode == 0, rec.stderr
    page = tmp_path / "launches.html"
    assert gpuscope("flamegraph", rec.path, "-m", "launches", "-o", page).returncode == 0
    frames, dom = rendered_frames(page, "Linear")
    names = [t for t, _ in frames]
    assert f"<module> ({script}:97)" in names and "cudaLaunchKernel" in names, names
    assert not [n for n in names if "+0x" in n or re.match(r"python3\.\d+$", n) or n in ("_start", "Py_BytesMain")]
    assert any(n.startswith("_ctypes") and n.endswith(".so") for n in names), names  # its unnamed frames, once
    assert "native all shows every frame" in dom
    # Python frames are drawn blue, the others in warm colours.
    def rgb(colour):
        return tuple(int(v) for v in re.findall(r"\d+", colour)[:3])
    for name, colour in frames:
        r, g, b = rgb(colour)
        if re.search(r" \(.*:\d+\)$", name):
            assert b > r, (name, colour)
        elif not name.startswith("[") and name != "all":
            assert r >= b, (name, colour)
    assert "matched: 6 launches = 66.67% of all" in dom  # two Linear layers of three

    every = tmp_path / "all.html"
    assert gpuscope("flamegraph", rec.path, "-m", "launches", "--native", "all", "-o", every).returncode == 0
    names = [t for t, _ in rendered_frames(every)[0]]
    assert "_start" in names or "Py_BytesMain" in names, names
    assert not [n for n in names if "+0x" in n], names


@pytest.mark.parametrize("target", ["cuda_ops", "cuda_ops_nofp"])
def test_call_stacks_unwound_from_stack_copies(record, gpuscope, target):
    # --call-stacks dwarf: each call sends a copy of its stack, unwound from .eh_frame, so the
    # caller chain is whole also in a program built without frame pointers.
    rec = record("--call-stacks", "dwarf", "--", TARGETS / target, "--iterations", 2)
    assert rec.returncode == 3, rec.stderr
    assert rec.scalar("SELECT value FROM meta WHERE key='call_unwinding'") == "dwarf"
    # Every call that takes a stack has one (registrations and lookups take none).
    assert rec.scalar("SELECT count(*) FROM calls c JOIN functions f ON f.id=c.func "
                      "WHERE c.stack_id IS NULL AND f.kind NOT IN ('kernel_lookup')") == 0
    launches = folded(gpuscope, rec, "launches")
    assert sum(launches.values()) == 4
    for chain in launches:
        assert chain.index("main") < chain.index("(anonymous namespace)::work(int)") < chain.index("cudaLaunchKernel")
    vec = next(k for k in launches if k[-1] == VECADD)
    assert any(f.startswith("(anonymous namespace)::launch_kernels") for f in vec)
    # Usually the walks are whole, to _start, although the process is gone before its stacks are
    # unwound (its mappings were taken while it was stopped at a library load); under load a
    # run has been seen to end truncated at the C library's start code, so only the program's
    # own frames are required here.


def test_stacks_taken_for_one_call_in_n_stand_for_n(record, gpuscope):
    # --stack-every 4: every call has its row; one launch, copy or memset in four, at random, has
    # a stack, weighed 4 by the flame graphs and the report. Allocations' stacks are all taken.
    iterations = 1500
    rec = record("--stack-every", 4, "--", TARGETS / "cuda_ops", "--iterations", iterations)
    assert rec.returncode == 3, rec.stderr
    assert rec.scalar("SELECT value FROM meta WHERE key='stack_every'") == "4"

    def weights(kind):
        return dict(rec.query(
            "SELECT coalesce(c.stack_weight, 1) || (c.stack_id IS NULL), count(*) FROM calls c "
            "JOIN functions f ON f.id = c.func WHERE f.kind = ? AND c.parent_id IS NULL GROUP BY 1", kind))

    launches, copies = weights("launch"), weights("memcpy")
    for rows, n in ((launches, 2 * iterations), (copies, 5 * iterations)):
        # Weight 4 with a stack, or 0 without; Binomial(n, 1/4) within 6 sigma.
        assert set(rows) <= {"40", "01"} and rows.get("40", 0) + rows.get("01", 0) == n, rows
        assert abs(rows.get("40", 0) - n / 4) <= 6 * (n * 3 / 16) ** 0.5, rows
    assert weights("memset").keys() <= {"40", "01"}
    assert weights("alloc") == {"10": 4}  # cudaMalloc x3, cudaMallocHost: always taken

    stacks = folded(gpuscope, rec, "launches")
    taken = launches["40"]
    assert sum(stacks.values()) == 4 * taken
    assert all(v % 4 == 0 for v in stacks.values())
    assert "[no stack]" not in {f for k in stacks for f in k}
    vec = sum(v for k, v in stacks.items() if k[-1] == VECADD)
    assert 0.4 < vec / sum(stacks.values()) < 0.6  # half the launches are vecAdd
    copied = rec.scalar("SELECT sum(c.bytes) FROM calls c JOIN functions f ON f.id = c.func "
                        "WHERE f.kind = 'memcpy' AND c.parent_id IS NULL AND c.stack_weight = 4")
    assert sum(folded(gpuscope, rec, "memcpy-bytes").values()) == 4 * copied

    doc = json.loads(gpuscope("report", "--json", rec.path).stdout)["kernels"]
    assert doc["launches"] == 2 * iterations and doc["stacks_of_one_in"] == 4
    for k in doc["top"]:
        assert k["launches"] == iterations  # counts of launches are exact
        assert sum(c["launches"] for c in k["call_sites"]) % 4 == 0
    text = gpuscope("report", rec.path).stdout
    assert "stacks of 1 launch in 4" in text and "≈×" in text


def test_stacks_by_budget_are_taken_for_one_call_in_n_set_from_their_cost(record, gpuscope):
    # record's default: launches', copies' and memsets' stacks are taken while their walks take
    # at most --stack-budget of the process's time, one call in N past that. A launch loop's
    # walks cost several percent of its time here, so N rises above 1 within the first 100 ms;
    # each taken stack carries the N it was taken at.
    iterations = 60000
    rec = record("--stack-budget", "0.005", "--", TARGETS / "cuda_ops", "--iterations", iterations)
    assert rec.returncode == 3, rec.stderr
    assert rec.scalar("SELECT value FROM meta WHERE key='stack_budget'") == "0.005"
    most = int(rec.scalar("SELECT value FROM meta WHERE key='stack_every_max'"))
    assert most > 1, rec.scalar("SELECT value FROM meta WHERE key='stack_budget_result'")
    assert "PID" in rec.scalar("SELECT value FROM meta WHERE key='stack_budget_result'")

    rows = rec.query("SELECT coalesce(c.stack_weight, 1), c.stack_id IS NULL, count(*) FROM calls c "
                     "JOIN functions f ON f.id = c.func WHERE f.kind = 'launch' AND c.parent_id IS NULL GROUP BY 1, 2")
    assert sum(n for _, _, n in rows) == 2 * iterations
    # A stack or weight 0, never both or neither; weights between 1 and the largest N.
    assert all((w == 0) == bool(missing) and w <= most for w, missing, _ in rows), rows
    assert any(w > 1 for w, _, _ in rows)
    estimated = sum(w * n for w, _, n in rows)
    # Unbiased: a call taken with chance 1/N and weighed N adds N - 1 to the estimate's variance,
    # which the taken calls estimate as the sum of N(N - 1). Within 5 sigma of the true count
    # (a fixed 10% failed about one run in 150 at N near 170).
    variance = sum(n * w * (w - 1) for w, missing, n in rows if not missing)
    assert abs(estimated - 2 * iterations) < 5 * variance ** 0.5 + 1, (rows, variance ** 0.5)
    assert abs(estimated - 2 * iterations) < 0.25 * 2 * iterations, rows
    assert rec.scalar("SELECT count(*) FROM calls c JOIN functions f ON f.id = c.func "
                      "WHERE f.kind = 'alloc' AND (c.stack_id IS NULL OR coalesce(c.stack_weight, 1) != 1)") == 0

    stacks = folded(gpuscope, rec, "launches")
    assert sum(stacks.values()) == estimated
    for chain in stacks:
        assert chain.index("main") < chain.index("cudaLaunchKernel")
    doc = json.loads(gpuscope("report", "--json", rec.path).stdout)["kernels"]
    assert doc["stacks_of_one_in"] == most and doc["stack_budget"] == 0.005
    assert "record --stack-budget 0.005" in gpuscope("report", rec.path).stdout


def test_every_stack_when_asked(record):
    rec = record("--stack-every", 1, "--stack-budget", "0.01", "--", TARGETS / "cuda_ops")
    assert rec.returncode != 0 and "excludes" in rec.stderr, rec.stderr
    rec = record("--stack-every", 1, "--", TARGETS / "cuda_ops", "--iterations", 20000)
    assert rec.returncode == 3, rec.stderr
    assert rec.scalar("SELECT count(*) FROM meta WHERE key LIKE 'stack_budget%'") == 0
    assert rec.scalar("SELECT count(*) FROM calls WHERE stack_weight IS NOT NULL") == 0
