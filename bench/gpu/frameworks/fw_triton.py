#!/usr/bin/env python3
"""A Triton kernel launched N times (Triton launches through the driver's cuLaunchKernelEx from a
launcher it compiles at first use). Writes what it launched as JSON: frameworks_check.py compares.
    python3 fw_triton.py OUT.json [--launches N]"""
import json
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def gpuscope_add_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def main():
    out_path, n = sys.argv[1], int(sys.argv[sys.argv.index("--launches") + 1]) if "--launches" in sys.argv else 200
    x = torch.rand(1 << 22, device="cuda")
    y, out = torch.rand_like(x), torch.empty_like(x)
    grid = (triton.cdiv(x.numel(), 1024),)
    for _ in range(n):
        gpuscope_add_kernel[grid](x, y, out, x.numel(), BLOCK=1024)  # the launch line
    torch.cuda.synchronize()
    assert torch.allclose(out, x + y)
    json.dump({"framework": "triton", "version": triton.__version__, "expected": {"gpuscope_add_kernel": n},
               "launch_file": __file__, "launch_function": "main"}, open(out_path, "w"))


if __name__ == "__main__":
    main()
