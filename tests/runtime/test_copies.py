"""The copy family past 1-D and 2-D copies (issue 29): 3-D, array, peer, symbol and batch copies,
through the runtime and the driver, each recorded once with its bytes, direction and host memory."""
import json
import os

import pytest

from conftest import CUDART, TARGETS, folded, per_thread

ROOT = TARGETS.parent.parent

# What copy_family.cu makes, by the symbol a probe sees (legacy default stream). Kept here as well
# as in the program's own list, so that a function the program stops calling fails the test.
RUNTIME = {
    "cudaMemcpy": 1,  # of 0 bytes
    "cudaMemcpy3D": 4, "cudaMemcpy3DAsync": 1, "cudaMemcpy3DPeer": 1, "cudaMemcpy3DPeerAsync": 1,
    "cudaMemcpyPeer": 1, "cudaMemcpyPeerAsync": 1,
    "cudaMemcpy2DToArray": 1, "cudaMemcpy2DToArrayAsync": 1, "cudaMemcpy2DFromArray": 1,
    "cudaMemcpy2DFromArrayAsync": 1, "cudaMemcpy2DArrayToArray": 1,
    "cudaMemcpyToArray": 1, "cudaMemcpyToArrayAsync": 1, "cudaMemcpyFromArray": 1, "cudaMemcpyFromArrayAsync": 1,
    "cudaMemcpyArrayToArray": 1, "cudaMemcpyToSymbol": 1, "cudaMemcpyToSymbolAsync": 1,
    "cudaMemcpyFromSymbol": 1, "cudaMemcpyFromSymbolAsync": 1, "cudaMemcpyBatchAsync": 1, "cudaMemcpy3DBatchAsync": 1,
}
DRIVER = {
    "cuMemcpy3D_v2": 1, "cuMemcpy3DAsync_v2": 1, "cuMemcpy3DPeer": 1, "cuMemcpy3DPeerAsync": 1,
    "cuMemcpyPeer": 1, "cuMemcpyPeerAsync": 1, "cuMemcpyHtoA_v2": 1, "cuMemcpyHtoAAsync_v2": 1,
    "cuMemcpyAtoH_v2": 1, "cuMemcpyAtoHAsync_v2": 1, "cuMemcpyDtoA_v2": 1, "cuMemcpyAtoD_v2": 1,
    "cuMemcpyAtoA_v2": 1, "cuMemcpy2D_v2": 1, "cuMemcpy2DUnaligned_v2": 1, "cuMemcpyBatchAsync_v2": 1,
    "cuMemcpyBatchAsync": 1, "cuMemcpy3DBatchAsync_v2": 1,
}
@pytest.fixture
def stub_driver(tmp_path):
    """A directory whose libcuda.so.1 is the toolkit's driver stub: loadable, every call fails."""
    d = tmp_path / "stub-driver"
    d.mkdir()
    (d / "libcuda.so.1").symlink_to(CUDART.parent / "stubs" / "libcuda.so")
    return {**os.environ, "LD_LIBRARY_PATH": str(d)}


def top_level_copies(rec):
    return rec.query(
        "SELECT c.id, f.name, c.bytes, c.dir, c.host_mem, c.copies, c.stack_id FROM calls c "
        "JOIN functions f ON f.id = c.func WHERE f.kind = 'memcpy' AND c.parent_id IS NULL ORDER BY c.id")


@pytest.mark.parametrize("target", ["copy_family", "copy_family_ptds"])
def test_each_copy_is_recorded_with_its_bytes_and_direction(record, stub_driver, tmp_path, target):
    made_path = tmp_path / "made.json"
    rec = record("--", TARGETS / target, "--json", made_path, env=stub_driver)
    made = json.loads(made_path.read_text())
    assert rec.returncode == min(made["failed_calls"], 100), rec.stderr
    # Without a GPU nothing is allocated (the arrays are stand-in handles): sizes in an array's
    # elements and directions that follow from where pointers are cannot be told, and say so.
    assert made["allocated"] is False
    per = made["per_thread_default_stream"]
    assert per == (target == "copy_family_ptds")
    want = {(per_thread(n) if per else n): k for n, k in {**RUNTIME, **DRIVER}.items()}
    names = [c["function"] for c in made["copies"]]
    assert {n: names.count(n) for n in set(names)} == want

    rows = top_level_copies(rec)
    assert len(rows) == len(made["copies"]), rows
    unmatched = list(rows)
    for c in made["copies"]:
        bytes_ = None if c["in_elements"] else c["bytes"]
        match = [r for r in unmatched if r[1] == c["function"] and r[2] == bytes_]
        assert match, (c, [r for r in rows if r[1] == c["function"]])
        row = match[0]
        unmatched.remove(row)
        assert row[5] == (c["copies"] if c["function"].startswith(("cudaMemcpyBatch", "cudaMemcpy3DBatch", "cuMemcpyBatch",
                                                                    "cuMemcpy3DBatch")) else None), (c, row)
        if not c["dir_by_pointers"]:
            assert row[3] == c["dir"], (c, row)
        assert row[4] == (c["host_mem"] or None), (c, row)
        assert row[6], row  # each with its stack
    assert not rec.query("SELECT cause, count FROM lost WHERE count > 0"), rec.query("SELECT * FROM lost")


def test_report_timeline_and_flame_graph_show_the_new_copies(record, stub_driver, gpuscope, tmp_path):
    rec = record("--", TARGETS / "copy_family", env=stub_driver)
    assert rec.returncode > 0, rec.stderr
    out = gpuscope("report", "--json", rec.path)
    assert out.returncode == 0, out.stderr
    copies = json.loads(out.stdout)["copies"]
    calls = sum(c["calls"] for c in copies)
    assert calls == len(top_level_copies(rec))
    # Three batch calls made more than one copy each: 3, 2 and 2 copies.
    assert sum(c.get("copies", c["calls"]) for c in copies) == calls + 2 + 1 + 1
    assert sum(c.get("bytes_unknown", 0) for c in copies) == rec.scalar(
        "SELECT count(*) FROM calls c JOIN functions f ON f.id = c.func WHERE f.kind = 'memcpy' "
        "AND c.parent_id IS NULL AND c.bytes IS NULL")
    assert sum(c["bytes"] for c in copies) == rec.scalar(
        "SELECT sum(bytes) FROM calls c JOIN functions f ON f.id = c.func WHERE f.kind = 'memcpy' AND c.parent_id IS NULL")
    text = gpuscope("report", rec.path).stdout
    assert "COPIES" in text and "calls of unknown size" in text, text

    trace = tmp_path / "trace.json"
    assert gpuscope("timeline", rec.path, "-o", trace).returncode == 0
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") == "memcpy"]
    batch = [e for e in events if e["args"]["function"] == "cudaMemcpyBatchAsync"]
    assert len(batch) == 1 and batch[0]["args"]["bytes"] == 6600 and batch[0]["args"]["copies"] == 3, batch
    three_d = [e for e in events if e["args"]["function"] == "cuMemcpy3D_v2"]
    assert three_d and three_d[0]["args"]["bytes"] == 8400 and three_d[0]["args"]["direction"] == "HtoD", three_d

    # memcpy-bytes: each copy under the function that made it, its direction as the leaf.
    stacks = folded(gpuscope, rec, "memcpy-bytes")
    by_function = {}
    for frames, value in stacks.items():
        by_function[(frames[-2], frames[-1])] = by_function.get((frames[-2], frames[-1]), 0) + value
    assert by_function[("cuMemcpyHtoA_v2", "HtoD (pageable)")] == 1400
    assert by_function[("cudaMemcpyToSymbol", "HtoD (pageable)")] == 640
    assert by_function[("cudaMemcpy3DPeer", "DtoD")] == 2048
    assert sum(by_function.values()) == sum(c["bytes"] for c in copies)


def test_array_copies_count_the_arrays_elements(record):
    """Through a stand-in runtime whose calls succeed: a 3-D copy into an array seen created counts
    its elements at the array's element size; into an array whose creation was not seen, it takes
    the bytes of the driver copy it made. The array's creation and each driver call nest under
    the runtime call that made them."""
    rec = record("--", "/usr/bin/python3", ROOT / "tests/targets/load_lib.py", TARGETS / "libarray_standin.so",
                 "run_arrays")
    assert rec.returncode == 0, rec.stderr
    assert "run_arrays returned 0" in rec.stdout, rec.stdout
    rows = rec.query("SELECT c.id, f.name, c.parent_id, c.bytes, c.dir, c.host_mem, c.ret, c.ptr FROM calls c "
                     "JOIN functions f ON f.id = c.func ORDER BY c.ts_ns, c.parent_id IS NOT NULL")
    by_name = {}
    for r in rows:
        by_name.setdefault(r[1], []).append(r)
    (create,) = by_name["cudaMalloc3DArray"]
    (inner_create,) = by_name["cuArray3DCreate_v2"]
    assert inner_create[2] == create[0] and create[6] == 0
    assert create[3] == inner_create[3] == 16 * 8 * 4 * 4  # a 16 x 8 x 4 float array: the extent on the stack
    assert create[7] and create[7] == inner_create[7]      # the handle it made
    seen, unseen = by_name["cudaMemcpy3D"]
    inner = by_name["cuMemcpy3D_v2"]
    assert [r[2] for r in inner] == [seen[0], unseen[0]]
    assert seen[3] == inner[0][3] == 8 * 4 * 2 * 4          # 64 floats
    assert unseen[3] == inner[1][3] == 5 * 3 * 8            # from the driver's bytes
    assert seen[4] == unseen[4] == "HtoD" and seen[5] == "pageable"


def nested_copies(rec):
    """The top-level copy rows in time order, and {row id: its children's rows}."""
    rows = rec.query("SELECT c.id, f.name, c.parent_id, c.bytes, c.dir, c.stack_id FROM calls c "
                     "JOIN functions f ON f.id = c.func WHERE f.kind = 'memcpy' ORDER BY c.ts_ns")
    children = {}
    for r in rows:
        if r[2] is not None:
            children.setdefault(r[2], []).append(r)
    return [r for r in rows if r[2] is None], children


def test_runtime_calls_inside_a_runtime_copy_are_its_children(record, gpuscope):
    """A runtime copy that the runtime makes through two of its own exported functions (libcudart's
    cudaMemcpyArrayToArray stages through device memory with cudaMemcpyFromArray and
    cudaMemcpyToArray, whose probes fire): one top-level row, the copy the program asked for, with
    the two runtime calls as its children and their driver copies as theirs; none takes a stack
    walk of its own, each shows the program's."""
    rec = record("--call-stacks", "fp", "--", "/usr/bin/python3", ROOT / "tests/targets/load_lib.py",
                 TARGETS / "libnested_runtime.so", "run_array_copies", 1)
    assert rec.returncode == 0, rec.stderr
    assert "run_array_copies returned 0" in rec.stdout, rec.stdout
    top, children = nested_copies(rec)
    assert [(r[1], r[3], r[4]) for r in top] == [("cudaMemcpyArrayToArray", 1280, "DtoD")] * 10, top
    for outer in top:
        assert outer[5], outer
        inner = children.get(outer[0], [])
        assert [(r[1], r[3]) for r in inner] == [("cudaMemcpyFromArray", 1280), ("cudaMemcpyToArray", 1280)], inner
        for r, driver in zip(inner, ["cuMemcpyAtoD_v2", "cuMemcpyDtoA_v2"]):
            assert r[5] == outer[5], (outer, r)
            (d,) = children.get(r[0], [])
            assert (d[1], d[3], d[5]) == (driver, 1280, outer[5]), (r, d)
    # One walk a copy: the program's call's (the inner calls were flagged and took none).
    walks = rec.scalar("SELECT value FROM meta WHERE key = 'fp_walks'")
    assert walks.startswith("10 walks"), walks
    assert rec.scalar("SELECT count(*) FROM meta WHERE key = 'runtime_probes_removed'") == 0
    # The report counts the program's copies; the inner calls are counted as made inside others.
    doc = json.loads(gpuscope("report", "--json", rec.path).stdout)
    assert [(c["direction"], c["calls"], c["bytes"]) for c in doc["copies"]] == [("DtoD", 10, 12800)], doc["copies"]
    assert doc["summary"]["calls"]["total"] == 10 and doc["summary"]["calls"]["nested"] == 40, doc["summary"]["calls"]
    # memcpy-bytes flame graph: the program's bytes, under its call.
    stacks = folded(gpuscope, rec, "memcpy-bytes")
    assert sum(stacks.values()) == 12800 and all(f[-2] == "cudaMemcpyArrayToArray" for f in stacks), stacks


def test_inner_runtime_functions_may_lose_their_probes_the_staged_copy_keeps_its_own(record):
    """Past 32 copies, cudaMemcpyFromArray and cudaMemcpyToArray have each made one driver copy a
    call: their probes go, and the driver copies are then directly inside the staged copy. The
    staged copy made two copies a call: no driver call stands for it, its probes stay, and every
    call of it is one top-level row of its bytes."""
    batches = 40
    rec = record("--", "/usr/bin/python3", ROOT / "tests/targets/load_lib.py", TARGETS / "libnested_runtime.so",
                 "run_array_copies", batches)
    assert rec.returncode == 0, rec.stderr
    assert "run_array_copies returned 0" in rec.stdout, rec.stdout
    removed = rec.scalar("SELECT value FROM meta WHERE key = 'runtime_probes_removed'") or ""
    assert "cudaMemcpyFromArray at " in removed and "cudaMemcpyToArray at " in removed, removed
    assert "cudaMemcpyArrayToArray" not in removed, removed
    top, children = nested_copies(rec)
    assert [(r[1], r[3]) for r in top] == [("cudaMemcpyArrayToArray", 1280)] * batches * 10, top[:5]
    shapes = []
    for outer in top:
        inner = children.get(outer[0], [])
        shapes.append(tuple(r[1] for r in inner))
        assert sum(r[3] for r in inner) == 2560 and all(r[5] == outer[5] for r in inner), (outer, inner)
    staged = ("cudaMemcpyFromArray", "cudaMemcpyToArray")
    direct = ("cuMemcpyAtoD_v2", "cuMemcpyDtoA_v2")
    assert shapes[0] == staged and shapes[-1] == direct, shapes
    # While the probes went, a copy may have seen one of them and not the other.
    assert shapes.count(staged) >= 32 and shapes.count(direct) >= 10, shapes
    assert not rec.query("SELECT cause, count FROM lost WHERE count > 0"), rec.query("SELECT * FROM lost")


def test_a_copy_made_of_two_driver_copies_keeps_its_probes(record):
    """A runtime copy with two driver copies of its own inside each call: no one driver call stands
    for it, so its probes stay (were they removed, each later call would be two driver rows), and
    every call is one top-level row of its bytes."""
    batches = 10
    rec = record("--", "/usr/bin/python3", ROOT / "tests/targets/load_lib.py", TARGETS / "libnested_runtime.so",
                 "run_two_driver_copies", batches)
    assert rec.returncode == 0, rec.stderr
    assert "run_two_driver_copies returned 0" in rec.stdout, rec.stdout
    assert rec.scalar("SELECT count(*) FROM meta WHERE key = 'runtime_probes_removed'") == 0
    top, children = nested_copies(rec)
    assert [(r[1], r[3]) for r in top] == [("cudaMemcpy2DArrayToArray", 640)] * batches * 10, top[:5]
    for outer in top:
        assert [(r[1], r[3]) for r in children.get(outer[0], [])] == [("cuMemcpyAtoD_v2", 640), ("cuMemcpyDtoA_v2", 640)]


def symbol_copies(rec):
    """The stand-in's cudaMemcpyFromSymbol rows, and {row id: its children's rows}, and every
    row: (id, function, parent_id, bytes, dir, host_mem, ptr, src, ret)."""
    rows = rec.query("SELECT c.id, f.name, c.parent_id, c.bytes, c.dir, c.host_mem, c.ptr, c.src, c.ret FROM calls c "
                     "JOIN functions f ON f.id = c.func ORDER BY c.ts_ns, c.parent_id IS NOT NULL")
    children = {}
    for r in rows:
        if r[2] is not None:
            children.setdefault(r[2], []).append(r)
    return [r for r in rows if r[1] == "cudaMemcpyFromSymbol"], children, rows


@pytest.mark.parametrize("lookup", [1, 0])
def test_a_symbol_copys_driver_copy_has_its_direction(record, lookup):
    """Through a stand-in runtime whose calls succeed: cudaMemcpyFromSymbol with cudaMemcpyDefault
    makes a default-direction cuMemcpy from the symbol's device address, as libcudart 13 did on
    the H100, where the record said DtoH for the symbol copy and HtoH for the copy inside it. The
    symbol's lookup (cuLibraryGetGlobal: address and size through two out-pointers) makes the
    address device memory; where no lookup was seen (the runtime resolved the symbol before), the
    copy inside takes the symbol copy's direction. Either way both say DtoH, pageable."""
    rec = record("--", "/usr/bin/python3", ROOT / "tests/targets/load_lib.py", TARGETS / "libsymbol_standin.so",
                 "run_symbol_copies", lookup, 1)
    assert rec.returncode == 0, rec.stderr
    assert "run_symbol_copies returned 0" in rec.stdout, rec.stdout
    outer, children, rows = symbol_copies(rec)
    assert [(r[3], r[4], r[5], r[8], r[2]) for r in outer] == [(896, "DtoH", "pageable", 0, None)] * 10, outer
    lookups = [r for r in rows if r[1] == "cuLibraryGetGlobal"]
    for i, r in enumerate(outer):
        inner = [c for c in children.get(r[0], []) if c[1] == "cuMemcpy"]
        assert [(c[3], c[4], c[5], c[6]) for c in inner] == [(896, "DtoH", "pageable", r[6])], (r, inner)
        # On the first use only, and inside it: the lookup, with the address the copy came from.
        assert [c for c in children.get(r[0], []) if c[1] == "cuLibraryGetGlobal"] == (lookups if lookup and i == 0 else [])
    top_driver = [r for r in rows if r[1] == "cuMemcpy" and r[2] is None]
    if lookup:
        (lk,) = lookups
        assert lk[3] == 4096 and lk[6] == children[outer[0][0]][-1][7], (lk, children[outer[0][0]])
        # The program's own cuMemcpy from inside the global: device to host by the lookup alone.
        assert [(r[3], r[4], r[5], r[7]) for r in top_driver] == [(64, "DtoH", "pageable", lk[6] + 128)], top_driver
    else:
        assert not lookups and not top_driver, (lookups, top_driver)


@pytest.mark.parametrize("lookup", [1, 0])
def test_the_driver_stands_for_a_symbol_copy_only_where_it_tells_the_direction(record, lookup):
    """With the symbol's lookup seen, each cudaMemcpyFromSymbol's cuMemcpy says DtoH by itself:
    past 32 calls the runtime function's probes go, and its later copies are the driver's rows,
    DtoH. Without it, the cuMemcpy alone would say HtoH: the probes stay, every copy is a
    cudaMemcpyFromSymbol row, DtoH."""
    batches = 40
    rec = record("--", "/usr/bin/python3", ROOT / "tests/targets/load_lib.py", TARGETS / "libsymbol_standin.so",
                 "run_symbol_copies", lookup, batches)
    assert rec.returncode == 0, rec.stderr
    assert "run_symbol_copies returned 0" in rec.stdout, rec.stdout
    removed = rec.scalar("SELECT value FROM meta WHERE key = 'runtime_probes_removed'") or ""
    rows = rec.query("SELECT f.name, c.bytes, c.dir, c.host_mem FROM calls c JOIN functions f ON f.id = c.func "
                     "WHERE f.kind = 'memcpy' AND c.parent_id IS NULL ORDER BY c.ts_ns")
    copies = [r for r in rows if r[1] == 896]
    assert len(copies) == batches * 10, rows[:5]
    assert {(r[1], r[2], r[3]) for r in copies} == {(896, "DtoH", "pageable")}, rows
    if lookup:
        assert "cudaMemcpyFromSymbol at " in removed, removed
        assert copies[0][0] == "cudaMemcpyFromSymbol" and copies[-1][0] == "cuMemcpy", (copies[0], copies[-1])
    else:
        assert "cudaMemcpyFromSymbol" not in removed, removed
        assert {r[0] for r in copies} == {"cudaMemcpyFromSymbol"}, rows
    # No call lost while the probes went (a stack walk cut short before the late library's
    # unwind table was made is not a call lost).
    assert not rec.query("SELECT cause, count FROM lost WHERE count > 0 AND cause NOT LIKE 'unwind%'"), \
        rec.query("SELECT * FROM lost")
