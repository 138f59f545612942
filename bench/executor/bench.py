"""Round trip of a trivial function: lockbox cold sandbox, lockbox warm pool, Ray (when
installed), against a baseline reproducing the reference executor (multiprocessing.Process
+ Queue + shared memory, no isolation). Prints one line per mode: median and p90 in ms.

    python bench/executor/bench.py [--calls N]

Calls are sequential; between warm-pool calls the bench waits until the pool is refilled,
(the pool hands out only interpreters that finished starting), so the number is the
latency a caller sees with a ready interpreter (the refill's CPU cost
is reported separately by the cold mode, which is exactly one start).
"""

import argparse
import multiprocessing as mp
import pickle
import statistics
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


def measure(label, call, n, before=None):
    times = []
    for _ in range(n):
        if before is not None:
            before()
        t = time.perf_counter()
        assert call() == 3
        times.append((time.perf_counter() - t) * 1000)
    times.sort()
    med = statistics.median(times)
    p90 = times[int(len(times) * 0.9) - 1]
    print(f"{label:<28} median {med:8.2f} ms   p90 {p90:8.2f} ms   (n={n})")
    return med


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=30)
    n = ap.parse_args().calls
    from lockbox.executor import SandboxExecutor, SandboxPool, wait_for_cleanup

    base = measure("baseline (mp + Queue + shm)", lambda: baseline(trivial, 1, 2), n)
    cold = SandboxExecutor(timeout=30)
    measure("lockbox cold sandbox", lambda: cold.secure_execute(trivial, 1, 2).result, n)
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
