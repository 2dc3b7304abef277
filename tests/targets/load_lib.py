"""Loads a shared library late through ctypes and calls run_static() in it at once."""
import ctypes
import sys

print(f"load_lib: run_static returned {ctypes.CDLL(sys.argv[1]).run_static()}")
