"""Checks gpuscope's record of train_step.py against torch.profiler's view of the same steps.

    python3 compare.py RECORD.gpuscope TRUTH.json
Exit 0 when launches per kernel name are equal and device memory in use at exit equals
torch.cuda.memory_reserved(); prints every difference otherwise."""
import json
import sqlite3
import sys


def main():
    record, truth_path = sys.argv[1], sys.argv[2]
    truth = json.load(open(truth_path))
    db = sqlite3.connect(record)
    ok = True

    rows = db.execute(
        "SELECT coalesce(k.demangled, '[unnamed ' || printf('%x', c.kernel_handle) || ']'), count(*) "
        "FROM calls c JOIN functions f ON f.id = c.func LEFT JOIN kernels k ON k.id = c.kernel_id "
        "WHERE f.kind = 'launch' AND c.parent_id IS NULL AND c.pid = ? AND c.ts_ns BETWEEN ? AND ? "
        "GROUP BY 1", (truth["pid"], truth["t0"], truth["t1"])).fetchall()
    ours = dict(rows)
    theirs = truth["kernels"]
    names = sorted(set(ours) | set(theirs), key=lambda n: -max(ours.get(n, 0), theirs.get(n, 0)))
    same = sum(1 for n in names if ours.get(n) == theirs.get(n))
    print(f"kernels: {len(names)} names, {same} with equal counts; "
          f"launches gpuscope={sum(ours.values())} torch.profiler={sum(theirs.values())}")
    for n in names:
        if ours.get(n) != theirs.get(n):
            ok = False
            print(f"  DIFF gpuscope={ours.get(n, 0):5d} profiler={theirs.get(n, 0):5d}  {n[:150]}")

    # Device memory in use at exit: successful top-level device/managed allocations not freed,
    # split by who allocated them (the allocation's stack), since torch.cuda.memory_reserved()
    # counts only PyTorch's caching allocator (libc10_cuda) and not, e.g., cuBLAS's own workspace.
    live = {}
    for func, ret, ptr, nbytes, stack in db.execute(
            "SELECT f.name, c.ret, c.ptr, c.bytes, c.stack_id FROM calls c JOIN functions f ON f.id = c.func "
            "WHERE c.pid = ? AND c.parent_id IS NULL AND f.kind IN ('alloc', 'free') ORDER BY c.ts_ns",
            (truth["pid"],)):
        if ret != 0 or ptr is None:
            continue
        if func in ("cudaMalloc", "cudaMallocAsync", "cudaMallocManaged", "cuMemAlloc_v2", "cuMemAllocAsync",
                    "cuMemAllocManaged"):
            live[ptr] = (nbytes, stack)
        elif func in ("cudaFree", "cudaFreeAsync", "cuMemFree_v2", "cuMemFreeAsync"):
            live.pop(ptr, None)
    owner_of_stack = {}
    for stack_id, in db.execute("SELECT DISTINCT stack_id FROM calls WHERE stack_id IS NOT NULL AND pid = ?",
                                (truth["pid"],)):
        paths = [p for p, in db.execute(
            "SELECT m.path FROM stack_frames sf JOIN modules m ON m.id = sf.module_id WHERE sf.stack_id = ? "
            "ORDER BY sf.depth", (stack_id,))]
        owner = "no stack"
        for p in paths:
            base = p.rsplit("/", 1)[-1]
            if not base.startswith(("libcudart", "libcuda.")):
                owner = base
                break
        owner_of_stack[stack_id] = owner
    by_owner = {}
    for nbytes, stack in live.values():
        owner = owner_of_stack.get(stack, "no stack")
        by_owner[owner] = by_owner.get(owner, 0) + nbytes
    in_use = sum(by_owner.values())
    torch_alloc = by_owner.get("libc10_cuda.so", 0)
    print(f"device memory in use at exit: {in_use} bytes in all; by allocating library: {by_owner}")
    print(f"  PyTorch's caching allocator (libc10_cuda.so): gpuscope={torch_alloc} "
          f"torch.cuda.memory_reserved()={truth['memory_reserved']}")
    if torch_alloc != truth["memory_reserved"]:
        ok = False
        print("  DIFF memory")
    # Traps per launch: each probed launch is one trap; a runtime launch that reaches the
    # driver traps twice (its row carries the driver launch in driver_func).
    for api, n, both in db.execute(
            "SELECT f.api, count(*), count(c.driver_func) FROM calls c JOIN functions f ON f.id = c.func "
            "WHERE f.kind = 'launch' AND c.pid = ? AND c.ts_ns BETWEEN ? AND ? GROUP BY f.api",
            (truth["pid"], truth["t0"], truth["t1"])):
        print(f"{api} launches: {n} ({both} of them also probed in the driver: 2 traps each)")
    # Stacks walked from .eh_frame and cut short keep their first frames: not events lost.
    lost_by = dict(db.execute("SELECT cause, count FROM lost WHERE count > 0"))
    lost = sum(n for c, n in lost_by.items() if not c.startswith("unwind_"))
    print(f"lost events: {lost}" + (f" (and stacks cut short: {lost_by})" if lost_by else ""))
    print("RESULT:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
