#!/usr/bin/env python3
"""What one uprobe hit costs by the instruction it replaces (bench/trap_kinds.c): `push %rbp`
(emulated: how the CUDA libraries' functions begin, so the floor of every gpuscope probe), a
5-byte nop (optimized into a system-call trampoline on kernels that have optimized uprobes) and
`mov` (single-stepped out of line). An empty BPF program (bench/empty_probe) on all three against
no probe, rounds interleaved; medians and spreads of the time a probe adds to a call.

    sudo bench/trap_kinds.py [--build build] [--calls 200000] [--rounds 5]
    bench/trap_kinds.py --entries LIBRARY FUNCTION...   # which kind each function's entry is"""
import argparse
import json
import pathlib
import statistics
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from uprobe_cost import ROOT, EmptyProbe  # noqa: E402

KINDS = ("push", "nop5", "mov")


def entry_kind(code):
    """How x86 kernels get past a uprobe on these first bytes: 6.18's uprobes emulate pushes of a
    register, relative jumps and calls, and nops; optimize a 5-byte nop; single-step the rest."""
    rex = 1 if code[0] == 0x41 else 0
    if 0x50 <= code[rex] <= 0x57:
        return "push (emulated)"
    if code[:5] == bytes.fromhex("0f1f440000"):
        return "nop5 (optimized)"
    if code[0] in (0x90, 0xe8, 0xe9, 0xeb) or 0x70 <= code[0] <= 0x7f:
        return "nop/jump/call (emulated)"
    if code[:4] == bytes.fromhex("f30f1efa"):
        return "endbr64 (single-stepped)"
    return "other (single-stepped)"


def print_entries(library, names):
    import ctypes
    lib = ctypes.CDLL(library)
    for name in names:
        try:
            addr = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
        except AttributeError:
            print(f"  {name:34} not in {library}")
            continue
        code = ctypes.string_at(addr, 8)
        print(f"  {name:34} {code.hex(' ')}  {entry_kind(code)}")


def run(binary, calls):
    out = subprocess.run([str(binary), str(calls), "1"], capture_output=True, text=True, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    per_kind = {r["kind"]: r["ns_per_call"] for r in rows if "kind" in r}
    trampoline = next(r["uprobes_trampoline_mapped"] for r in rows if "uprobes_trampoline_mapped" in r)
    return per_kind, trampoline


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", type=pathlib.Path, default=ROOT / "build")
    ap.add_argument("--calls", type=int, default=200000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--entries", nargs="+", metavar="LIBRARY FUNCTION",
                    help="print the first bytes of these functions of LIBRARY and how a uprobe gets past them")
    args = ap.parse_args()
    if args.entries:
        print_entries(args.entries[0], args.entries[1:])
        return
    binary = args.build / "bench" / "trap_kinds"
    samples = {c: {k: [] for k in KINDS} for c in ("no probe", "empty program")}
    trampolines = []
    for _ in range(args.rounds):
        for config in samples:
            probe = EmptyProbe(args.build, {str(binary): [f"trap_kind_{k}" for k in KINDS]}) \
                if config == "empty program" else None
            try:
                per_kind, trampoline = run(binary, args.calls)
            finally:
                if probe:
                    probe.close()
            if probe:
                trampolines.append(trampoline)
            for k in KINDS:
                samples[config][k].append(per_kind[k])
    print(f"ns a call, median (min..max) of {args.rounds} interleaved rounds; {args.calls} calls "
          f"({args.calls // 10} for mov) a round")
    print(f"  {'entry instruction':18} {'no probe':>22} {'empty program':>26} {'added':>9}")
    result = {}
    for k in KINDS:
        base, probed = samples["no probe"][k], samples["empty program"][k]
        added = statistics.median(probed) - statistics.median(base)
        result[k] = {"no_probe": base, "empty_program": probed, "added_ns": added}
        print(f"  {k:18} {statistics.median(base):9.1f} ({min(base):.1f}..{max(base):.1f}) "
              f"{statistics.median(probed):11.1f} ({min(probed):.1f}..{max(probed):.1f}) {added:9.1f}")
    print(f"kernel's uprobe trampoline mapped in the probed process: {sum(trampolines)} of {len(trampolines)} runs "
          "(mapped: the nop5 probe was optimized into a system call)")
    print(json.dumps({"trap_kinds": result, "trampoline_runs": trampolines}))


if __name__ == "__main__":
    main()
