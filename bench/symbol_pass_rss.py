#!/usr/bin/env python3
"""The agent's profile naming (symbolize::name_offsets) on a library shaped like libtorch: one
with hundreds of thousands of long C++ function names. Builds such a library (assembler, a few
seconds) and prints what one pass over its symbols costs in time and in peak resident memory,
beside some libraries of this machine.

    python3 bench/symbol_pass_rss.py [--build build] [--functions 300000]"""
import argparse
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", type=pathlib.Path, default=ROOT / "build")
    ap.add_argument("--functions", type=int, default=300000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        asm, lib = pathlib.Path(tmp, "big.s"), pathlib.Path(tmp, "libmanynames.so")
        with open(asm, "w") as f:
            f.write(".text\n.section .note.GNU-stack,\"\",@progbits\n.text\n")
            for i in range(args.functions):
                name = f"_ZN5torch8autograd9generated{i:07d}" + "x" * 260 + "Ev"  # ~300-byte mangled names
                f.write(f".globl {name}\n.type {name},@function\n{name}:\n nop\n nop\n ret\n.size {name},3\n")
        subprocess.run(["gcc", "-shared", "-nostdlib", "-o", lib, asm], check=True)
        libs = [str(lib)] + [p for p in ("/usr/lib/x86_64-linux-gnu/libLLVM-15.so.1", "/usr/lib/x86_64-linux-gnu/libc.so.6",
                                         "/usr/lib/x86_64-linux-gnu/libstdc++.so.6") if pathlib.Path(p).exists()]
        for _ in range(2):
            subprocess.run([args.build / "bench" / "name_offsets_rss", *libs], check=True)


if __name__ == "__main__":
    sys.exit(main())
