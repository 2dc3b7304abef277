"""Code objects made and freed in turn, each at the address the one before it had (CPython's
allocator hands a freed block of a size to the next object of that size): each calls CUDA from
its own function, whose name and line the call's stack must show. Function i recurses i times
first: each stack is new, so its frames are sent (a stack already sent, made again of new code
objects at the same addresses, is not told apart: see python.bpf.c's send_py_code).

usage: py_reused_code.py LIBCUDART N"""
import ctypes
import sys

cudart = ctypes.CDLL(sys.argv[1])

for i in range(int(sys.argv[2])):
    # f{i}, defined on line i + 1 of gen.py, calls cudaFree on line i + 2.
    source = "\n" * i + f"def f{i}(k):\n    return f{i}(k - 1) if k else cudart.cudaFree(None)\nf{i}({i})\n"
    code = compile(source, "gen.py", "exec")
    scope = {"cudart": cudart}
    exec(code, scope)
    scope.clear()  # f{i} and its globals hold each other: without this only the collector frees them
    del code
