"""Loads a shared library late through ctypes and calls a function in it at once:
run_static(), or the function named by the second argument with the integer arguments after it."""
import ctypes
import sys

lib = ctypes.CDLL(sys.argv[1])
name = sys.argv[2] if len(sys.argv) > 2 else "run_static"
print(f"load_lib: {name} returned {getattr(lib, name)(*map(int, sys.argv[3:]))}")
