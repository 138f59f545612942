"""Round trip of a trivial function: lockbox cold sandbox, lockbox warm pool, Ray (when
installed), against a baseline reproducing the reference executor (multiprocessing.Process
+ Queue + shared memory, no isolation). Prints one line per mode: median and p90 in ms.

    python bench/executor/bench.py [--calls N] [--cold-only] [--loop cold|python]

The cold sandbox is measured alternately with its own baseline, ``python -I -c`` importing
what the sandboxed interpreter imports (``COLD_IMPORTS``) with no sandbox, so that a
loaded machine slows both alike; the ratio of the medians is what isolation costs a cold
call. Before each of both, the previous sandbox's teardown (off the caller's path) is
waited for, so that it slows neither; "second of two" then times a call made right after
another, as in a loop of calls, where it overlaps the previous sandbox's teardown.

Calls are sequential; between warm-pool calls the bench waits until the pool is refilled,
(the pool hands out only interpreters that finished starting), so the number is the
latency a caller sees with a ready interpreter (the refill's CPU cost
is reported separately by the cold mode, which is exactly one start).
"""

import argparse
import multiprocessing as mp
import pickle
import statistics
import subprocess
import sys
import time
import uuid
from multiprocessing import resource_tracker, shared_memory
from queue import Empty


def trivial(a, b):
    return a + b


def _child(fn, args, q, shm_name):
    try:
        data = pickle.dumps(fn(*args), protocol=pickle.HIGHEST_PROTOCOL)
        shm = shared_memory.SharedMemory(create=True, name=shm_name, size=len(data))
        resource_tracker.unregister(shm._name, "shared_memory")  # noqa: SLF001 - as the reference does
        shm.buf[: len(data)] = data
        q.put((True, len(data)))
    except Exception as e:  # noqa: BLE001
        q.put((False, str(e)))


def baseline(fn, *args, timeout=10):
    """The reference executor: a Process, a Queue for metadata, shared memory for the data."""
    q = mp.Queue()
    name = f"psm_{uuid.uuid4().hex[:8]}"
    p = mp.Process(target=_child, args=(fn, args, q, name))
    p.start()
    try:
        ok, size = q.get(timeout=timeout)
        shm = shared_memory.SharedMemory(name=name)
        value = pickle.loads(bytes(shm.buf[:size]))
        shm.close()
        shm.unlink()
        return value
    except Empty:
        return None
    finally:
        p.terminate()
        p.join()


#: What a cold call's interpreter imports (lockbox/_bootstrap.py; unpickling a function
#: pickled by value needs cloudpickle, which itself imports pickle and traceback): its
#: baseline imports the same, with the same flag, outside a sandbox.
COLD_IMPORTS = "import os, sys, struct, traceback, pickle, cloudpickle"


def python_import():
    subprocess.run([sys.executable, "-I", "-c", COLD_IMPORTS], check=True)
    return 3


def python_import_ready(timing):
    """The stricter baseline: until the imports are done (a byte on a pipe), not until the
    interpreter's exit (a cold call returns at its result, before its interpreter exits)."""
    t = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-I", "-c", COLD_IMPORTS + "; os.write(1, b'r')"],
                         stdout=subprocess.PIPE)
    assert p.stdout.read(1) == b"r"
    timing.append((time.perf_counter() - t) * 1000)
    p.wait()


def timed(call, before=None):
    if before is not None:
        before()
    t = time.perf_counter()
    assert call() == 3
    return (time.perf_counter() - t) * 1000


def report(label, times):
    times = sorted(times)
    med = statistics.median(times)
    p90 = times[int(len(times) * 0.9) - 1]
    print(f"{label:<44} median {med:8.2f} ms   p90 {p90:8.2f} ms   (n={len(times)})")
    return med


def measure(label, call, n, before=None):
    return report(label, [timed(call, before) for _ in range(n)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--cold-only", action="store_true", help="only the cold call and its baseline")
    ap.add_argument("--loop", choices=["cold", "python"],
                    help="only N cold calls (or N python -c runs) back to back, for perf stat")
    args = ap.parse_args()
    n = args.calls
    from lockbox.executor import SandboxExecutor, SandboxPool, wait_for_cleanup

    cold = SandboxExecutor(timeout=30)
    cold_call = lambda: cold.secure_execute(trivial, 1, 2).result  # noqa: E731
    if args.loop:
        # `perf stat` counts every process of the run (the sandboxes are descendants), so
        # two runs, with --calls N and --calls 0, give the CPU per call, teardown included.
        call = cold_call if args.loop == "cold" else python_import
        t = time.perf_counter()
        for _ in range(n):
            assert call() == 3
        wait_for_cleanup()
        if n:
            print(f"{args.loop}: {(time.perf_counter() - t) * 1000 / n:.2f} ms per call, back to back (n={n})")
        return
    timed(python_import)
    timed(cold_call)  # warm-up: the page cache and the parent's first-call imports
    py_t, ready_t, cold_t = [], [], []
    for _ in range(n):
        py_t.append(timed(python_import, wait_for_cleanup))
        wait_for_cleanup()
        python_import_ready(ready_t)
        cold_t.append(timed(cold_call, wait_for_cleanup))
    py = report("python -I -c 'import ...' (to exit)", py_t)
    ready = report("python -I -c 'import ...' (to imports done)", ready_t)
    c = report("lockbox cold sandbox", cold_t)
    print(f"cold sandbox vs python -c: {c / py:.2f}x to its exit, {c / ready:.2f}x to its imports (target <= 1.5x)")
    # As a loop of calls sees it: a call right after another overlaps its sandbox's
    # teardown. Timed: the second of two calls, alternately with two python -c runs.
    b2b_t, py2_t = [], []
    for _ in range(n):
        wait_for_cleanup()
        cold_call()
        b2b_t.append(timed(cold_call))
        wait_for_cleanup()
        python_import()
        py2_t.append(timed(python_import))
    py2 = report("python -I -c 'import ...', second of two", py2_t)
    b2b = report("lockbox cold sandbox, second of two", b2b_t)
    wait_for_cleanup()
    print(f"second of two: cold sandbox vs python -c: {b2b / py2:.2f}x to its exit")
    if args.cold_only:
        return
    base = measure("baseline (mp + Queue + shm)", lambda: baseline(trivial, 1, 2), n)
    with SandboxPool(2, timeout=30) as pool:

        def refilled():
            wait_for_cleanup()
            pool.wait_ready()

        w = measure("lockbox warm pool", lambda: pool.secure_execute(trivial, 1, 2).result, n, refilled)
    print(f"warm pool vs baseline: {base / w:.1f}x faster")
    try:
        import ray
    except ImportError:
        print("ray: not installed, skipped")
        return
    from lockbox.ray import RaySandboxPool

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rp = RaySandboxPool(1, timeout=30)
    measure("ray + lockbox (warm actor)", lambda: rp.secure_execute(trivial, 1, 2).result, n, rp.wait_ready)
    rp.close()
    ray.shutdown()


if __name__ == "__main__":
    main()
