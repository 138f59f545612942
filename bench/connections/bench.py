#!/usr/bin/env python3
"""bench/connections: an authenticated request's latency while `lockbox serve` holds many idle
and half-open connections (issue 32, item 7: 10,000 of them, an answer in under a second).

    cargo build --release -p lockbox-cli
    python3 bench/connections/bench.py [--lockbox target/release/lockbox] [--held 10000] \
        [--peers 100] [--requests 200]

Starts the server on 127.0.0.1 (port chosen by the kernel) with a state directory of its own,
opens --held connections from --peers loopback addresses (127.0.1.1, 127.0.1.2, ...: every
127.x.y.z is this host, so each is a peer of its own for the per-address cap), half of them
half-open (half a request head) and half idle (one request answered, kept alive), then times
--requests authenticated `GET /v1/sandboxes` from 127.0.0.1, each on a new connection, and
prints a Markdown table: latency p50/p99/max, the server's RSS before and after, and how many
of the held connections were still open. Asserts no timings. Traffic goes to 127.0.0.1 only.
"""
import argparse, json, os, resource, socket, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from procstat import rss_kib  # noqa: E402 (bench/procstat.py)


def connect_from(source, addr):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((source, 0))
    s.connect(addr)
    return s


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lockbox", default=os.path.join(
        os.environ.get("CARGO_TARGET_DIR", "target"), "release", "lockbox"))
    p.add_argument("--held", type=int, default=10000)
    p.add_argument("--peers", type=int, default=100)
    p.add_argument("--requests", type=int, default=200)
    a = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < a.held + 256:
        sys.exit(f"needs {a.held + 256} descriptors, the hard limit is {hard}")
    state = tempfile.mkdtemp(prefix="lockbox-bench-connections-")
    server = subprocess.Popen(
        [a.lockbox, "serve", "--listen", "127.0.0.1:0", "--print-token", "--state-dir", state,
         "--pool", "0", "--max-connections", str(a.held + 1024),
         # Held connections must outlive the measurement (by default half-open ones are closed
         # after 10 s, idle kept-alive ones after 120 s).
         "--header-timeout", "300s", "--connection-idle-timeout", "300s"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = json.loads(server.stdout.readline())
        host, port = first["listen"].rsplit(":", 1)
        addr, token = (host, int(port)), first["token"]
        time.sleep(0.5)
        before = rss_kib(server.pid)
        held = []
        per_peer = -(-a.held // a.peers)
        for i in range(a.held):
            peer = i // per_peer
            source = f"127.0.{1 + peer // 250}.{1 + peer % 250}"
            s = connect_from(source, addr)
            if i % 2 == 0:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            else:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                s.recv(4096)
            held.append(s)
        request = (f"GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                   "Connection: close\r\n\r\n").encode()
        times, statuses = [], {}
        for _ in range(a.requests):
            t = time.perf_counter()
            s = socket.create_connection(addr)
            s.sendall(request)
            answer = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                answer += chunk
            s.close()
            times.append(time.perf_counter() - t)
            status = answer[9:12].decode(errors="replace")
            statuses[status] = statuses.get(status, 0) + 1
        after = rss_kib(server.pid)
        still_open = 0
        for s in held:
            s.setblocking(False)
            try:
                still_open += s.recv(1, socket.MSG_PEEK) != b""
            except BlockingIOError:
                still_open += 1
            except OSError:
                pass
        times.sort()
        pct = lambda q: times[min(len(times) - 1, int(q * len(times)))] * 1000
        print(f"| held (half-open + idle) | peers | requests | statuses | p50 (ms) | p99 (ms) | max (ms) | server RSS before → after (MiB) | held still open |")
        print("|---:|---:|---:|---|---:|---:|---:|---|---:|")
        print(f"| {a.held} | {a.peers} | {a.requests} | {statuses} | {pct(0.5):.2f} | {pct(0.99):.2f} | "
              f"{times[-1] * 1000:.2f} | {before / 1024:.1f} → {after / 1024:.1f} | {still_open} |")
    finally:
        server.terminate()
        server.wait(timeout=30)
        subprocess.run(["rm", "-rf", state])


if __name__ == "__main__":
    main()
