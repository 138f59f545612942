#!/usr/bin/env python3
"""bench/fleet/executor.py: one call of a fleet pool (`RaySandboxPool(fleet=...)`) on its
node's `lockbox serve`, with the interpreter started ahead and started in the call.

    cargo build --release -p lockbox-cli
    python bench/fleet/executor.py [--lockbox target/release/lockbox] [--calls 100]
    # in a virtualenv with the lockbox wheel and cloudpickle installed

Starts one `lockbox serve` on 127.0.0.1 (a state directory of its own, `--pool 0`) and
drives the fleet actor's code (`lockbox.ray._FleetWorker`) in this process, its node client
pointed at that server: no Ray, since what is measured is the actor's work on a call. Two
rows, alternated call by call after 10 warm-up calls of each, `sum([1, 2, 3])` pickled with
cloudpickle as `secure_execute` does:

- "warm interpreter": the pool as it is, a sandbox made ahead whose interpreter already runs,
  waiting for the payload (the call: write stdin, follow its end, read the result file);
- "interpreter per call": a sandbox made ahead, the runner started by the call's `exec`
  with the payload on its stdin (what the fleet pool did before).

Both include the time to take a ready sandbox; neither includes making one or deleting it
(done off the call's path, as the pool does). Prints p50/p90/p99 in ms. Asserts no timings.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import cloudpickle

import lockbox
from lockbox.executor import ExecutionResult
from lockbox.ray import _RESULT, _FleetWorker


class Worker(_FleetWorker):
    """The fleet actor's code, its node client fixed."""

    def __init__(self, client, per_actor):
        self._fixed = client
        super().__init__("bench", "bench-node", {"timeout": 60, "pickler": "cloudpickle"}, per_actor, "bench")

    def client(self, fresh=False):
        return self._fixed


class PerCall(Worker):
    """The pool before: each call's exec starts the runner."""

    def _create(self):
        box = self.client().create(**self.fields)
        return box, None

    def run(self, payload):
        started = time.monotonic()
        box, _ = self._take()
        self._refill()
        r = box.exec(self.command_per_call, stdin=payload, timeout=self.timeout)
        self._reaper.submit(self._delete, box)
        buf = r.stdout_bytes
        ok = buf[:2] == b"Ro" and r.exit_code == 0
        return ExecutionResult("ok" if ok else "crashed", error=None if ok else repr(r),
                               duration=time.monotonic() - started)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lockbox", default=os.path.join(
        os.environ.get("CARGO_TARGET_DIR", "target"), "release", "lockbox"))
    p.add_argument("--calls", type=int, default=100)
    a = p.parse_args()
    state = tempfile.mkdtemp(prefix="lockbox-bench-fleet-exec-")
    server = subprocess.Popen([a.lockbox, "serve", "--listen", "127.0.0.1:0", "--print-token", "--state-dir",
                               state, "--pool", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    workers = []
    try:
        first = json.loads(server.stdout.readline())
        client = lockbox.Client("http://" + first["listen"], first["token"])
        warm = Worker(client, 2)
        per_call = PerCall(client, 2)
        # The same interpreter and runner, its result on the exec's stdout.
        per_call.command_per_call = warm.command.replace("exec ", "", 1).replace(f"3>{_RESULT}", "3>&1")
        workers = [warm, per_call]
        data = cloudpickle.dumps((sum, ([1, 2, 3],), {}))
        payload = len(data).to_bytes(8, "big") + data
        times = {"warm interpreter": [], "interpreter per call": []}
        rows = [("warm interpreter", warm), ("interpreter per call", per_call)]
        for i in range(a.calls + 10):
            for name, w in (rows if i % 2 == 0 else rows[::-1]):
                w.wait_ready()  # a ready sandbox, its previous one deleted: the call alone is timed
                t = time.perf_counter()
                r = w.run(payload)
                elapsed = time.perf_counter() - t
                assert r.status == "ok", r
                if i >= 10:
                    times[name].append(elapsed * 1000)
        print(f"{a.calls} calls each, load {os.getloadavg()[0]:.2f}\n")
        print("| call | p50 (ms) | p90 (ms) | p99 (ms) |")
        print("|---|---:|---:|---:|")
        for name, ts in times.items():
            ts.sort()
            q = lambda f: ts[min(len(ts) - 1, int(f * len(ts)))]
            print(f"| {name} | {statistics.median(ts):.1f} | {q(0.9):.1f} | {q(0.99):.1f} |")
    finally:
        for w in workers:
            w.close()
        server.terminate()
        server.wait(timeout=60)
        subprocess.run(["rm", "-rf", state])


if __name__ == "__main__":
    sys.exit(main())
