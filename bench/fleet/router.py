#!/usr/bin/env python3
"""bench/fleet/router.py: what the fleet's router adds to a call (issue 31, "Measure": a warm
`exec` through the router at most 0.3 ms p50 above the same call to its node; 1,000 creates
over 3 nodes with the busiest node holding at most 1.2x the least busy, and a create through
the router at most 1.5 ms above a direct one).

    cargo build --release -p lockbox-cli -p lockbox-agent
    python3 bench/fleet/router.py [--lockbox target/release/lockbox] [--nodes 3] \\
        [--calls 300] [--repeats 5] [--creates 1000] [--pool 0] [--parts exec,creates] \\
        [--baseline-router DIR] [--router-python PYTHON] [--profile-router]

Starts --nodes real `lockbox serve` on 127.0.0.1, each with a state directory of its own
(`--max-sandboxes` above what the run makes, `--pool` 0 by default: every create starts a
sandbox), and the router in a process of its own (`lockbox._router.Router` in front of them,
placements in memory, no Ray: the package is loaded by path from python/lockbox/_router, so
neither Ray nor the built extension is needed; it needs only the standard library). The
client is a small raw HTTP/1.1 client on kept-alive connections with TCP_NODELAY, one to the
router and one to each node, the same code for both paths.

1. Warm exec (part `exec`): one sandbox, made through the router; --repeats rounds of
   --calls turns, each one `POST /v1/sandboxes/ID/exec {"command": "true"}` straight to its
   node (the node's token) and one through the router (the fleet's token), the order of the
   two alternating from turn to turn, so the machine's noise hits both paths alike. After 50
   turns of warm-up. Prints p50, p90, p99, min and max of each path over every call, the
   difference of the p50s, the same per round (its spread), and the router's CPU time per
   routed call (the router's process, its probes of the nodes included: one per node a
   second). With --baseline-router DIR a second router runs another checkout's package
   (`/tmp/main/python/lockbox/_router` after `git archive COMMIT python/lockbox/_router |
   tar -x -C /tmp/main`) and takes a third call in each turn, the order rotating over the
   three: a change to the router measured under the same noise. --router-python runs the
   routers on another interpreter (a fleet's router runs on its Ray virtualenv's).
2. Creates (part `creates`): --creates creates through the router (`POST /v1/sandboxes`,
   kept), each paired with a create straight to a node (the nodes in turn; deleted at once,
   the delete not timed), the order alternating. Prints where the router's sandboxes are
   (each node's own listing), the busiest node's count over the least busy one's, and the
   create latency of both paths (p50, p90, p99) with the difference of the p50s.

At the end every sandbox is deleted on its node, the router and the nodes are stopped, and
what is left is counted (sandboxes, processes). --profile-router runs the router under
cProfile and prints its top entries (the profile's own cost slows the router: use it to see
where the time goes, not for the numbers above).

Prints Markdown tables. Asserts no timings.

(Internal: `--serve-router FILE` is the router's process: it reads the nodes as JSON on
stdin, prints its address, and runs until its stdin closes.)
"""
import argparse
import asyncio
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from procstat import TICK, descendants  # noqa: E402 (bench/procstat.py)

ROUTER_PACKAGE = os.path.join(HERE, "..", "..", "python", "lockbox", "_router")
FLEET_TOKEN = "bench-fleet-token"
EXEC_BODY = {"command": "true"}


def load_router_package(package):
    """`lockbox._router`, loaded by path under another name (its modules import one another
    relatively and need only the standard library: `lockbox/__init__.py`, which loads the
    extension, is not run)."""
    spec = importlib.util.spec_from_file_location("lockbox_router_bench", os.path.join(package, "__init__.py"),
                                                  submodule_search_locations=[package])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def serve_router(profile_to, package):
    """The router's process: nodes (JSON) on stdin, its address (JSON) on stdout, until
    stdin closes."""
    nodes = json.loads(sys.stdin.readline())
    router_mod = load_router_package(package)
    prof = None
    if profile_to:
        import cProfile
        prof = cProfile.Profile()

    async def main():
        router = router_mod.Router(lambda: nodes, FLEET_TOKEN, None)
        host, port = await router.start("127.0.0.1", 0)
        print(json.dumps({"listen": f"{host}:{port}", "pid": os.getpid()}), flush=True)
        if prof is not None:
            prof.enable()
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes it
        if prof is not None:
            prof.disable()
        await router.close()

    asyncio.run(main())
    if prof is not None:
        prof.dump_stats(profile_to)


class Conn:
    """One kept-alive HTTP/1.1 connection with TCP_NODELAY: about as little client as there
    can be, so that its own cost weighs little beside what is measured (both paths use it)."""

    def __init__(self, addr, token):
        self.addr, self.token = addr, token
        self.sock, self.buf = None, b""

    def encode(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else b""
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.addr[0]}:{self.addr[1]}\r\n"
                f"Authorization: Bearer {self.token}\r\n")
        if body is not None:
            head += "Content-Type: application/json\r\n"
        return (head + f"Content-Length: {len(data)}\r\n\r\n").encode() + data

    def send(self, raw):
        """Sends an encoded request; returns (status, body bytes)."""
        if self.sock is None:
            self.sock = socket.create_connection(self.addr, timeout=120)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.buf = b""
        self.sock.sendall(raw)
        while b"\r\n\r\n" not in self.buf:
            self._more()
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        self.buf = rest
        if "content-length" in headers:
            n = int(headers["content-length"])
            while len(self.buf) < n:
                self._more()
            body, self.buf = self.buf[:n], self.buf[n:]
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            body = self._chunked()
        else:
            body = self.buf
            while True:
                try:
                    self._more()
                except ConnectionError:
                    break
            body, self.buf = self.buf, b""
        if "close" in headers.get("connection", "").lower():
            self.close()
        return status, body

    def call(self, method, path, body=None, expect=(200,)):
        status, data = self.send(self.encode(method, path, body))
        if status not in expect:
            raise RuntimeError(f"{method} {path} on {self.addr}: {status} {data[:300]!r}")
        return json.loads(data) if data else None

    def _more(self):
        more = self.sock.recv(65536)
        if not more:
            raise ConnectionError("the server closed the connection")
        self.buf += more

    def _chunked(self):
        parts = []
        while True:
            while b"\r\n" not in self.buf:
                self._more()
            line, _, self.buf = self.buf.partition(b"\r\n")
            size = int(line.split(b";")[0], 16)
            while len(self.buf) < size + 2:
                self._more()
            parts.append(self.buf[:size])
            self.buf = self.buf[size + 2:]
            if size == 0:
                return b"".join(parts)

    def close(self):
        if self.sock is not None:
            self.sock.close()
        self.sock = None


def user_sys(pid):
    """A process's user and system CPU seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def pct(sorted_ms, q):
    return sorted_ms[min(len(sorted_ms) - 1, round(q * (len(sorted_ms) - 1)))]


def summary(ns):
    ms = sorted(x / 1e6 for x in ns)
    return {"n": len(ms), "p50": pct(ms, 0.5), "p90": pct(ms, 0.9), "p99": pct(ms, 0.99), "min": ms[0], "max": ms[-1]}


def timed(conn, raw):
    t0 = time.perf_counter_ns()
    status, data = conn.send(raw)
    return time.perf_counter_ns() - t0, status, data


def start_node(lockbox, state, index, args):
    proc = subprocess.Popen([lockbox, "serve", "--listen", "127.0.0.1:0", "--state-dir", state, "--print-token",
                             "--max-sandboxes", str(args.max_sandboxes), "--pool", str(args.pool)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = json.loads(proc.stdout.readline())
    host, port = line["listen"].rsplit(":", 1)
    # A node id as Ray's are (56 hex digits), its first characters naming the node.
    return proc, {"node_id": f"{index:02x}" + os.urandom(27).hex(), "state": "up",
                  "url": f"http://{line['listen']}", "token": line["token"], "max_sandboxes": args.max_sandboxes,
                  "addr": (host, int(port))}


def bench_exec(args, routers, nodes):
    """Part 1. ``routers``: (name, Conn, pid) of each router measured, this tree's first."""
    _, router, _ = routers[0]
    box = router.call("POST", "/v1/sandboxes", {"labels": {"bench": "exec"}}, expect=(201,))
    sid = box["id"]
    home = next(n for n in nodes if n["conn"].send(n["conn"].encode("GET", f"/v1/sandboxes/{sid}"))[0] == 200)
    target = f"/v1/sandboxes/{sid}/exec"
    paths = [("direct", home["conn"], home["conn"].encode("POST", target, EXEC_BODY))]
    paths += [(name, conn, conn.encode("POST", target, EXEC_BODY)) for name, conn, _ in routers]
    names = [name for name, _, _ in paths]

    def turn(i, into):
        """One call on every path, the order rotating from turn to turn (with two paths: alternating)."""
        k = i % len(paths)
        for name, conn, raw in paths[k:] + paths[:k]:
            ns, status, data = timed(conn, raw)
            if status != 200 or json.loads(data).get("exit_code") != 0:
                raise RuntimeError(f"exec {name}: {status} {data[:300]!r}")
            if into is not None:
                into[name].append(ns)

    for i in range(50):
        turn(i, None)
    rounds = []
    cpu0 = [user_sys(pid) for _, _, pid in routers]
    t0 = time.monotonic()
    for _ in range(args.repeats):
        got = {name: [] for name in names}
        for i in range(args.calls):
            turn(i, got)
        rounds.append(got)
    wall = time.monotonic() - t0
    cpu1 = [user_sys(pid) for _, _, pid in routers]
    routed_calls = args.calls * args.repeats
    stats = {name: summary([x for r in rounds for x in r[name]]) for name in names}
    labels = {"direct": "straight to the node", "routed": "through the router",
              "baseline": f"through the baseline router ({args.baseline_router})"}

    print(f"Warm exec of `true` on one sandbox (node {home['node_id'][:8]}): {args.repeats} rounds of "
          f"{args.calls} turns, each turn one call on each path ({', '.join(names)}), the order rotating from turn "
          "to turn (after 50 turns of warm-up)")
    print()
    print("| path | calls | p50 (ms) | p90 (ms) | p99 (ms) | min (ms) | max (ms) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    d = stats["direct"]
    for name in names:
        s = stats[name]
        print(f"| {labels[name]} | {s['n']} | {s['p50']:.3f} | {s['p90']:.3f} | {s['p99']:.3f} | {s['min']:.3f} | "
              f"{s['max']:.3f} |")
    for name in names[1:]:
        s = stats[name]
        print(f"| **{name} - direct** | | **{s['p50'] - d['p50']:.3f}** | {s['p90'] - d['p90']:.3f} | "
              f"{s['p99'] - d['p99']:.3f} | {s['min'] - d['min']:.3f} | |")
    print()
    print("| round | " + " | ".join(f"{name} p50 (ms)" for name in names) + " | "
          + " | ".join(f"{name} - direct (ms)" for name in names[1:]) + " |")
    print("|---:|" + "---:|" * (2 * len(names) - 1))
    diffs = {name: [] for name in names[1:]}
    for i, r in enumerate(rounds, 1):
        p50 = {name: summary(r[name])["p50"] for name in names}
        for name in names[1:]:
            diffs[name].append(p50[name] - p50["direct"])
        print(f"| {i} | " + " | ".join(f"{p50[name]:.3f}" for name in names) + " | "
              + " | ".join(f"{p50[name] - p50['direct']:.3f}" for name in names[1:]) + " |")
    print("| min-max (median) |" + " |" * len(names) + " "
          + " | ".join(f"{min(v):.3f}-{max(v):.3f} ({statistics.median(v):.3f})" for v in diffs.values()) + " |")
    print()
    for (name, _, _), (u0, s0), (u1, s1) in zip(routers, cpu0, cpu1, strict=True):
        user, system = u1 - u0, s1 - s0
        print(f"CPU time of the {name} router's process over those rounds: {(user + system) * 1e3:.0f} ms for "
              f"{routed_calls} calls in {wall:.1f} s, {(user + system) / routed_calls * 1e6:.0f} µs a call "
              f"({user / routed_calls * 1e6:.0f} µs user, {system / routed_calls * 1e6:.0f} µs system: sending on "
              f"the loopback runs the receiver's side of TCP too), its probes of the nodes included ({len(nodes)} "
              f"a second, about {len(nodes) * wall:.0f} in all)")
    print()
    router.call("DELETE", f"/v1/sandboxes/{sid}")


def bench_creates(args, router, nodes):
    made, routed, direct = [], [], []
    create_routed = router.encode("POST", "/v1/sandboxes", {"labels": {"bench": "routed"}})
    for i in range(args.creates):
        node = nodes[i % len(nodes)]
        for which in (("routed", "direct") if i % 2 == 0 else ("direct", "routed")):
            if which == "routed":
                ns, status, data = timed(router, create_routed)
                if status != 201:
                    raise RuntimeError(f"create {i} through the router: {status} {data[:300]!r}")
                routed.append(ns)
                made.append(json.loads(data)["id"])
            else:
                conn = node["conn"]
                ns, status, data = timed(conn, conn.encode("POST", "/v1/sandboxes", {"labels": {"bench": "direct"}}))
                if status != 201:
                    raise RuntimeError(f"create {i} on node {node['node_id'][:8]}: {status} {data[:300]!r}")
                direct.append(ns)
                conn.call("DELETE", f"/v1/sandboxes/{json.loads(data)['id']}")
    counts = {}
    for n in nodes:
        listed = n["conn"].call("GET", "/v1/sandboxes?state=running")["sandboxes"]
        counts[n["node_id"]] = sum(1 for s in listed if (s.get("labels") or {}).get("bench") == "routed")
    print(f"{args.creates} creates through the router over {len(nodes)} nodes (`--pool {args.pool}`), each paired "
          "with a create straight to a node (deleted at once), the order alternating")
    print()
    print("| node | the router's sandboxes on it |")
    print("|---|---:|")
    for node_id, c in counts.items():
        print(f"| {node_id[:8]} | {c} |")
    lo, hi = min(counts.values()), max(counts.values())
    ratio = f"{hi / lo:.3f}" if lo else "inf"
    print(f"| busiest / least busy | {ratio} ({hi} / {lo}; {sum(counts.values())} of {len(made)} listed) |")
    print()
    d, r = summary(direct), summary(routed)
    print("| create | n | p50 (ms) | p90 (ms) | p99 (ms) | min (ms) | max (ms) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, s in (("straight to a node", d), ("through the router", r)):
        print(f"| {label} | {s['n']} | {s['p50']:.3f} | {s['p90']:.3f} | {s['p99']:.3f} | {s['min']:.3f} | "
              f"{s['max']:.3f} |")
    print(f"| **routed - direct** | | **{r['p50'] - d['p50']:.3f}** | {r['p90'] - d['p90']:.3f} | "
          f"{r['p99'] - d['p99']:.3f} | | |")
    print()
    # The p50 difference over each tenth of the run: how it moves as the nodes fill.
    tenth = max(1, args.creates // 10)
    spans = [(summary(routed[k:k + tenth])["p50"] - summary(direct[k:k + tenth])["p50"])
             for k in range(0, args.creates - tenth + 1, tenth)]
    print("routed - direct p50 per tenth of the creates (ms): " + ", ".join(f"{x:.2f}" for x in spans))
    print()


def delete_everything(nodes):
    """Deletes every sandbox on every node (one thread per node); returns what is left."""
    def one(n):
        conn = Conn(n["addr"], n["token"])
        try:
            for s in conn.call("GET", "/v1/sandboxes?state=running")["sandboxes"]:
                conn.call("DELETE", f"/v1/sandboxes/{s['id']}", expect=(200, 404))
            n["left"] = len(conn.call("GET", "/v1/sandboxes?state=running")["sandboxes"])
        finally:
            conn.close()

    threads = [threading.Thread(target=one, args=(n,)) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(n.get("left", -1) for n in nodes)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("--lockbox", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release",
                                                      "lockbox"), help="the lockbox binary (a release build)")
    p.add_argument("--nodes", type=int, default=3, help="`lockbox serve` processes behind the router")
    p.add_argument("--calls", type=int, default=300, help="exec pairs (direct + routed) per round")
    p.add_argument("--repeats", type=int, default=5, help="rounds of --calls pairs")
    p.add_argument("--creates", type=int, default=1000, help="creates through the router (each paired with a direct one)")
    p.add_argument("--pool", type=int, default=0, help="each node's `lockbox serve --pool` (0: every create starts one)")
    p.add_argument("--max-sandboxes", type=int, default=0,
                   help="each node's --max-sandboxes (default: room for every create on one node)")
    p.add_argument("--parts", default="exec,creates", help="which parts to run, comma-separated: exec, creates")
    p.add_argument("--profile-router", action="store_true", help="run the router under cProfile; print its top entries")
    p.add_argument("--router-package", default=os.path.normpath(ROUTER_PACKAGE),
                   help="the router's package directory (default: this tree's python/lockbox/_router; another "
                        "checkout's to measure its router)")
    p.add_argument("--baseline-router", metavar="DIR",
                   help="also a second router running the package in DIR (another checkout's python/lockbox/_router), "
                        "measured in the same turns of the exec part: before and after a change to the router")
    p.add_argument("--router-python", default=sys.executable,
                   help="the interpreter the routers run on (default: this one; a fleet's is its Ray virtualenv's)")
    p.add_argument("--serve-router", metavar="PROFILE", nargs="?", const="", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_router is not None:
        serve_router(args.serve_router, args.router_package)
        return
    args.max_sandboxes = args.max_sandboxes or args.creates + 16
    parts = set(args.parts.split(","))
    lockbox = os.path.abspath(args.lockbox)
    router_python = subprocess.run([args.router_python, "-c", "import sys; print(sys.version.split()[0])"],
                                   capture_output=True, text=True, check=True).stdout.strip()
    print(f"python {sys.version.split()[0]} (routers: {args.router_python}, {router_python}), {os.cpu_count()} cores, {args.nodes} nodes ({lockbox}), router "
          f"{os.path.abspath(args.router_package)}"
          + (f", baseline router {os.path.abspath(args.baseline_router)}" if args.baseline_router else "")
          + f", load average {os.getloadavg()[0]:.2f} at the start")
    print()
    procs, nodes, routers = [], [], []
    profile = None
    with tempfile.TemporaryDirectory(prefix="lockbox-bench-fleet-") as tmp:
        try:
            for i in range(args.nodes):
                state = os.path.join(tmp, f"node{i}")
                proc, node = start_node(lockbox, state, i, args)
                procs.append(proc)
                nodes.append(node)
            profile = os.path.join(tmp, "router.prof") if args.profile_router else None
            listing = [{k: v for k, v in n.items() if k != "addr"} for n in nodes]
            packages = [("routed", args.router_package, profile)]
            if args.baseline_router:
                packages.append(("baseline", args.baseline_router, None))
            for name, package, prof in packages:
                proc = subprocess.Popen([args.router_python, os.path.abspath(__file__), "--serve-router", prof or "",
                                         "--router-package", os.path.abspath(package)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                procs.append(proc)
                proc.stdin.write(json.dumps(listing) + "\n")
                proc.stdin.flush()
                started = json.loads(proc.stdout.readline())
                host, port = started["listen"].rsplit(":", 1)
                routers.append((name, Conn((host, int(port)), FLEET_TOKEN), started["pid"], proc))
            for n in nodes:
                n["conn"] = Conn(n["addr"], n["token"])
            if "exec" in parts:
                bench_exec(args, [r[:3] for r in routers], nodes)
            if "creates" in parts:
                bench_creates(args, routers[0][1], nodes)
        finally:
            for n in nodes:
                if "conn" in n:
                    n["conn"].close()
            left = delete_everything(nodes) if nodes else 0
            for _, conn, _, proc in routers:  # a router stops when its stdin closes
                conn.close()
                proc.stdin.close()
                proc.wait(60)
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
            for proc in procs:
                proc.wait(60)
            stray = descendants(os.getpid())
            print(f"Cleanup: {left} sandboxes left running before the nodes stopped; {len(stray)} processes left "
                  f"after ({args.nodes} nodes and {len(routers)} router(s) stopped); load average "
                  f"{os.getloadavg()[0]:.2f} at the end")
        if profile and os.path.exists(profile):
            import pstats
            print()
            print("cProfile of the router (its whole run after start):")
            pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
