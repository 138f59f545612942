"""A fleet router without Ray (docs/fleet.md, "Kubernetes"): `python -m lockbox.fleet router
--nodes-dns NAME:PORT` finds its nodes by resolving a name, as a Kubernetes headless Service
resolves to each ready pod, and keeps its placements in PostgreSQL so routers share them.

Three real `lockbox serve` listen on 127.0.0.2, .3 and .4 at one port, as a DaemonSet's pods
would. The router runs in a user and mount namespace of its own where /etc/hosts, bind-mounted,
says what the name resolves to (the machine's own is never touched); rewriting that file is a
pod leaving or joining the Service."""

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pytest
from conftest import need

from console_util import wait_for

NAME = "lockbox-nodes.test"
NODES = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]


def free_port():
    for _ in range(50):
        with socket.socket() as s:
            s.bind((NODES[0], 0))
            port = s.getsockname()[1]
        taken = False
        for address in NODES[1:]:
            with socket.socket() as s:
                try:
                    s.bind((address, port))
                except OSError:
                    taken = True
        if not taken:
            return port
    raise AssertionError("no port free on every node address")


def write_hosts(path, addresses):
    # In place (same inode): the router's namespace has this file bind-mounted on /etc/hosts.
    with open(path, "w") as f:
        f.write("127.0.0.1 localhost\n::1 localhost\n")
        f.writelines(f"{a} {NAME}\n" for a in addresses)


def start_node(address, port, state, token_file):
    proc = subprocess.Popen([sys.executable, "-m", "lockbox._cli", "serve", "--listen", f"{address}:{port}",
                             "--state-dir", str(state), "--token-file", str(token_file), "--ports-listen", "off",
                             "--pool", "0"], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line, f"lockbox serve on {address}:{port} did not start"
    return proc


def stop(proc):
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Router:
    """`python -m lockbox.fleet router --nodes-dns` in its own user and mount namespace."""

    def __init__(self, hosts, port, token_file, *extra):
        need(shutil.which("unshare") is not None, "unshare (util-linux)")
        script = 'mount --bind "$0" /etc/hosts && exec "$@"'
        self.proc = subprocess.Popen(
            ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, str(hosts),
             sys.executable, "-m", "lockbox.fleet", "router", "--listen", "127.0.0.1:0", "--ports-listen", "off",
             "--nodes-dns", f"{NAME}:{port}", "--token-file", str(token_file), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"the router did not start: {self.proc.stderr.read()}")
        self.url = "http://" + json.loads(line)["listen"]

    def stop(self):
        stop(self.proc)


@pytest.fixture
def fleet(tmp_path):
    """Three nodes, one token; (hosts file, port, token, token file)."""
    token = "dns-fleet-" + os.urandom(16).hex()
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    port = free_port()
    hosts = tmp_path / "hosts"
    write_hosts(hosts, NODES)
    procs = {a: start_node(a, port, tmp_path / f"state-{a}", token_file) for a in NODES}
    try:
        yield {"hosts": hosts, "port": port, "token": token, "token_file": token_file, "procs": procs,
               "tmp": tmp_path}
    finally:
        for proc in procs.values():
            stop(proc)


def call(url, token, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def node_of(url, token, sid):
    return {s["id"]: s for s in call(url, token, "GET", "/v1/sandboxes")[1]["sandboxes"]}.get(sid)


def test_a_router_finds_its_nodes_by_dns_spreads_creates_and_follows_nodes_that_leave_and_return(fleet):
    f = fleet
    router = Router(f["hosts"], f["port"], f["token_file"])
    try:
        status, health = call(router.url, f["token"], "GET", "/healthz")
        assert status == 200 and sorted(health["nodes"]) == sorted(f"{a}:{f['port']}" for a in NODES), health
        assert set(health["nodes"].values()) == {"up"}
        boxes = []
        for _ in range(6):
            status, box = call(router.url, f["token"], "POST", "/v1/sandboxes", {})
            assert status == 201, box
            boxes.append(box["id"])
        for i, sid in enumerate(boxes):
            status, out = call(router.url, f["token"], "POST", f"/v1/sandboxes/{sid}/exec", {"command": f"echo {i}"})
            assert (status, out["stdout"]) == (200, f"{i}\n"), out
        placed = {sid: node_of(router.url, f["token"], sid)["node"] for sid in boxes}
        per_node = {a: sum(1 for n in placed.values() if n == f"{a}:{f['port']}") for a in NODES}
        assert sorted(per_node.values()) == [2, 2, 2], per_node  # the least loaded of three, each time

        # A pod that is no longer ready leaves the Service's answer: its sandboxes are lost.
        gone = NODES[2]
        away = [sid for sid, n in placed.items() if n.startswith(gone + ":")]
        write_hosts(f["hosts"], NODES[:2])
        lost = wait_for(lambda: all(node_of(router.url, f["token"], sid)["state"] == "lost" for sid in away),
                        20, "the node that left DNS to be listed lost")
        assert lost
        status, err = call(router.url, f["token"], "POST", f"/v1/sandboxes/{away[0]}/exec", {"command": "true"})
        assert status in (410, 503) and err["code"] in ("SANDBOX_LOST", "NODE_UNREACHABLE"), err
        for _ in range(2):  # creates go to the nodes that are left
            status, box = call(router.url, f["token"], "POST", "/v1/sandboxes", {})
            assert status == 201 and not node_of(router.url, f["token"], box["id"])["node"].startswith(gone + ":")
        # Back in the answer (ready again), still holding its sandboxes: they run again.
        write_hosts(f["hosts"], NODES)
        wait_for(lambda: call(router.url, f["token"], "POST", f"/v1/sandboxes/{away[0]}/exec",
                              {"command": "echo back"})[1].get("stdout") == "back\n",
                 20, "the node back in DNS to route its sandboxes again")
        assert node_of(router.url, f["token"], away[1])["state"] == "running"
        # Every node's token is refused at the router: clients send the router's.
        status, err = call(router.url, "not-the-token", "GET", "/v1/sandboxes")
        assert status == 401, err
    finally:
        router.stop()


class Cuttable:
    """A TCP forwarder to PostgreSQL that the test can cut (connections reset, new ones
    refused) and mend: the store going away under a running router."""

    def __init__(self, target):
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open = True
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.open:
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self):
        self.open = False
        for s in self.conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.conns.clear()

    def mend(self):
        self.open = True


def postgres_url():
    url = os.environ.get("LOCKBOX_TEST_POSTGRES_URL")
    need(bool(url), "LOCKBOX_TEST_POSTGRES_URL (a PostgreSQL: scripts/start-postgres.sh)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        need(False, "psycopg (pip install 'psycopg[binary]')")
    return url


def test_routers_without_ray_share_their_placements_in_postgresql_and_a_store_outage_is_a_503(fleet):
    import urllib.parse

    import psycopg

    url = postgres_url()
    namespace = "dns-" + os.urandom(4).hex()
    f = fleet
    first = Router(f["hosts"], f["port"], f["token_file"], "--store", url, "--namespace", namespace)
    try:
        status, box = call(first.url, f["token"], "POST", "/v1/sandboxes", {})
        assert status == 201, box
        node = node_of(first.url, f["token"], box["id"])["node"]
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT value FROM lockbox_fleet_placements WHERE namespace = %s AND key = %s",
                               (namespace, f"p/{box['id']}")).fetchone()
        assert row is not None and row[0]["node"] == node, row

        # The node's server dies and a new one starts at the same address (a pod's container
        # restarted): the first router finds it by its /healthz instance, and buries the
        # sandbox it came back without in the store...
        address = node.rsplit(":", 1)[0]
        f["procs"][address].kill()
        f["procs"][address].wait()
        f["procs"][address] = start_node(address, f["port"], f["tmp"] / f"state-{address}", f["token_file"])
        answers = []

        def answered_lost():
            answers.append(call(first.url, f["token"], "POST", f"/v1/sandboxes/{box['id']}/exec", {"command": "true"}))
            return answers[-1][0] == 410

        try:
            wait_for(answered_lost, 20, "the sandbox to be answered lost")
        except AssertionError:
            raise AssertionError(answers[-3:]) from None
    finally:
        first.stop()
    # ...and a second router, started after the first stopped, answers it from the store.
    second = Router(f["hosts"], f["port"], f["token_file"], "--store", url, "--namespace", namespace)
    try:
        status, err = call(second.url, f["token"], "POST", f"/v1/sandboxes/{box['id']}/exec", {"command": "true"})
        assert (status, err["code"]) == (410, "SANDBOX_LOST") and err["details"]["node"] == node, err
        assert node_of(second.url, f["token"], box["id"])["state"] == "lost"
    finally:
        second.stop()

    # The store goes away under a running router: a create is refused (503) and reaches no
    # node; once the store is back, creates work again.
    parsed = urllib.parse.urlsplit(url)
    proxy = Cuttable((parsed.hostname, parsed.port or 5432))
    through = parsed._replace(netloc=f"{parsed.username}@127.0.0.1:{proxy.port}").geturl()
    router = Router(f["hosts"], f["port"], f["token_file"], "--store", through, "--namespace", namespace)
    try:
        before = sum(len(call(f"http://{a}:{f['port']}", f["token"], "GET", "/v1/sandboxes")[1]["sandboxes"])
                     for a in NODES)
        proxy.cut()
        status, err = call(router.url, f["token"], "POST", "/v1/sandboxes", {})
        assert (status, err["code"]) == (503, "STORE_UNAVAILABLE"), err
        assert "PostgreSQL" in err["message"], err
        after = sum(len(call(f"http://{a}:{f['port']}", f["token"], "GET", "/v1/sandboxes")[1]["sandboxes"])
                    for a in NODES)
        assert after == before
        proxy.mend()
        status, box = call(router.url, f["token"], "POST", "/v1/sandboxes", {})
        assert status == 201, box
    finally:
        router.stop()
        proxy.cut()


def test_the_dns_router_refuses_bad_options_with_a_clear_message(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("short\n")

    def run(*args):
        return subprocess.run([sys.executable, "-m", "lockbox.fleet", "router", *args], capture_output=True,
                              text=True, timeout=60)

    out = run("--nodes-dns", f"{NAME}:7070")
    assert out.returncode == 2 and "--nodes-dns needs --token-file" in out.stderr, out.stderr
    out = run("--nodes-dns", NAME, "--token-file", str(token_file))
    assert out.returncode == 2 and "--nodes-dns: NAME:PORT" in out.stderr, out.stderr
    out = run("--nodes-dns", f"{NAME}:7070", "--token-file", str(token_file))
    assert out.returncode == 2 and "at least 16 characters" in out.stderr, out.stderr
    out = run("--nodes-dns", f"{NAME}:7070", "--token-file", str(tmp_path / "missing"))
    assert out.returncode == 2 and "No such file" in out.stderr, out.stderr
    token_file.write_text("a-token-long-enough-0123456789\n")
    out = run("--nodes-dns", f"{NAME}:7070", "--token-file", str(token_file), "--store", "mysql://x/y")
    assert out.returncode == 2 and "--store: a postgres:// URL" in out.stderr, out.stderr
    out = run("--nodes-dns", f"{NAME}:7070", "--token-file", str(token_file), "--node-capacity", "0")
    assert out.returncode == 2 and "--node-capacity" in out.stderr, out.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens once this closes
    out = run("--nodes-dns", f"{NAME}:7070", "--token-file", str(token_file), "--store",
              f"postgres://lockbox:secret-pw@127.0.0.1:{closed}/db")
    assert out.returncode == 1 and "cannot" not in out.stdout, out
    assert "--store: PostgreSQL at postgres://lockbox:***@127.0.0.1" in out.stderr, out.stderr
    assert "secret-pw" not in out.stderr
    out = run("--nodes-dns", f"{NAME}:7070", "--ray", "auto", "--help")
    assert out.returncode == 0 and "--nodes-dns NAME:PORT" in out.stdout
