#!/usr/bin/env python3
"""Calls by function in a record, top-level and made inside another call, with the BPF programs'
runs (traps, with --bpf-stats) and which runtime probes gpuscope removed: where a record's traps
went.

    python3 bench/gpu/calls_by_function.py RECORD.gpuscope"""
import json
import sqlite3
import sys


def main():
    db = sqlite3.connect(sys.argv[1])
    meta = dict(db.execute("SELECT key, value FROM meta"))
    print(f"launch probes: {meta.get('launch_probes')}; runtime probes removed: "
          f"{meta.get('runtime_probes_removed', 'none')}")
    print(f"{'calls':>8} {'inside':>7} {'returned':>8}  kind     function")
    for name, kind, n, inner, returned in db.execute(
            "SELECT f.name, f.kind, count(*), count(c.parent_id), count(c.duration_ns) FROM calls c "
            "JOIN functions f ON f.id = c.func GROUP BY f.name ORDER BY 3 DESC"):
        print(f"{n:8d} {inner:7d} {returned:8d}  {kind:8} {name}")
    stats = json.loads(meta.get("bpf_program_stats", "{}"))
    for name, s in sorted(stats.items(), key=lambda kv: -kv[1]["runs"]):
        print(f"  {name:18} runs {s['runs']:>9}  avg {s['run_time_ns'] / max(s['runs'], 1):8.0f} ns")


if __name__ == "__main__":
    main()
