"""Loads a shared library late through ctypes and calls a function in it at once:
run_static(), or the function named by the second argument with the integer arguments after it.
--sleep-ms MS first: sleeps that long before loading it."""
import ctypes
import sys
import time

args = sys.argv[1:]
if args[:1] == ["--sleep-ms"]:
    time.sleep(int(args[1]) / 1000)
    args = args[2:]
lib = ctypes.CDLL(args[0])
name = args[1] if len(args) > 1 else "run_static"
print(f"load_lib: {name} returned {getattr(lib, name)(*map(int, args[2:]))}")
