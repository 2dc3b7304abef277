#!/usr/bin/env python3
"""Stack completeness (issue 4's figure): the share of CUDA-call stacks, and of CPU samples, that
reach the program's entry (main, _start, the C library's start code, Python's Py_RunMain/Py_BytesMain,
or a Python module's top level, "<module> (...)"). A stack cut short by a frame without a frame
pointer ends somewhere else. Threads do not start in main: reaching a thread's start (start_thread,
clone3, Python's Thread._bootstrap) is counted apart. Stacks of work a thread handed to another
(PyTorch's autograd engine thread, running loss.backward()'s kernels) go on below the call that
handed it over (a "[... thread]" frame between the two): those are counted as stitched. A stack
that reaches the entry through Python frames while its native walk was cut short somewhere
("[truncated stack]") is counted apart too: "with nothing cut" excludes them.

    python3 stack_completeness.py RECORD [--gpuscope build/gpuscope]"""
import argparse
import subprocess
import sys

ENTRY = {"main", "_start", "__libc_start_main", "__libc_start_call_main", "Py_BytesMain", "Py_RunMain",
         "pymain_run_python"}


THREAD_START = {"start_thread", "clone3", "clone"}
HANDOFFS = {"[torch autograd engine thread]"}


def reaches_entry(path):
    return bool(ENTRY & set(path)) or any(f.startswith("<module> (") for f in path)


def reaches_thread_start(path):
    return bool(THREAD_START & set(path)) or any(f.startswith("Thread._bootstrap (") for f in path)


def is_python(frame):
    return frame.endswith(")") and " (" in frame and ".py:" in frame


def folded(gpuscope, record, metric):
    out = subprocess.run([gpuscope, "flamegraph", record, "-m", metric, "-o", "-"], capture_output=True, text=True,
                         errors="replace")
    if out.returncode != 0:
        return None, out.stderr.strip()
    stacks = []
    for line in out.stdout.splitlines():
        path, value = line.rsplit(" ", 1)
        stacks.append((path.split(";"), int(value)))
    return stacks, ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("record")
    ap.add_argument("--gpuscope", default="build/gpuscope")
    args = ap.parse_args()
    import sqlite3
    with sqlite3.connect(args.record) as db:
        meta = dict(db.execute("SELECT key, value FROM meta"))
        lost = dict(db.execute("SELECT cause, count FROM lost WHERE count > 0"))
    secs = (int(meta["end_ns"]) - int(meta["start_ns"])) / 1e9
    print(f"record: {secs:.1f} s, sample unwinding {meta.get('sample_unwinding', '-')}, gpuscope CPU "
          f"{int(meta.get('recorder_cpu_ns', 0)) / 1e9:.2f} s, peak RSS {int(meta.get('recorder_max_rss_kb', 0)) / 1024:.0f} MiB, "
          f"lost {lost or 'none'}")
    if meta.get("unwind_tables"):
        print(f"unwind tables: {meta['unwind_tables']}")
    for metric in ("launches", "memcpy-bytes", "alloc-bytes", "cpu"):
        stacks, err = folded(args.gpuscope, args.record, metric)
        if stacks is None:
            print(f"{metric:13} not available: {err}")
            continue
        events = sum(v for _, v in stacks)
        complete = sum(v for p, v in stacks if reaches_entry(p))
        thread = sum(v for p, v in stacks if not reaches_entry(p) and reaches_thread_start(p))
        with_py = sum(v for p, v in stacks if any(is_python(f) for f in p))
        at_module = sum(v for p, v in stacks if any(f.startswith("<module> (") for f in p))
        no_stack = sum(v for p, v in stacks if "[no stack]" in p)
        stitched = sum(v for p, v in stacks if HANDOFFS & set(p))
        uncut = sum(v for p, v in stacks if reaches_entry(p) and "[truncated stack]" not in p)
        # Where incomplete stacks stop: their outermost frame (after the process name).
        stops = {}
        for p, v in stacks:
            if not reaches_entry(p) and not reaches_thread_start(p) and "[no stack]" not in p:
                top = p[1] if len(p) > 1 else "?"
                lib = top.split("+0x")[0] if "+0x" in top else top
                stops[lib] = stops.get(lib, 0) + v
        worst = sorted(stops.items(), key=lambda kv: -kv[1])[:4]
        print(f"{metric:13} {100 * complete / events:6.2f}% of {events} reach the entry "
              f"({100 * no_stack / events:.2f}% without a stack); incomplete stacks stop in: "
              + ", ".join(f"{k[:60]} {100 * v / events:.1f}%" for k, v in worst))
        dwarf = meta.get("sample_unwinding" if metric == "cpu" else "call_unwinding") in ("dwarf", "eh-frame")
        # A frame-pointer walk that stops at a frame without one looks like one that reached the
        # end: only walks from .eh_frame mark their cuts.
        cut = (f"{100 * uncut / events:.2f}% with nothing cut" if dwarf
               else "frame-pointer walks do not mark where they stop short")
        print(f"{'':13} {100 * stitched / events:6.2f}% stitched below the call that handed their work over; "
              f"reaching the entry: {cut}")
        print(f"{'':13} {100 * (complete + thread) / events:6.2f}% reach the entry or their thread's start; "
              f"{100 * with_py / events:.2f}% have Python frames, {100 * at_module / events:.2f}% reach a Python "
              f"module's top level")
        if dwarf:
            # Unwound from .eh_frame, a stack is whole when the unwinder reached the outermost
            # frame (a thread's entry counts: threads do not start in main); cut ones are marked.
            whole = sum(v for p, v in stacks if "[truncated stack]" not in p and "[no stack]" not in p)
            print(f"{'':13} {100 * whole / events:6.2f}% walked to their outermost frame (thread entries included), "
                  f"{100 * sum(v for p, v in stacks if '[truncated stack]' in p) / events:.2f}% marked truncated")


if __name__ == "__main__":
    sys.exit(main())
