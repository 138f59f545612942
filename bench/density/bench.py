#!/usr/bin/env python3
"""bench/density: how one `lockbox serve` fares as it holds more and more live sandboxes
(issue 34, item 2: memory, create rate and a warm exec as N grows).

    cargo build --release -p lockbox-cli
    python3 bench/density/bench.py [--lockbox target/release/lockbox] [--at 250,1000,2000] \
        [--clients 8] [--execs 200] [--perf-record FILE]

Starts the server on 127.0.0.1 with a state directory of its own (`--pool 0`: every sandbox
is a create). --clients threads create sandboxes, each with one `exec` of `true` (so each
holds its default shell), up to each count of --at. At each count it pauses and records: the
create rate of the step, the server's CPU time per create in that step, the host's memory in
use above the start (MemTotal - MemAvailable) and per sandbox, the kernel's page tables
(PageTables in /proc/meminfo), the server's RSS, processes per sandbox, p50/p99 of --execs
warm execs (`true`) on random live sandboxes from --clients threads, the descriptors the server
has open, the largest descriptor table (`FDSize`) of any sandbox process against the server's
own, and the CPU time the host's other processes (outside the server's tree and the
benchmark's) spent during the step's creates, in all and the busiest of them, per create. Then it deletes every sandbox and checks that no process of the server's, no host mount, no
sandbox directory and no descriptor of the server's above its start is left (besides the
root template's two namespaces, held for the server's life; `LOCKBOX_ROOT_TEMPLATES=0` in the
environment runs the server without templates). Prints a Markdown table,
then the host's CPUs, load at the start and whether it runs DAMON. Asserts no timings. --perf-record FILE records the whole
machine with `perf record -a -g` while the last step's sandboxes are created (`--at
1800,2000 --perf-record out.data`: 200 creates with 1,800 live; `perf report -i out.data
--children --sort sym` then says where their kernel time went). Needs the descriptors and process
ids the counts take (1 descriptor per sandbox in the server besides 2,560 for the sessions' pipes
it keeps; 3 processes per sandbox: raise `ulimit -Hn` and `kernel.pid_max` as root if short).
"""
import argparse, http.client, json, os, random, resource, signal, subprocess, sys, tempfile, threading, time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from procstat import TICK, cpu_s, descendants, fd_slots, meminfo, name_and_ticks, rss_kib  # noqa: E402 (bench/procstat.py)


def used_kib():
    m = meminfo()
    return m["MemTotal"] - m["MemAvailable"], m["PageTables"]


class Api:
    """One keep-alive connection per thread."""

    def __init__(self, addr, token):
        self.addr, self.token, self.local = addr, token, threading.local()

    def call(self, method, path, body=None):
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPConnection(*self.addr, timeout=120)
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.token}"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, path, data, headers)
            r = conn.getresponse()
            raw = r.read()
        except (OSError, http.client.HTTPException):
            self.local.conn = None
            raise
        if r.status >= 300:
            raise RuntimeError(f"{method} {path}: {r.status} {raw[:300]!r}")
        return json.loads(raw) if raw else None


def others(server_pid):
    """pid -> (name, CPU ticks) of every process outside the server's tree and this
    benchmark's (its client threads, perf): the host's own, such as its DAMON thread or a
    VM agent that walks every process (docs/benchmarks.md)."""
    mine = set(descendants(server_pid)) | set(descendants(os.getpid())) | {server_pid, os.getpid()}
    out = {}
    for p in os.listdir("/proc"):
        if p.isdigit() and int(p) not in mine:
            try:
                out[int(p)] = name_and_ticks(p)
            except OSError:
                pass
    return out


def others_spent(before):
    """(total ms, (name, ms) of the busiest) the processes of `before` spent since."""
    spent = []
    for pid, (name, ticks) in before.items():
        try:
            now_name, now = name_and_ticks(pid)
        except OSError:
            continue
        if now_name == name:
            spent.append(((now - ticks) * 1000 / TICK, name))
    total = sum(ms for ms, _ in spent)
    top = max(spent, default=(0, "-"))
    return total, (top[1], top[0])


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def fd_kinds(pid):
    """What the open descriptors of `pid` are, counted by kind (`socket`, `pipe`, a path)."""
    kinds = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        kind = target.split(":[")[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def in_threads(n, work):
    errors = []

    def run(i):
        try:
            work(i)
        except Exception as e:  # reported after the join
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lockbox", default=os.path.join(
        os.environ.get("CARGO_TARGET_DIR", "target"), "release", "lockbox"))
    p.add_argument("--at", default="250,1000,2000")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--execs", type=int, default=200)
    p.add_argument("--perf-record", metavar="FILE",
                   help="record `perf record -a -g -F 999` of the whole machine into FILE "
                        "during the last step's creates (where their kernel time goes)")
    a = p.parse_args()
    counts = [int(x) for x in a.at.split(",")]
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with open("/proc/loadavg") as f:
        load_start = " ".join(f.read().split()[:3])
    state = tempfile.mkdtemp(prefix="lockbox-bench-density-")
    with open("/proc/self/mountinfo") as f:
        mounts_before = len(f.readlines())
    base_used, base_pt = used_kib()
    server = subprocess.Popen(
        [a.lockbox, "serve", "--listen", "127.0.0.1:0", "--print-token", "--state-dir", state,
         "--pool", "0", "--max-sandboxes", str(max(counts) + 16),
         # Descriptors go to sandboxes, not to connections the benchmark does not open.
         "--max-connections", "256"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rows, ids, lock = [], [], threading.Lock()
    try:
        first = json.loads(server.stdout.readline())
        host, port = first["listen"].rsplit(":", 1)
        api = Api((host, int(port)), first["token"])
        fds_before, kinds_before = open_fds(server.pid), fd_kinds(server.pid)
        for target in counts:
            perf = None
            if a.perf_record and target == counts[-1]:
                # --synth=no: reading the maps of every process already running (30,000 at
                # 10,000 sandboxes) took perf most of the step; the creates' own processes
                # are new, so their symbols are recorded anyway (the server's are not).
                perf = subprocess.Popen(["perf", "record", "-a", "-g", "-F", "999", "--synth=no",
                                         "-o", a.perf_record],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1)  # perf is recording before the first create
            host0 = others(server.pid)
            t0, c0 = time.perf_counter(), cpu_s(server.pid)
            made0 = len(ids)

            def create(_):
                while True:
                    with lock:
                        if len(ids) >= target:
                            return
                        ids.append(None)
                        slot = len(ids) - 1
                    sid = api.call("POST", "/v1/sandboxes", {})["id"]
                    api.call("POST", f"/v1/sandboxes/{sid}/exec", {"command": "true"})
                    ids[slot] = sid

            in_threads(a.clients, create)
            made = len(ids) - made0
            rate = made / (time.perf_counter() - t0)
            cpu_per = (cpu_s(server.pid) - c0) / max(made, 1) * 1000
            host_ms, (busiest, busiest_ms) = others_spent(host0)
            if perf is not None:
                perf.send_signal(signal.SIGINT)
                perf.wait()
            time.sleep(2)  # let what the creates freed settle
            used, pt = used_kib()
            procs = descendants(server.pid)
            # What grew with N before: a sandbox process's table copied from the server's.
            slots = max((fd_slots(p) for p in procs), default=0)
            procs = len(procs)
            times, tlock = [], threading.Lock()
            per = a.execs // a.clients

            def execs(i):
                rng = random.Random(i)
                for _ in range(per):
                    sid = rng.choice(ids)
                    t = time.perf_counter()
                    api.call("POST", f"/v1/sandboxes/{sid}/exec", {"command": "true"})
                    with tlock:
                        times.append(time.perf_counter() - t)

            in_threads(a.clients, execs)
            times.sort()
            pct = lambda q: times[min(len(times) - 1, int(q * len(times)))] * 1000
            rows.append((target, rate, cpu_per, (used - base_used) / 1024, (used - base_used) / target / 1024,
                         (pt - base_pt) / 1024, rss_kib(server.pid) / 1024, procs / target, pct(0.5), pct(0.99),
                         slots, fd_slots(server.pid), open_fds(server.pid),
                         host_ms / max(made, 1), f"{busiest} {busiest_ms / max(made, 1):.1f}"))
            print(f"at {target}: {rows[-1]}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        todo = list(ids)

        def delete(_):
            while True:
                with lock:
                    if not todo:
                        return
                    sid = todo.pop()
                api.call("DELETE", f"/v1/sandboxes/{sid}")

        in_threads(a.clients, delete)
        deleted_s = time.perf_counter() - t0
        time.sleep(2)
        left = len(descendants(server.pid))
        with open("/proc/self/mountinfo") as f:
            mounts_left = len(f.readlines()) - mounts_before
        dirs = os.path.join(state, "sandboxes")
        dirs_left = len(os.listdir(dirs)) if os.path.isdir(dirs) else 0
        fds_left = open_fds(server.pid) - fds_before
        kinds_after = fd_kinds(server.pid)
        grown = {k: n - kinds_before.get(k, 0) for k, n in kinds_after.items() if n != kinds_before.get(k, 0)}
        # The root template's user and mount namespaces (lockbox-confine's `template`): one
        # of each per policy in use, held for the server's life, not per sandbox.
        templates = min(grown.pop("user", 0), grown.pop("mnt", 0))
        fds_left -= 2 * templates
    finally:
        server.terminate()
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
        subprocess.run(["rm", "-rf", state])
    print(f"| live sandboxes | create rate (/s) | server CPU per create (ms) | host memory above start (MiB) "
          f"| per sandbox (MiB) | page tables above start (MiB) | server RSS (MiB) | processes per sandbox "
          f"| warm exec p50 (ms) | p99 (ms) | largest table in a sandbox (slots) | server's table (slots) "
          f"| server's open descriptors | other processes' CPU per create (ms) | the busiest of them (ms per create) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]:.0f} | {r[2]:.1f} | {r[3]:.0f} | {r[4]:.2f} | {r[5]:.0f} | {r[6]:.0f} | "
              f"{r[7]:.1f} | {r[8]:.1f} | {r[9]:.1f} | {r[10]} | {r[11]} | {r[12]} | {r[13]:.1f} | {r[14]} |")
    print(f"\nDeleted {len(ids)} in {deleted_s:.1f} s; left after: {left} processes, "
          f"{mounts_left} host mounts, {dirs_left} sandbox directories, {fds_left} server "
          f"descriptors above its start ({fds_before}){': ' + str(grown) if grown else ''}, "
          f"besides {templates} root template(s)' user and mount namespaces.")
    print(f"Host: {os.cpu_count()} CPUs, load average {load_start} at the start; {damon()}.")


def damon():
    """Whether the host runs DAMON, whose reverse-map walks grow with the processes that map
    the same files (docs/benchmarks.md: 40% of the CPU at 10,000 sandboxes on one VM)."""
    try:
        with open("/sys/kernel/mm/damon/admin/kdamonds/nr_kdamonds") as f:
            n = int(f.read())
        on = 0
        for i in range(n):
            with open(f"/sys/kernel/mm/damon/admin/kdamonds/{i}/state") as f:
                on += f.read().strip() == "on"
        return f"DAMON: {on} of {n} kdamonds on"
    except (OSError, ValueError):
        return "DAMON: no sysfs interface"


if __name__ == "__main__":
    main()
