"""E2B SDK against `lockbox serve` (issue 30's targets), through the unmodified `e2b` package:

- `Sandbox.create()` -> first `commands.run("true")` result, p50 over N (warm pool): <= 10 ms;
- a `commands.run("true")` round trip in one sandbox, p50: <= 2 ms;
- 20 concurrent `Sandbox.create()`: 100 % succeed;
- and where a round trip goes: an RPC that starts no process, and the start of the SDK's
  `/bin/bash -l -c` inside the sandbox.

Usage: python bench/e2b/sdk.py [LOCKBOX_BINARY] [N]   (default target/release/lockbox, 100)
Prints one JSON line per measurement. Needs `pip install e2b==2.63.0`.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main() -> None:
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/release/lockbox"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    state = tempfile.mkdtemp(prefix="lockbox-bench-e2b-")
    proc = subprocess.Popen([binary, "serve", "--listen", "127.0.0.1:0", "--state-dir", state, "--print-token",
                             # Room for E2B's spec beside the default one: with --pool-max-spares
                             # equal to --pool only the default spec would be pooled.
                             "--pool", "4", "--pool-max-spares", "16"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = json.loads(proc.stdout.readline())
    url = f"http://{line['listen']}"
    os.environ.update({"E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": line["token"],
                       "E2B_DOMAIN": "lockbox.test"})
    from e2b import Sandbox

    try:
        for _ in range(5):  # warm-up: connections, the pool's first refill
            s = Sandbox.create()
            s.commands.run("true")
            s.kill()
        create = []
        for _ in range(n):
            t0 = time.perf_counter()
            s = Sandbox.create()
            s.commands.run("true")
            create.append((time.perf_counter() - t0) * 1000)
            s.kill()
            time.sleep(0.1)  # let the pool refill (its sandboxes start in the background), as a steady agent loop would
        print(json.dumps({"measure": "create_to_first_run_ms", "n": n, "p50": statistics.median(create),
                          "p90": pct(create, 90), "min": min(create), "max": max(create)}))
        s = Sandbox.create()
        s.commands.run("true")
        rt = []
        for _ in range(n * 2):
            t0 = time.perf_counter()
            s.commands.run("true")
            rt.append((time.perf_counter() - t0) * 1000)
        print(json.dumps({"measure": "commands_run_round_trip_ms", "n": n * 2, "p50": statistics.median(rt),
                          "p90": pct(rt, 90), "min": min(rt), "max": max(rt)}))
        # Where a round trip goes: an RPC that starts no process (Process/List) is the SDK,
        # HTTP and envd's share; the SDK runs every command as `/bin/bash -l -c CMD`, whose
        # start inside the sandbox (timed there, 50 times each) is the process's share.
        rpc = []
        for _ in range(n * 2):
            t0 = time.perf_counter()
            s.commands.list()
            rpc.append((time.perf_counter() - t0) * 1000)
        loop = ('for c in "/bin/true" "bash -c true" "bash -l -c true"; do s=$(date +%s%N); '
                'for i in $(seq 50); do $c; done; e=$(date +%s%N); echo "$c=$(( (e - s) / 50000 ))"; done')
        starts = dict(line.rsplit("=", 1) for line in s.commands.run(loop).stdout.splitlines())
        s.kill()
        print(json.dumps({"measure": "round_trip_breakdown_ms", "rpc_without_a_process_p50": statistics.median(rpc),
                          "in_sandbox_start": {k: int(v) / 1000 for k, v in starts.items()}}))
        ok, errors = [], []

        def one() -> None:
            try:
                sb = Sandbox.create()
                ok.append(sb)
            except Exception as e:  # noqa: BLE001 - counted
                errors.append(repr(e))

        threads = [threading.Thread(target=one) for _ in range(20)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = (time.perf_counter() - t0) * 1000
        for sb in ok:
            sb.kill()
        print(json.dumps({"measure": "concurrent_creates", "asked": 20, "succeeded": len(ok), "wall_ms": wall,
                          "errors": errors[:3]}))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        subprocess.run(["rm", "-rf", state], check=False)


if __name__ == "__main__":
    main()
