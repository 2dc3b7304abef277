#!/usr/bin/env python3
"""Finds, in the running interpreter, the structure offsets gpuscope reads to walk Python
frames from BPF (src/discover/python_offsets.cpp holds them per version).

Each offset is found by searching the live structure for a value the public C API or the
interpreter itself gives (a thread's native id, the interpreter head, a code object's
filename), so the result does not depend on headers. Use it to check the table on a new
interpreter, or to add a version:  python3.X tools/python_offsets.py
Prints JSON; exits 1 when an offset could not be found."""
import ctypes
import json
import os
import struct
import sys
import threading
import time

api = ctypes.pythonapi
api.PyInterpreterState_Head.restype = ctypes.c_void_p
api.PyInterpreterState_ThreadHead.restype = ctypes.c_void_p
api.PyInterpreterState_ThreadHead.argtypes = [ctypes.c_void_p]
api.PyThreadState_Next.restype = ctypes.c_void_p
api.PyThreadState_Next.argtypes = [ctypes.c_void_p]
api.PyThreadState_Get.restype = ctypes.c_void_p


# Reads go through /proc/self/mem, so that following a word that is not a pointer fails
# cleanly instead of crashing the interpreter.
_mem = os.open("/proc/self/mem", os.O_RDONLY)


def read(addr, n):
    try:
        data = os.pread(_mem, n, addr)
    except OSError:
        return None
    return data if len(data) == n else None


def u64(addr):
    data = read(addr, 8)
    return struct.unpack("<Q", data)[0] if data else None


def u32(addr):
    data = read(addr, 4)
    return struct.unpack("<I", data)[0] if data else None


def find_u64(base, value, limit, step=8):
    for off in range(0, limit, step):
        if u64(base + off) == value:
            return off
    return None


found = {"version": "%d.%d.%d" % sys.version_info[:3]}
missing = []


def put(name, value):
    found[name] = value
    if value is None:
        missing.append(name)


runtime = ctypes.addressof(ctypes.c_char.in_dll(api, "_PyRuntime"))
interp = api.PyInterpreterState_Head()
put("runtime_interp_head", find_u64(runtime, interp, 4096))
thread_head = api.PyInterpreterState_ThreadHead(interp)
put("interp_threads_head", find_u64(interp, thread_head, 16384))  # 3.13: past 4 KiB

# A second thread, so that the list has a `next` to find.
ready, done = threading.Event(), threading.Event()
t = threading.Thread(target=lambda: (ready.set(), done.wait()))
t.start()
ready.wait()
me = api.PyThreadState_Get()
head = api.PyInterpreterState_ThreadHead(interp)
nxt = api.PyThreadState_Next(head)
put("tstate_next", find_u64(head, nxt, 512) if nxt else None)
put("tstate_native_thread_id", find_u64(me, threading.get_native_id(), 1024))
done.set()
t.join()

# The running frame: in 3.11+ a frame object points at its _PyInterpreterFrame (f_frame, the
# third word after the object header) while the function runs.
def probe_frames():
    f = sys._getframe()
    iframe = u64(id(f) + 24)
    caller_iframe = u64(id(f.f_back) + 24)
    # tstate -> cframe -> current_frame (3.11, 3.12) or tstate -> current_frame (3.13+). Read
    # while that thread sleeps in C, so that its current frame stays the sleeping function's:
    # read here, it would be the frame of whatever function does the reading.
    box, ready = {}, threading.Event()

    def sleeper():
        box["iframe"] = u64(id(sys._getframe()) + 24)
        box["tstate"] = api.PyThreadState_Get()
        ready.set()
        time.sleep(1.0)

    t = threading.Thread(target=sleeper)
    t.start()
    ready.wait()
    time.sleep(0.2)
    ts, target = box["tstate"], box["iframe"]
    for off in range(0, 512, 8):
        p = u64(ts + off)
        if p == target:
            found["tstate_cframe"] = None  # the frame pointer is in the thread state itself
            found["current_frame"] = off
            break
        hits = [inner for inner in (0, 8) if p and p > 4096 and u64(p + inner) == target]
        if hits:
            found["tstate_cframe"] = off
            found["current_frame"] = hits[0]
            break
    else:
        missing.append("current_frame")
    t.join()
    code = f.f_code
    put("frame_code", find_u64(iframe, id(code), 128))
    put("frame_previous", find_u64(iframe, caller_iframe, 128))
    adaptive = type(code).__basicsize__
    found["code_adaptive"] = adaptive
    lo, hi = id(code) + adaptive, id(code) + adaptive + len(code.co_code)
    instr = None
    for off in range(0, 128, 8):
        if lo <= (u64(iframe + off) or 0) < hi:
            instr = off
            break
    put("frame_instr", instr)
    return code


code = probe_frames()


# Where one C call into the interpreter starts: 3.11 marks that frame (is_entry); 3.12+ puts
# a shim frame owned by the C stack (owner == 3) under it. Compared between a frame called
# from Python and one called from C (through map).
def frame_bytes():
    f = sys._getframe(1)
    iframe = u64(id(f) + 24)
    prev = u64(iframe + found["frame_previous"])
    return read(iframe, 80), read(prev, 80) if prev else None


def from_python():
    return frame_bytes()


def from_c(_):
    return frame_bytes()


def from_python_more_locals(a, b, c, d):
    return frame_bytes()


py_own, py_prev = from_python()
py2_own, _ = from_python_more_locals(1, 2, 3, 4)
c_own, c_prev = list(map(from_c, [0]))[0]
if sys.version_info < (3, 12):
    # The value-stack depth sits beside is_entry; a frame with more locals tells them apart.
    put("frame_is_entry", next((o for o in range(60, 80)
                                if py_own[o] == 0 and py2_own[o] == 0 and c_own[o] == 1), None))
else:
    put("frame_owner", next((o for o in range(60, 80) if py_own[o] == 0 and c_prev and c_prev[o] == 3), None))


class Probe:
    def method(self):
        return sys._getframe().f_code


qual = Probe().method()
put("code_filename", find_u64(id(code), id(code.co_filename), 256))
put("code_name", find_u64(id(code), id(code.co_name), 256))
put("code_qualname", find_u64(id(qual), id(getattr(qual, "co_qualname", None)), 256))
put("code_linetable", find_u64(id(code), id(code.co_linetable), 256))
# A code object with an unusual first line, to find co_firstlineno among the ints.
ns = {}
exec(compile("\n" * 4320 + "def f():\n    pass\n", "<probe>", "exec"), ns)
put("code_firstlineno", next((o for o in range(0, 256, 4) if u32(id(ns["f"].__code__) + o) == 4321), None))
# Compact ASCII strings keep their characters right after the PyASCIIObject header.
s = "gpuscope_probe_string"
put("unicode_ascii_data", next((o for o in range(16, 128, 8)
                                 if read(id(s) + o, len(s)) == s.encode()), None))
b = b"gpuscope-bytes"
put("bytes_data", next((o for o in range(16, 64, 8) if read(id(b) + o, len(b)) == b), None))

print(json.dumps(found, indent=1))
if missing:
    print("not found: " + ", ".join(missing), file=sys.stderr)
    sys.exit(1)
