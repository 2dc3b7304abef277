"""`gpuscope advise` (issue 35) on records of a real CUDA program whose copies from pageable memory
follow five patterns (tests/targets/pageable_copies.cu; without a GPU they fail, priced by the
built-in copy model): a buffer copied 20 times is worth pinning once, new buffers copied once each
are worth pinning where they are made (also where the C library serves each from its heap at the
address of the one before), a one-shot checkpoint and a 4 KB flag are not."""
import json
import re

from conftest import CUDART, ROOT, TARGETS


def by_function(doc):
    """Each site's advice by the program's function it is in."""
    out = {}
    for s in doc["sites"]:
        for fn in ("reused_input", "fresh_batches", "checkpoint", "small_reads", "heap_batches"):
            if fn + "(" in s["site"]:
                out[fn] = s
    return out


def test_advice_follows_each_buffers_reuse(record, gpuscope):
    rec = record("--", TARGETS / "pageable_copies")
    assert rec.returncode == 0, rec.stderr
    out = gpuscope("advise", "--json", rec.path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["pageable_copies"] == 20 + 12 + 1 + 200 + 12
    sites = by_function(doc)
    assert set(sites) == {"reused_input", "fresh_batches", "checkpoint", "small_reads", "heap_batches"}, doc["sites"]
    reused, fresh, ckpt, small = (sites[k] for k in ("reused_input", "fresh_batches", "checkpoint", "small_reads"))
    assert (reused["action"], reused["copies"], reused["buffers"], reused["to_device"]) == ("pin", 20, 1, 20)
    assert "cudaMallocHost" in reused["advice"]
    assert (fresh["action"], fresh["copies"], fresh["buffers"]) == ("pin at the source", 12, 12)
    assert (ckpt["action"], ckpt["copies"], ckpt["to_device"]) == ("leave", 1, 0)
    # Read back into new memory: pinning it would make its pages (untouched registration: ~30 ms
    # at 64 MiB by the built-in table, against ~5 ms for pages already touched).
    registering = float(re.search(r"registering \(([\d.]+) ms\)", ckpt["advice"]).group(1))
    assert registering > 15, ckpt["advice"]
    assert (small["action"], small["copies"], small["buffers"]) == ("leave", 200, 1)
    # Where the buffers were allocated: the record's host mappings (16 and 64 MB: mmap'ed by the C
    # library) with their stacks, past libc, libstdc++ and std::vector to the program's function.
    assert doc["allocations_recorded"] is True
    assert "reused_input(" in reused["allocated_at"] and "pageable_copies.cu:20" in reused["copied_at"], reused
    assert "checkpoint(" in ckpt["allocated_at"] and "pageable_copies.cu:33" in ckpt["copied_at"], ckpt
    # Served from the C library's heap, where no mmap shows them: the heap hooks of the launches
    # library hand each block over with its stack, and its freeing; each batch at the address of
    # the one before is a buffer of its own, copied once.
    heap = sites["heap_batches"]
    assert (heap["action"], heap["copies"], heap["buffers"]) == ("pin at the source", 12, 12), heap
    assert "heap_batches(" in heap["allocated_at"] and "pageable_copies.cu:49" in heap["copied_at"], heap
    assert "fresh_batches(" in fresh["allocated_at"], fresh
    blocks = dict(rec.query("SELECT op, count(*) FROM host_allocs WHERE op IN ('malloc', 'free') AND length >= 0 "
                            "GROUP BY op"))
    assert blocks.get("malloc", 0) >= 12 + 12 and blocks.get("free", 0) >= 12, blocks
    # The 4 KB flag is static: no mapping holds it.
    assert small["allocated_at"] is None and small["site"] == small["copied_at"]
    # The copies failed (no GPU): their times are the model's, and said to be.
    assert all(s["time_from"] == "model" for s in doc["sites"])
    # Ranked by what pinning saves: the reused buffer first.
    assert "reused_input(" in doc["sites"][0]["site"]
    text = gpuscope("advise", rec.path)
    assert text.returncode == 0, text.stderr
    assert "[pin] " in text.stdout and "[pin at the source] " in text.stdout and "[leave] " in text.stdout
    # And how to act on it without changing the program: the recorded command under gpuscope pin.
    assert doc["pin_command"].startswith("gpuscope pin -- ") and "pageable_copies" in doc["pin_command"]
    assert doc["pin_command"] in text.stdout
    assert "allocated there; copied at " in text.stdout


def test_without_host_allocations_the_sites_are_the_copies(record, gpuscope):
    rec = record("--host-allocs", "0", "--", TARGETS / "pageable_copies")
    assert rec.returncode == 0, rec.stderr
    doc = json.loads(gpuscope("advise", "--json", rec.path).stdout)
    assert doc["allocations_recorded"] is False
    assert all(s["allocated_at"] is None and s["site"] == s["copied_at"] for s in doc["sites"]), doc["sites"]


def test_a_record_without_pageable_copies_has_nothing_to_pin(record, gpuscope):
    rec = record("--", TARGETS / "launch_count", "3")
    assert rec.returncode == 0, rec.stderr
    out = gpuscope("advise", rec.path)
    assert out.returncode == 0, out.stderr
    assert "Nothing to pin" in out.stdout and "gpuscope pin" not in out.stdout


def test_bad_input_gets_one_line_and_a_failing_exit(record, gpuscope, tmp_path):
    missing = gpuscope("advise", tmp_path / "none.gpuscope")
    assert missing.returncode != 0 and len(missing.stderr.strip().splitlines()) == 1, missing.stderr
    rec = record("--", TARGETS / "launch_count", "1")
    table = tmp_path / "table.txt"
    table.write_text("not a table\n")
    bad = gpuscope("advise", "--copy-table", table, rec.path)
    assert bad.returncode != 0 and "copy_table" in bad.stderr, bad.stderr


def test_python_buffers_are_named_by_the_lines_that_allocated_them(record, gpuscope):
    # Buffers over 32 MiB: the C library always maps them (under that, it may serve them from its
    # heap once it has freed a mapped block of the size).
    script = ROOT / "tests" / "targets" / "py_pageable.py"
    lines = {m.group(1): n for n, text in enumerate(script.read_text().splitlines(), 1)
             if (m := re.search(r"# line: (\w+)", text))}
    rec = record("--", "/usr/bin/python3", script, CUDART)
    assert rec.returncode == 0, rec.stderr
    doc = json.loads(gpuscope("advise", "--json", rec.path).stdout)
    by_line = {}
    for s in doc["sites"]:
        for name in ("input", "checkpoint"):
            if s["allocated_at"] and f"py_pageable.py:{lines[name]})" in s["allocated_at"]:
                by_line[name] = s
    assert set(by_line) == {"input", "checkpoint"}, doc["sites"]
    assert by_line["input"]["copies"] == 20 and by_line["input"]["action"] == "pin", by_line["input"]
    assert by_line["checkpoint"]["copies"] == 1, by_line["checkpoint"]
    for s in by_line.values():
        assert f"py_pageable.py:{lines['copy']})" in s["copied_at"], s
