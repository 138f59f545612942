"""Two `lockbox serve` binaries through the unmodified `e2b` SDK, measured call by call in
turn (issue 30), so that both see the same load of a shared machine:

- `Sandbox.create()` -> first `commands.run("true")` result (warm pool), N per binary;
- a `commands.run("true")` round trip in one sandbox, 2N per binary.

Usage: python bench/e2b/ab.py OLD_BINARY NEW_BINARY [N]   (default 100)
Prints one JSON line per measurement and binary. Needs `pip install e2b==2.63.0`.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def serve(binary):
    state = tempfile.mkdtemp(prefix="lockbox-bench-e2b-ab-")
    proc = subprocess.Popen([binary, "serve", "--listen", "127.0.0.1:0", "--state-dir", state, "--print-token",
                             "--pool", "4", "--pool-max-spares", "16"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    line = json.loads(proc.stdout.readline())
    url = f"http://{line['listen']}"
    return proc, {"api_url": url, "sandbox_url": url, "api_key": line["token"], "domain": "lockbox.test"}


def main() -> None:
    binaries = sys.argv[1:3]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    os.environ["E2B_DOMAIN"] = "lockbox.test"
    from e2b import Sandbox

    servers = [serve(b) for b in binaries]
    try:
        for _, conn in servers:
            for _ in range(5):  # warm-up: connections, the pool's first refill
                s = Sandbox.create(**conn)
                s.commands.run("true")
                s.kill()
        create = [[], []]
        for _ in range(n):
            for i, (_, conn) in enumerate(servers):
                t0 = time.perf_counter()
                s = Sandbox.create(**conn)
                s.commands.run("true")
                create[i].append((time.perf_counter() - t0) * 1000)
                s.kill()
                time.sleep(0.05)  # the pool refills in the background
        sandboxes = [Sandbox.create(**conn) for _, conn in servers]
        for s in sandboxes:
            s.commands.run("true")
        rt = [[], []]
        for _ in range(2 * n):
            for i, s in enumerate(sandboxes):
                t0 = time.perf_counter()
                s.commands.run("true")
                rt[i].append((time.perf_counter() - t0) * 1000)
        for s in sandboxes:
            s.kill()
        for measure, data in (("create_to_first_run_ms", create), ("commands_run_round_trip_ms", rt)):
            for binary, xs in zip(binaries, data):
                print(json.dumps({"measure": measure, "binary": binary, "n": len(xs),
                                  "p50": round(statistics.median(xs), 2), "p90": round(pct(xs, 90), 2),
                                  "min": round(min(xs), 2), "max": round(max(xs), 2)}))
    finally:
        for proc, _ in servers:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
