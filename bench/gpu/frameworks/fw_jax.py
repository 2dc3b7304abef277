#!/usr/bin/env python3
"""A jitted JAX step run N times. XLA names its own kernels (fusions, GEMMs) and may launch them
through CUDA graphs (command buffers), so nothing is expected by name: frameworks_check.py
reports what was named and timed. Writes what it ran as JSON.
    python3 fw_jax.py OUT.json [--launches N]"""
import json
import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402


@jax.jit
def step(w, x):
    h = jnp.tanh(x @ w)
    return w - 1e-3 * (x.T @ h), jnp.sum(h * h)


def main():
    out_path, n = sys.argv[1], int(sys.argv[sys.argv.index("--launches") + 1]) if "--launches" in sys.argv else 200
    kx, kw = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.normal(kx, (512, 1024), jnp.float32)
    w = jax.random.normal(kw, (1024, 1024), jnp.float32) * 0.01
    for _ in range(n):
        w, loss = step(w, x)  # the launch line
    loss.block_until_ready()
    json.dump({"framework": "jax", "version": jax.__version__, "devices": [str(d) for d in jax.devices()],
               "expected": {}, "steps": n, "launch_file": __file__, "launch_function": "main"}, open(out_path, "w"))


if __name__ == "__main__":
    main()
