"""The fleet's router as an HTTP proxy, without Ray (docs/fleet.md): in front of one real
`lockbox serve`, what the Ray tests' clients do not exercise — keep-alive connections,
chunked uploads, `Expect: 100-continue`, malformed and oversized heads, a node that cannot be
reached — and the placement function over many simulated nodes."""

import asyncio
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest
from conftest import need

from lockbox._router import NodeView, Router, place

try:
    import e2b
except ImportError:
    e2b = None


def serve(state, *flags):
    """A `lockbox serve` (the extension's CLI), as a fleet node would run it: (process, node)."""
    proc = subprocess.Popen([sys.executable, "-m", "lockbox._cli", "serve", "--listen", "127.0.0.1:0",
                             "--state-dir", str(state), "--print-token", *flags], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    line = json.loads(proc.stdout.readline())
    return proc, {"node_id": "n" * 56, "state": "up", "url": f"http://{line['listen']}", "token": line["token"]}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    proc, info = serve(tmp_path_factory.mktemp("node"))
    try:
        yield info
    finally:
        proc.terminate()
        proc.wait(30)


ROUTERS = []


def start_router(nodes, token="fleet-token", **options):
    """A Router (``options``: its keyword arguments) on a free port in a thread of its own
    (stopped at the end of the module); returns (host, port)."""
    ready = threading.Event()
    where = {}

    async def main():
        router = Router(lambda: nodes, token, None, **options)
        where["addr"] = await router.start("127.0.0.1", 0)
        where["loop"], where["stop"] = asyncio.get_running_loop(), asyncio.Event()
        ready.set()
        await where["stop"].wait()
        await router.close()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(30)
    ROUTERS.append((where, thread))
    return where["addr"]


@pytest.fixture(scope="module", autouse=True)
def stop_routers():
    yield
    for where, thread in ROUTERS:
        where["loop"].call_soon_threadsafe(where["stop"].set)
        thread.join(30)
    ROUTERS.clear()


@pytest.fixture(scope="module")
def router(node):
    return start_router([node])


AUTH = {"Authorization": "Bearer fleet-token"}


def test_one_keep_alive_connection_carries_many_calls(router):
    conn = http.client.HTTPConnection(*router, timeout=60)
    conn.request("POST", "/v1/sandboxes", body=b"{}", headers={**AUTH, "Content-Type": "application/json"})
    resp = conn.getresponse()
    box = json.loads(resp.read())
    assert resp.status == 201, box
    try:
        for i in range(5):
            conn.request("POST", f"/v1/sandboxes/{box['id']}/exec", body=json.dumps({"command": f"echo {i}"}),
                         headers={**AUTH, "Content-Type": "application/json"})
            resp = conn.getresponse()
            assert (resp.status, json.loads(resp.read())["stdout"]) == (200, f"{i}\n")
        # A chunked upload streams through, and the file reads back whole.
        data = bytes(range(256)) * 4096
        conn.request("PUT", f"/v1/sandboxes/{box['id']}/files?path=/tmp/big.bin",
                     body=iter([data[: len(data) // 2], data[len(data) // 2:]]), headers=AUTH, encode_chunked=True)
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        resp.read()
        conn.request("GET", f"/v1/sandboxes/{box['id']}/files?path=/tmp/big.bin", headers=AUTH)
        resp = conn.getresponse()
        assert (resp.status, resp.read()) == (200, data)
        # An unknown sandbox: the node's own answer comes back, in lockbox's shape.
        conn.request("GET", "/v1/sandboxes/sb-none", headers=AUTH)
        resp = conn.getresponse()
        assert (resp.status, json.loads(resp.read())["code"]) == (404, "SANDBOX_NOT_FOUND")
    finally:
        conn.request("DELETE", f"/v1/sandboxes/{box['id']}", headers=AUTH)
        conn.getresponse().read()
        conn.close()


def raw(addr, data, *, read_until=b"\r\n\r\n"):
    with socket.create_connection(addr, timeout=30) as s:
        s.sendall(data)
        got = b""
        while read_until not in got:
            more = s.recv(65536)
            if not more:
                break
            got += more
        return got


def test_expect_100_continue_is_answered_before_the_body_is_sent(router):
    body = b'{"labels": {"via": "expect"}}'
    head = (b"Host: x\r\nAuthorization: Bearer fleet-token\r\nContent-Type: application/json\r\n"
            b"Expect: 100-continue\r\n" + f"Content-Length: {len(body)}\r\n\r\n".encode())
    with socket.create_connection(router, timeout=30) as s:
        s.sendall(b"POST /v1/sandboxes HTTP/1.1\r\n" + head)
        assert s.recv(65536).startswith(b"HTTP/1.1 100 Continue")
        s.sendall(body)
        got = b""
        while b'"via"' not in got:
            got += s.recv(65536)
        assert got.startswith(b"HTTP/1.1 201"), got
        sid = json.loads(got.split(b"\r\n\r\n", 1)[1])["id"]
        s.sendall(f"DELETE /v1/sandboxes/{sid} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer fleet-token\r\n"
                  f"Connection: close\r\n\r\n".encode())
        while s.recv(65536):
            pass
    # Refused before the body is asked for: the client is not left waiting.
    with socket.create_connection(router, timeout=30) as s:
        s.sendall(b"POST /v1/sandboxes/sb-none/exec HTTP/1.1\r\n" + head)
        assert s.recv(65536).startswith(b"HTTP/1.1 404")


def test_bad_requests_get_clear_answers(router):
    assert raw(router, b"NONSENSE\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert raw(router, b"GET / HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n").startswith(b"HTTP/1.1 431")
    # Framing that two servers could read two ways (request smuggling) is refused.
    assert raw(router, b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
                       b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert raw(router, b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
                       b"Content-Length: 4\r\n\r\nabcd").startswith(b"HTTP/1.1 400")
    reply = raw(router, b"GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n\r\n",
                read_until=b"}")
    assert reply.startswith(b"HTTP/1.1 401") and b'"UNAUTHORIZED"' in reply
    reply = raw(router, b"GET /v2/sandboxes HTTP/1.1\r\nHost: x\r\n\r\n", read_until=b"}")
    assert reply.startswith(b"HTTP/1.1 401") and b'"code": 401' in reply  # E2B's shape


def test_a_node_that_cannot_be_reached_is_answered_at_once():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    addr = start_router([{"node_id": "d" * 56, "state": "up", "url": f"http://127.0.0.1:{dead}", "token": "t"}])
    conn = http.client.HTTPConnection(*addr, timeout=30)
    conn.request("POST", "/v1/sandboxes", body=b"{}", headers={**AUTH, "Content-Type": "application/json"})
    resp = conn.getresponse()
    reply = json.loads(resp.read())
    assert resp.status == 503 and reply["code"] == "NO_NODE", reply


def test_a_kept_alive_connection_the_node_closed_is_replaced(tmp_path):
    import time

    # The node closes idle connections after 1 s; the router keeps them for up to 4 s.
    proc, info = serve(tmp_path, "--connection-idle-timeout", "1s")
    try:
        addr = start_router([info])
        conn = http.client.HTTPConnection(*addr, timeout=60)
        conn.request("POST", "/v1/sandboxes", body=b"{}", headers={**AUTH, "Content-Type": "application/json"})
        sid = json.loads(conn.getresponse().read())["id"]
        for i in range(3):
            time.sleep(1.5)  # not a measurement: long enough for the node to close its side
            conn.request("POST", f"/v1/sandboxes/{sid}/exec", body=json.dumps({"command": f"echo {i}"}),
                         headers={**AUTH, "Content-Type": "application/json"})
            resp = conn.getresponse()
            assert (resp.status, json.loads(resp.read())["stdout"]) == (200, f"{i}\n")
    finally:
        proc.terminate()
        proc.wait(30)


def call(node, method, path, body=None):
    """One request straight to a node with its own token: (status, headers, body bytes)."""
    host, port = node["url"][len("http://"):].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request(method, path, body=json.dumps(body).encode() if body is not None else None,
                     headers={"Authorization": f"Bearer {node['token']}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def holder_of(snapshot, artifact, digest, mode):
    """A node that says it holds `snapshot` and sends `artifact` for it: tampered, or cut
    in the middle of its body (the connection closed without the body's end). (url, stop)."""
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def reply(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path.startswith("/v1/sandboxes"):
                self.reply(200, {"sandboxes": []})
            elif self.path == f"/v1/snapshots/{snapshot}":
                self.reply(200, {"id": snapshot, "parent": None})
            elif self.path == f"/v1/snapshots/{snapshot}/artifact":
                self.send_response(200)
                self.send_header("Docker-Content-Digest", digest)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                body = artifact[: len(artifact) // 2] if mode == "cut" else artifact
                self.wfile.write(b"%x\r\n%s\r\n" % (len(body), body))
                if mode == "cut":
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(b"0\r\n\r\n")
            else:
                self.reply(404, {"code": "NOT_FOUND", "message": self.path, "details": {}})

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server.shutdown


def test_a_tampered_or_cut_snapshot_copy_is_refused_and_leaves_nothing_on_the_target(tmp_path):
    """A snapshot copied between nodes through the router (docs/fleet.md, "Snapshots on other
    nodes") is checked by the node it goes to: from a node that sends it tampered, the fork
    is 422 BAD_ARTIFACT naming both nodes; cut in the middle, 503 naming the node that cut
    it; either way the target keeps nothing and lists no snapshot. From an honest node, the
    fork runs on the target over the snapshot's files."""
    work = tmp_path / "work"
    work.mkdir()
    a_proc, a = serve(tmp_path / "a")
    b_proc, b = serve(tmp_path / "b")
    b["node_id"] = "b" * 56
    try:
        status, _, raw_box = call(a, "POST", "/v1/sandboxes", {"workdir": str(work), "on_exit": "abort"})
        assert status == 201, raw_box
        box = json.loads(raw_box)["id"]
        assert call(a, "POST", f"/v1/sandboxes/{box}/exec", {"command": "echo secret-content > f.txt"})[0] == 200
        status, _, raw_snap = call(a, "POST", f"/v1/sandboxes/{box}/snapshots", {})
        snap = json.loads(raw_snap)["id"]
        status, headers, artifact = call(a, "GET", f"/v1/snapshots/{snap}/artifact")
        assert status == 200
        digest = headers["docker-content-digest"]
        at = artifact.index(b"secret-content")
        tampered = artifact[:at] + b"S" + artifact[at + 1:]

        for mode, body, expected in [("tampered", tampered, (422, "BAD_ARTIFACT")),
                                     ("cut", artifact, (503, "NODE_UNREACHABLE"))]:
            url, stop = holder_of(snap, body, digest, mode)
            holder = {"node_id": "e" * 56, "state": "up", "url": url, "token": "t"}
            addr = start_router([holder, b])
            try:
                conn = http.client.HTTPConnection(*addr, timeout=60)
                conn.request("POST", f"/v1/snapshots/{snap}/fork",
                             body=json.dumps({"placement": {"node": "b"}}),
                             headers={**AUTH, "Content-Type": "application/json"})
                resp = conn.getresponse()
                got = json.loads(resp.read())
                assert (resp.status, got["code"]) == expected, (mode, got)
                if mode == "tampered":
                    assert got["details"]["reason"] == "digest_mismatch", got
                    assert (got["details"]["from"], got["details"]["to"]) == ("e" * 56, "b" * 56), got
                    assert "digest mismatch" in got["message"], got
                else:
                    assert got["details"]["node"] == "e" * 56, got
            finally:
                stop()
            # Nothing half-made on the target (its import ends when its body does).
            for _ in range(100):
                if not list((tmp_path / "b" / "snapshots" / ".new").iterdir()):
                    break
                threading.Event().wait(0.1)
            assert not list((tmp_path / "b" / "snapshots" / ".new").iterdir()), mode
            assert json.loads(call(b, "GET", "/v1/snapshots")[2])["snapshots"] == [], mode

        # From the node that has it, the fork runs on the target over the snapshot's files.
        a["node_id"] = "a" * 56
        addr = start_router([a, b])
        conn = http.client.HTTPConnection(*addr, timeout=60)
        conn.request("POST", f"/v1/snapshots/{snap}/fork", body=json.dumps({"placement": {"node": "b"}}),
                     headers={**AUTH, "Content-Type": "application/json"})
        resp = conn.getresponse()
        forks = json.loads(resp.read())
        assert (resp.status, resp.getheader("Lockbox-Snapshot-Copy")) == (201, "copied"), forks
        fork = forks["sandboxes"][0]["id"]
        status, _, ran = call(b, "POST", f"/v1/sandboxes/{fork}/exec", {"command": f"cat {work}/f.txt"})
        assert (status, json.loads(ran)["stdout"]) == (200, "secret-content\n")
    finally:
        for proc in (a_proc, b_proc):
            proc.terminate()
            proc.wait(30)


def test_power_of_k_choices_balances_and_prefers_a_node_holding_the_image():
    rng = random.Random(7)
    nodes = [NodeView(f"node-{i}", state="up", capacity=200) for i in range(1000)]
    for _ in range(100_000):
        n = place(nodes, rng=rng)
        n.load += 1
    loads = [n.load for n in nodes]
    assert max(loads) <= 1.2 * min(loads), (max(loads), min(loads))
    # A node with the image wins over equally loaded ones without it.
    small = [NodeView(f"s{i}", state="up", capacity=10) for i in range(3)]
    small[2].images.add("busybox:1.36")
    assert all(place(small, image="busybox:1.36", rng=rng) is small[2] for _ in range(20))
    # A node holding the image is looked at even when the K random nodes miss it, and wins
    # over the emptier ones without it.
    holder = nodes[500]
    holder.images.add("python:3.12")
    others = [n.load for n in nodes if n is not holder]
    holder.load = min(others)
    assert all(place(nodes, image="python:3.12", rng=rng, holders=[holder]) is holder for _ in range(50))
    # ... but not once it is much fuller; and a full fleet has no choice.
    small[2].load = 5
    assert place(small, image="busybox:1.36", rng=rng) is not small[2]
    for n in small:
        n.load = 10
    assert place(small, rng=rng) is None
    # A node that cannot take calls (its server unreachable, being checked, lost) is never
    # chosen, even when the sample drew it and it is the emptiest.
    for n in small:
        n.load = 0
    small[0].unreachable = "connection refused"
    small[1].was_down = "its server restarted"
    assert all(place(small, rng=rng) is small[2] for _ in range(20))
    small[2].state = "lost"
    assert place(small, rng=rng) is None


def test_placement_samples_distinct_nodes_uniformly():
    """`place` samples K distinct nodes (all of them when there are no more), each as likely
    as any other: drawn one by one rather than by random.sample, which costs more."""
    from lockbox._router.placement import _indices

    rng = random.Random(3)
    for n in range(0, 12):
        for k in range(1, 5):
            got = _indices(rng, n, k)
            assert len(got) == min(n, k) and len(set(got)) == len(got) and all(0 <= i < n for i in got), (n, k, got)
    counts = [0] * 10
    for _ in range(30_000):
        for i in _indices(rng, 10, 3):
            counts[i] += 1
    assert max(counts) < 1.1 * min(counts), counts  # 9,000 each expected


def test_a_nodes_load_counts_each_sandbox_once_whatever_a_probe_saw():
    """The router's view of a node's load, from its probes and its own creates and deletes:
    a probe running while a create or a delete is answered may or may not have seen it, and
    either way the sandbox counts once (CI saw a delete counted twice hide a create, and
    three creates land on two nodes)."""
    v = NodeView("n", state="up")
    v.probed_at(0.0, {"a", "b"})
    assert v.load == 2
    v.now_deleted("a")
    v.now_deleted("b")
    assert v.load == 0
    # A probe begun before those deletes were answered, that already saw them done.
    v.probed_at(v.deleted["a"] - 1, set())
    assert v.load == 0
    v.now_made(["c"])
    assert v.load == 1, "a create after a delete counts"
    # ... and one that did not see them done yet, but saw the create.
    v.probed_at(v.made["c"] - 1, {"a", "b", "c"})
    assert v.load == 1
    v.inflight += 1
    v.recount()
    assert v.load == 2, "a create in flight counts"
    v.inflight -= 1
    # A probe begun after them all is the whole truth.
    v.probed_at(v.made["c"] + 1, {"c", "d"})
    assert (v.load, v.made, v.deleted) == (2, {}, {})


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory):
    """Three `lockbox serve`s, as three fleet nodes (ids a..., b..., c...)."""
    procs, infos = [], []
    try:
        for name in "abc":
            proc, info = serve(tmp_path_factory.mktemp(f"node-{name}"))
            procs.append(proc)
            infos.append({**info, "node_id": name * 56})
        yield infos
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)


def e2b_env(monkeypatch, addr):
    for k in ("E2B_DOMAIN", "E2B_ACCESS_TOKEN", "E2B_DEBUG"):
        monkeypatch.delenv(k, raising=False)
    url = f"http://{addr[0]}:{addr[1]}"
    monkeypatch.setenv("E2B_API_URL", url)
    monkeypatch.setenv("E2B_SANDBOX_URL", url)
    monkeypatch.setenv("E2B_API_KEY", "fleet-token")


def spread_sandboxes(three_nodes, monkeypatch, **router_options):
    """Three E2B sandboxes made by the unmodified SDK through a router of ``three_nodes``
    (started with ``router_options``), on at least two nodes: the router's address and the
    sandboxes. Skips without the SDK."""
    need(e2b is not None, "the e2b SDK (pip install e2b==2.63.0)")
    addr = start_router(three_nodes, **router_options)
    e2b_env(monkeypatch, addr)
    if "e2b_domain" in router_options:
        monkeypatch.setenv("E2B_DOMAIN", router_options["e2b_domain"].strip(".").lower())
    boxes = [e2b.Sandbox.create(timeout=120) for _ in range(3)]
    try:
        assert len({next(n["node_id"] for n in three_nodes if s.sandbox_id in held_by(n)) for s in boxes}) >= 2
    except BaseException:
        for s in boxes:
            s.kill()
        raise
    return addr, boxes


def test_the_e2b_sdks_paginator_walks_every_nodes_sandboxes_once_in_order(three_nodes, monkeypatch):
    try:
        from e2b import Sandbox, SandboxQuery
    except ImportError:
        from conftest import need

        need(False, "the e2b SDK (pip install e2b==2.63.0)")
    addr = start_router(three_nodes)
    e2b_env(monkeypatch, addr)
    tag = {"paging": str(random.random())}
    made = [Sandbox.create(metadata=tag, timeout=120) for _ in range(7)]
    try:
        # Spread over the three nodes: each node's own server holds some.
        held = {}
        for n in three_nodes:
            conn = http.client.HTTPConnection(n["url"].removeprefix("http://"), timeout=30)
            conn.request("GET", "/v2/sandboxes?limit=100", headers={"Authorization": f"Bearer {n['token']}"})
            held[n["node_id"]] = {s["sandboxID"] for s in json.loads(conn.getresponse().read())}
        assert sum(1 for ids in held.values() if ids & {s.sandbox_id for s in made}) >= 2, held

        for order in ("desc", "asc"):
            pages = []
            paginator = Sandbox.list(query=SandboxQuery(metadata=tag), limit=2, order=order)
            while paginator.has_next:
                pages.append(paginator.next_items())
            walked = [s for page in pages for s in page]
            ids = [s.sandbox_id for s in walked]
            # Every sandbox once, pages of at most 2, by start time.
            assert sorted(ids) == sorted(s.sandbox_id for s in made), (order, ids)
            assert all(1 <= len(p) <= 2 for p in pages) and len(pages) == 4, [len(p) for p in pages]
            starts = [s.started_at for s in walked]
            assert starts == sorted(starts, reverse=order == "desc"), starts

        # A sandbox made and one deleted between two pages: the walk neither repeats nor
        # skips any of the others.
        paginator = Sandbox.list(query=SandboxQuery(metadata=tag), limit=3)
        first = [s.sandbox_id for s in paginator.next_items()]
        made[-1].kill()
        late = Sandbox.create(metadata=tag, timeout=120)
        made[-1] = late
        rest = []
        while paginator.has_next:
            rest.extend(s.sandbox_id for s in paginator.next_items())
        assert len(set(first + rest)) == len(first + rest), (first, rest)
        assert late.sandbox_id not in rest  # newer than where the walk stood (newest first)
        assert set(first + rest) >= {s.sandbox_id for s in made[:-2]}

        # A token the router did not make, or used with another order, is a clear 400.
        paginator = Sandbox.list(query=SandboxQuery(metadata=tag), limit=2)
        paginator.next_items()
        token = urllib.parse.quote(paginator._next_token, safe="")
        conn = http.client.HTTPConnection(*addr, timeout=30)
        for query in ("nextToken=0000.sb-x", f"nextToken={token}&order=asc", "limit=0", "limit=101"):
            conn.request("GET", f"/v2/sandboxes?{query}", headers={"X-API-Key": "fleet-token"})
            resp = conn.getresponse()
            reply = json.loads(resp.read())
            assert resp.status == 400 and reply["code"] == 400, (query, reply)
    finally:
        for s in made:
            s.kill()


def test_the_e2b_sdk_lists_every_nodes_snapshots_once_and_deletes_them_on_their_node(three_nodes, monkeypatch):
    """E2B's GET /snapshots through the router (docs/fleet.md): the SDK's paginator walks the
    snapshots of every node once each, node after node, the filters pass to each node, and
    Sandbox.delete_snapshot (DELETE /templates/ID) reaches the snapshot's node, from a router
    that saw it made and from one that did not."""
    addr, boxes = spread_sandboxes(three_nodes, monkeypatch)
    Sandbox = e2b.Sandbox
    try:
        snaps = {s.create_snapshot(name=f"routed-{i}-{j}").snapshot_id: s.sandbox_id
                 for i, s in enumerate(boxes) for j in range(2)}
        held = {}
        for n in three_nodes:
            conn = http.client.HTTPConnection(n["url"].removeprefix("http://"), timeout=30)
            conn.request("GET", "/snapshots", headers={"X-API-Key": n["token"]})
            held[n["node_id"]] = {s["snapshotID"] for s in json.loads(conn.getresponse().read())}
        assert sum(1 for ids in held.values() if ids & set(snaps)) >= 2, held

        pages = []
        paginator = Sandbox.list_snapshots(limit=2)
        while paginator.has_next:
            pages.append([s.snapshot_id for s in paginator.next_items()])
        walked = [i for page in pages for i in page]
        assert len(walked) == len(set(walked)) and set(walked) >= set(snaps), pages
        assert all(1 <= len(p) <= 2 for p in pages), pages
        # Node after node, by node id, each in its own order.
        node_of = {i: n for n, ids in held.items() for i in ids}
        assert [node_of[i] for i in walked] == sorted(node_of[i] for i in walked), walked

        first = boxes[0].sandbox_id
        by_box = [s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=first, limit=1).next_items()]
        assert by_box and set(by_box) <= {i for i, b in snaps.items() if b == first}, by_box
        named = Sandbox.list_snapshots(name="routed-2-1").next_items()
        assert [s.names for s in named] == [["routed-2-1"]], named

        # A token of the sandboxes' listing, or one the router did not make, is a clear 400.
        sandboxes = Sandbox.list(limit=1)
        sandboxes.next_items()
        conn = http.client.HTTPConnection(*addr, timeout=30)
        for token in (sandboxes._next_token, "3"):
            conn.request("GET", f"/snapshots?nextToken={urllib.parse.quote(token, safe='')}",
                         headers={"X-API-Key": "fleet-token"})
            resp = conn.getresponse()
            reply = json.loads(resp.read())
            assert resp.status == 400 and "nextToken" in reply["message"], reply

        # Deleted on its node, through this router and through one that never saw it made.
        ids = sorted(snaps)
        assert Sandbox.delete_snapshot(ids[0])
        assert not Sandbox.delete_snapshot(ids[0])
        e2b_env(monkeypatch, start_router(three_nodes))
        for i in ids[1:]:
            assert Sandbox.delete_snapshot(i), i
        left = [s.snapshot_id for s in Sandbox.list_snapshots().next_items()]
        assert not set(left) & set(snaps), left
        # A template that is no snapshot is still not deleted through the router.
        conn.request("DELETE", "/templates/my-team%2Fapp:v1", headers={"X-API-Key": "fleet-token"})
        resp = conn.getresponse()
        assert (resp.status, json.loads(resp.read())["code"]) == (501, 501)
    finally:
        for s in boxes:
            s.kill()


def held_by(node, path="/v2/sandboxes?limit=100", key="sandboxID"):
    """The ids a node's own server lists (E2B's listing by default)."""
    status, _, data = call(node, "GET", path)
    assert status == 200, data
    items = json.loads(data)
    return {s[key] for s in (items if isinstance(items, list) else items[path.split("?")[0].rsplit("/", 1)[1]])}


def test_an_e2b_create_from_a_snapshot_of_another_node_copies_it_there(three_nodes, monkeypatch):
    """E2B's Sandbox.create(template=SNAPSHOT_ID) through the router, placed on a node that
    does not hold the snapshot (its own node is full), copies the snapshot there first, as
    lockbox's from_snapshot does (docs/fleet.md, "Snapshots on other nodes"): the sandbox
    runs on node B with the snapshot's files; the next create finds B's copy; deleting the
    snapshot removes both."""
    try:
        from e2b import Sandbox
    except ImportError:
        from conftest import need

        need(False, "the e2b SDK (pip install e2b==2.63.0)")
    a, b, _ = three_nodes
    e2b_env(monkeypatch, start_router([a]))  # the snapshot is taken on node A
    box = Sandbox.create(timeout=120)
    made = []
    try:
        box.files.write("marker.txt", "written on A")
        snap = box.create_snapshot().snapshot_id
        assert snap not in held_by(b, "/snapshots", "snapshotID")
        # A router to which A is full (its one sandbox: the snapshot's): the create goes to B.
        e2b_env(monkeypatch, start_router([{**a, "max_sandboxes": 1}, b]))
        for _ in range(2):
            made.append(Sandbox.create(template=snap, timeout=120))
            assert made[-1].sandbox_id in held_by(b), "placed on B, not on the full A"
            assert made[-1].files.read("marker.txt") == "written on A"
        assert snap in held_by(b, "/v1/snapshots", "id")  # copied once, under the same id
        for s in made:
            s.kill()
        made.clear()
        assert Sandbox.delete_snapshot(snap)  # B's copy first, then A's own
        assert snap not in held_by(a, "/v1/snapshots", "id") | held_by(b, "/v1/snapshots", "id")
    finally:
        for s in made:
            s.kill()
        box.kill()


def test_an_e2b_create_from_a_snapshot_whose_node_is_down_is_refused_in_e2bs_shape(tmp_path, monkeypatch):
    """The router's own refusal of an E2B create from a snapshot (its only node gone) comes in
    E2B's error shape, {"code", "message"}, which the SDK raises by status."""
    try:
        from e2b import Sandbox
    except ImportError:
        from conftest import need

        need(False, "the e2b SDK (pip install e2b==2.63.0)")
    a_proc, a = serve(tmp_path / "a")
    b_proc, b = serve(tmp_path / "b")
    a["node_id"], b["node_id"] = "a" * 56, "b" * 56
    try:
        addr = start_router([a, b])
        e2b_env(monkeypatch, addr)
        box = Sandbox.create(template="base", timeout=120)
        assert box.sandbox_id in held_by(a) or box.sandbox_id in held_by(b)
        home, other = (a_proc, b) if box.sandbox_id in held_by(a) else (b_proc, a)
        snap = box.create_snapshot().snapshot_id  # recorded by the router with its node
        home.terminate()
        home.wait(30)
        status, body = routed(addr, "POST", "/sandboxes", {"templateID": snap, "timeout": 60},
                              {"X-API-Key": "fleet-token"})
        assert status == 503 and set(body) == {"code", "message"} and body["code"] == 503, body
        assert snap in body["message"] or "cannot be reached" in body["message"], body
        assert snap not in held_by(other, "/snapshots", "snapshotID")
    finally:
        for proc in (a_proc, b_proc):
            proc.terminate()
            proc.wait(30)


def test_e2b_host_form_reaches_the_sandboxs_node(three_nodes, monkeypatch):
    """E2B's sandbox plane by its host form, {port}-{sandboxID}.{domain} (what the SDK names
    with E2B_DOMAIN and no E2B_SANDBOX_URL, and what its signed file URLs carry), through a
    router started with that domain: each request reaches the node of the sandbox it names,
    read as lockbox serve --e2b-domain reads it (docs/e2b.md), with E2B's answers for an
    unknown sandbox or a closed port; a host outside the domain is an API request."""
    addr, boxes = spread_sandboxes(three_nodes, monkeypatch, e2b_domain="Fleet.Test.")
    try:
        def plane(host, target, headers=()):
            conn = http.client.HTTPConnection(*addr, timeout=60)
            conn.request("GET", target, headers={"Host": host, **dict(headers)})
            resp = conn.getresponse()
            return resp.status, resp.read()

        for s in boxes:
            s.files.write("where.txt", s.sandbox_id)
            host = s.get_host(49983)
            assert host == f"49983-{s.sandbox_id}.fleet.test"
            token = {"X-Access-Token": s._envd_access_token}
            assert plane(f"{host}:443", "/files?path=where.txt", token) == (200, s.sandbox_id.encode())
            # A signed URL names its sandbox by host alone: no header, no token.
            signed = urllib.parse.urlsplit(s.download_url("where.txt", use_signature_expiration=60))
            assert plane(host, f"{signed.path}?{signed.query}") == (200, s.sandbox_id.encode())
            status, body = plane(host, "/files?path=where.txt", {"X-Access-Token": "wrong"})
            assert status == 401 and json.loads(body)["code"] == 401, body
            status, body = plane(f"8080-{s.sandbox_id}.fleet.test", "/")  # the node answers: no such port
            assert (status, json.loads(body)["message"]) == (502, "The sandbox is running but port is not open: "
                                                                  "port 8080"), body
        status, body = plane("49983-sb-nowhere.fleet.test", "/files?path=x")
        assert (status, json.loads(body)) == (502, {"code": 502, "message": "The sandbox sb-nowhere was not found"})
        # Not the host form: the API, which wants the fleet's token.
        for host in ("49983-x.other.test", "api-x.fleet.test", "fleet.test"):
            status, body = plane(host, "/v1/sandboxes")
            assert (status, json.loads(body)["code"]) == (401, "UNAUTHORIZED"), (host, body)
    finally:
        for s in boxes:
            s.kill()


def test_e2b_signed_file_urls_through_e2b_sandbox_url_reach_their_sandbox(three_nodes, monkeypatch):
    """A signed file URL the SDK makes with E2B_SANDBOX_URL pointing at the router names no
    sandbox (only its signature binds one): the router finds the node whose sandbox signed
    it, and the download or upload happens there; a URL no sandbox signed is E2B's 401."""
    import httpx
    addr, boxes = spread_sandboxes(three_nodes, monkeypatch)
    try:
        for s in boxes:
            s.files.write("mine.txt", s.sandbox_id)
            down = s.download_url("mine.txt", use_signature_expiration=60)
            assert down.startswith(f"http://{addr[0]}:{addr[1]}/files?"), down
            got = httpx.get(down)
            assert (got.status_code, got.text) == (200, s.sandbox_id), got.text
            up = s.upload_url("up.txt", use_signature_expiration=60)
            sent = httpx.post(up, files={"file": ("up.txt", b"uploaded " + s.sandbox_id.encode())})
            assert sent.status_code == 200, sent.text
            assert s.files.read("up.txt") == f"uploaded {s.sandbox_id}"
        # Another sandbox's signature for this path, or a forged one: no sandbox signed it.
        parts = urllib.parse.urlsplit(boxes[0].download_url("mine.txt", use_signature_expiration=60))
        query = dict(urllib.parse.parse_qsl(parts.query))
        forged = httpx.get(f"http://{addr[0]}:{addr[1]}/files", params={**query, "signature": "v1_forged"})
        assert forged.status_code == 401 and forged.json()["code"] == 401, forged.text
    finally:
        for s in boxes:
            s.kill()


def test_e2b_host_form_is_read_as_lockbox_serve_reads_it():
    from lockbox._router.router import e2b_host_target

    assert e2b_host_target("49999-sb-2.lockbox.test:3000", "lockbox.test") == (49999, "sb-2")
    assert e2b_host_target("49983-sb-2.lockbox.test:", "lockbox.test") == (49983, "sb-2")
    assert e2b_host_target("+80-sb.lockbox.test", "lockbox.test") == (80, "sb")
    for host in ("49999-sb-2.other.test", "127.0.0.1:3000", "lockbox.test", "x.lockbox.test", "65536-sb.lockbox.test",
                 "1_0-sb.lockbox.test", " 80-sb.lockbox.test", "49983-sb.LOCKBOX.TEST"):
        assert e2b_host_target(host, "lockbox.test") is None, host


def routed(addr, method, path, body=None, headers=AUTH):
    """One request through the router: (status, parsed JSON body or None)."""
    conn = http.client.HTTPConnection(*addr, timeout=60)
    conn.request(method, path, body=json.dumps(body).encode() if body is not None else None,
                 headers={"Content-Type": "application/json", **headers})
    resp = conn.getresponse()
    data = resp.read()
    return resp.status, json.loads(data) if data else None


def test_a_scoped_token_minted_through_the_router_works_on_its_node(three_nodes):
    """POST /v1/tokens through the router (docs/fleet.md, "Scoped tokens"): minted on the node
    the placement hint names, handed out as a secret of the router's own; with it, creates,
    execs and listings reach that node, which keeps the token to its scope (the operator's
    sandbox there is not its to see, the operator's routes are 403); the node does not take
    the router's secret; revoked through the router, it is refused."""
    a, b, _ = three_nodes
    addr = start_router(three_nodes)
    status, minted = routed(addr, "POST", "/v1/tokens", {"placement": {"node": "b"}})
    assert status == 201 and minted["node"] == b["node_id"] and minted["token"].startswith("lbfs_"), minted
    scoped = {"Authorization": f"Bearer {minted['token']}"}
    status, theirs = routed(addr, "POST", "/v1/sandboxes", {"placement": {"node": "b"}})
    assert status == 201, theirs
    made = [theirs["id"]]
    try:
        status, box = routed(addr, "POST", "/v1/sandboxes", {}, scoped)
        assert status == 201, box
        made.append(box["id"])
        assert box["id"] in held_by(b, "/v1/sandboxes", "id")
        status, ran = routed(addr, "POST", f"/v1/sandboxes/{box['id']}/exec", {"command": "echo scoped"}, scoped)
        assert (status, ran["stdout"]) == (200, "scoped\n"), ran
        status, listed = routed(addr, "GET", "/v1/sandboxes", None, scoped)
        assert status == 200 and [s["id"] for s in listed["sandboxes"]] == [box["id"]], listed
        status, refused = routed(addr, "GET", f"/v1/sandboxes/{theirs['id']}", None, scoped)
        assert (status, refused["code"]) == (404, "SANDBOX_NOT_FOUND"), refused
        status, refused = routed(addr, "POST", "/v1/tokens", {}, scoped)
        assert (status, refused["code"]) == (403, "FORBIDDEN"), refused
        assert call({**b, "token": minted["token"]}, "GET", "/v1/sandboxes")[0] == 401  # the node's is another
        status, refused = routed(addr, "GET", "/v2/sandboxes", None, {"X-API-Key": minted["token"]})
        assert (status, refused["code"]) == (401, 401), refused  # not an E2B key, as on one server
        status, revoked = routed(addr, "DELETE", f"/v1/tokens/{minted['id']}")
        assert status == 200 and revoked["revoked"], revoked
        status, refused = routed(addr, "GET", "/v1/sandboxes", None, scoped)
        assert (status, refused["code"]) == (401, "UNAUTHORIZED"), refused
        status, refused = routed(addr, "DELETE", f"/v1/tokens/{minted['id']}")
        assert (status, refused["code"]) == (404, "TOKEN_NOT_FOUND"), refused
        status, refused = routed(addr, "POST", "/v1/tokens", {"placement": {"node": "z"}})
        assert (status, refused["code"]) == (503, "NO_NODE"), refused
    finally:
        for sid in made:
            routed(addr, "DELETE", f"/v1/sandboxes/{sid}")


def test_a_scoped_token_ends_with_its_nodes_server_and_is_still_revoked(tmp_path):
    """A node's scoped tokens live in its server's memory: once the server restarted, the
    token is the new server's 401 through the router, and revoking it through the router
    still succeeds (the routers forget it), after which the router itself refuses it."""
    import time

    proc, node = serve(tmp_path / "n")
    node["node_id"] = "t" * 56
    addr = start_router([node])
    try:
        status, minted = routed(addr, "POST", "/v1/tokens", {})
        assert status == 201 and minted["node"] == node["node_id"], minted
        scoped = {"Authorization": f"Bearer {minted['token']}"}
        assert routed(addr, "GET", "/v1/sandboxes", None, scoped)[0] == 200
        proc.terminate()
        proc.wait(30)
        proc, fresh = serve(tmp_path / "n")  # the same state directory: the same operator token
        node.update(url=fresh["url"], token=fresh["token"])  # what the fleet's listing would say
        deadline = time.monotonic() + 60
        while (made := routed(addr, "POST", "/v1/sandboxes", {}))[0] != 201:  # until the router routes to it
            assert time.monotonic() < deadline, f"the router never took the new server: {made}"
            threading.Event().wait(0.2)
        assert routed(addr, "DELETE", f"/v1/sandboxes/{made[1]['id']}")[0] == 200
        status, refused = routed(addr, "GET", "/v1/sandboxes", None, scoped)
        assert (status, refused["code"]) == (401, "UNAUTHORIZED"), refused  # the new server's
        status, revoked = routed(addr, "DELETE", f"/v1/tokens/{minted['id']}")
        assert status == 200 and revoked["revoked"], revoked
        status, refused = routed(addr, "GET", "/v1/sandboxes", None, scoped)
        assert (status, refused["code"]) == (401, "UNAUTHORIZED") and "fleet" in refused["message"], refused
    finally:
        proc.terminate()
        proc.wait(30)


def mcp_tool(addr, name, **arguments):
    """One MCP tool call through the router (stateless JSON-RPC over HTTP): its result."""
    status, reply = routed(addr, "POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                                  "params": {"name": name, "arguments": arguments}},
                           {**AUTH, "Accept": "application/json, text/event-stream"})
    assert status == 200 and reply["id"] == 1, reply
    return reply["result"]


def mcp_scope_of(node):
    """The snapshot ids a node's own /mcp lists (its MCP scope)."""
    status, _, data = call(node, "POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                                  "params": {"name": "list_snapshots", "arguments": {}}})
    assert status == 200, data
    return {s["id"] for s in json.loads(data)["result"]["structuredContent"]["snapshots"]}


def test_issue_31_an_mcp_fork_of_another_nodes_snapshot_copies_it_into_that_nodes_mcp_scope(tmp_path):
    """MCP's fork through a router to which the snapshot's node is full runs on another node
    (docs/fleet.md, "MCP's fork and restore"): a snapshot taken through MCP on node A is
    copied to B into B's MCP scope, and B forks it with A's files; a snapshot taken on A
    through REST (not in A's MCP scope) is refused as A's /mcp refuses it, SNAPSHOT_NOT_FOUND,
    and is not copied: an agent gets no more through the router than through one node."""
    wd = tmp_path / "wd"
    wd.mkdir()
    a_proc, a = serve(tmp_path / "a", "--allow-workdir", str(wd))
    b_proc, b = serve(tmp_path / "b", "--allow-workdir", str(wd))
    a["node_id"], b["node_id"] = "a" * 56, "b" * 56
    try:
        on_a = start_router([a])
        box = mcp_tool(on_a, "create_sandbox", workdir=str(wd), on_exit="abort")["structuredContent"]
        wrote = mcp_tool(on_a, "write_file", sandbox_id=box["id"], path=str(wd / "marker.txt"),
                         content="written on A")
        assert not wrote["isError"], wrote
        snap = mcp_tool(on_a, "snapshot", sandbox_id=box["id"])["structuredContent"]["id"]
        status, rest = routed(on_a, "POST", f"/v1/sandboxes/{box['id']}/snapshots", {})
        assert status == 201, rest
        assert mcp_scope_of(a) == {snap} and mcp_scope_of(b) == set()

        # A router to which A is full (its one sandbox): the fork goes to B.
        router = start_router([{**a, "max_sandboxes": 1}, b])
        forked = mcp_tool(router, "fork", snapshot_id=snap)
        assert not forked["isError"], forked
        fork = forked["structuredContent"]["sandboxes"][0]["id"]
        assert fork in held_by(b, "/v1/sandboxes", "id")
        assert snap in mcp_scope_of(b) and snap in held_by(b, "/v1/snapshots", "id")
        ran = mcp_tool(router, "exec", sandbox_id=fork, command=f"cat {wd}/marker.txt")
        assert ran["structuredContent"]["stdout"] == "written on A", ran
        # B's copy is the agent's there: a restore of its fork to it runs on B.
        restored = mcp_tool(router, "restore", sandbox_id=fork, snapshot_id=snap)
        assert not restored["isError"], restored
        # Deleted through the router: B's copy first, refused while the fork uses it (the
        # original kept), then both.
        refused = mcp_tool(router, "delete_snapshot", snapshot_id=snap)
        assert refused["structuredContent"]["code"] == "SNAPSHOT_IN_USE", refused
        assert refused["structuredContent"]["details"]["node"] == b["node_id"], refused
        assert snap in held_by(a, "/v1/snapshots", "id")
        assert not mcp_tool(router, "delete_sandbox", sandbox_id=fork)["isError"]
        deleted = mcp_tool(router, "delete_snapshot", snapshot_id=snap)
        assert not deleted["isError"], deleted
        assert snap not in held_by(a, "/v1/snapshots", "id") | held_by(b, "/v1/snapshots", "id")

        # Taken through REST: not the agent's on A, so not through the router either.
        other = mcp_tool(on_a, "create_sandbox", workdir=str(wd))["structuredContent"]["id"]
        for name, args in (("fork", {}), ("restore", {"sandbox_id": other}), ("delete_snapshot", {})):
            refused = mcp_tool(router, name, snapshot_id=rest["id"], **args)
            assert refused["isError"], (name, refused)
            assert refused["structuredContent"]["code"] == "SNAPSHOT_NOT_FOUND", (name, refused)
        assert rest["id"] not in held_by(b, "/v1/snapshots", "id") | mcp_scope_of(b)

        # A's node lost (as Ray would list it): a snapshot only A had is SNAPSHOT_LOST over
        # MCP, as over REST through the router (not SANDBOX_LOST).
        nodes = [dict(a), dict(b)]
        watching = start_router(nodes)
        assert mcp_tool(watching, "delete_snapshot", snapshot_id="s-unknown")["structuredContent"]["code"] == \
            "SNAPSHOT_NOT_FOUND"
        refused = mcp_tool(watching, "fork", snapshot_id=rest["id"])  # its node learned, A still up
        assert refused["structuredContent"]["code"] == "SNAPSHOT_NOT_FOUND", refused
        nodes[0].update(state="lost", reason="its raylet is gone")
        deadline = time.monotonic() + 60
        while (lost := mcp_tool(watching, "delete_snapshot", snapshot_id=rest["id"]))["structuredContent"][
                "code"] != "SNAPSHOT_LOST":
            assert time.monotonic() < deadline, f"the router never saw A lost: {lost}"
            threading.Event().wait(0.2)
        assert lost["isError"] and lost["structuredContent"]["details"]["node"] == a["node_id"], lost
        refused = mcp_tool(watching, "fork", snapshot_id=rest["id"])
        assert refused["structuredContent"]["code"] == "SNAPSHOT_LOST", refused
    finally:
        for proc in (a_proc, b_proc):
            proc.terminate()
            proc.wait(30)


def test_merged_pages_take_a_prefix_of_each_nodes_page_by_start_time():
    from lockbox._router import Cursor, merge_pages

    def box(at, sid):
        return {"startedAt": f"2026-12-03T10:00:0{at}.000Z", "sandboxID": sid}

    pages = {"b": [box(9, "b9"), box(5, "b5"), box(1, "b1")], "a": [box(8, "a8"), box(7, "a7")], "c": []}
    page, taken = merge_pages(pages, 4, ascending=False)
    assert [item["sandboxID"] for _, item in page] == ["b9", "a8", "a7", "b5"]
    assert [node for node, _ in page] == ["b", "a", "a", "b"] and taken == {"a": 2, "b": 2, "c": 0}
    ascending = {n: list(reversed(items)) for n, items in pages.items()}
    page, taken = merge_pages(ascending, 2, ascending=True)
    assert [item["sandboxID"] for _, item in page] == ["b1", "b5"] and taken == {"a": 0, "b": 2, "c": 0}
    # The token round-trips, and says what is wrong with one it did not make.
    c = Cursor("desc", {"a" * 56: "0001.sb-1", "b" * 56: None, "c" * 56: ""}, ("2026-12-03T10:00:05.000Z", "b5"))
    assert Cursor.decode(c.encode(), "desc") == c
    for token, order, why in ((c.encode(), "asc", "order=desc"), ("0001.sb-1", "desc", "not one"),
                              ("fleet1.!!!", "desc", "not one")):
        with pytest.raises(ValueError, match=why):
            Cursor.decode(token, order)


def small_nodes_and_image(tmp_path):
    """Two real nodes of two sandboxes each (`a...`, `b...`) and the busybox OCI layout's
    reference: (layout, {letter: process}, [node])."""
    need(os.path.exists("/bin/busybox") and os.path.exists("/bin/bash-static"),
         "busybox-static and bash-static (Debian packages) for the image")
    from test_image import busybox_layout

    layout = busybox_layout(str(tmp_path / "layout"))
    procs, nodes = {}, []
    for name in ("a", "b"):
        proc, info = serve(tmp_path / name, "--max-sandboxes", "2")
        info.update(node_id=name * 56, max_sandboxes=2)
        procs[name] = proc
        nodes.append(info)
    return layout, procs, nodes


def test_an_e2b_template_built_through_the_router_runs_where_it_is_or_is_copied_first(tmp_path, monkeypatch):
    """E2B's `Template.build` through a router (docs/fleet.md, "E2B templates"): the build,
    its file uploads (to the one-time URL, through the router) and its status go to one
    node; `Sandbox.create(template)` goes there while it has room; a template built from it
    on the other node has it copied there first; then creates go to the other node, which
    has the template (image and start command), and then to whichever
    of the two has room, also once the builder is gone; a router that never saw the build
    finds it; a name no node built does not exist; a tampered copy is refused."""
    need(e2b is not None, "the e2b SDK (pip install e2b==2.63.0)")
    layout, procs, nodes = small_nodes_and_image(tmp_path)
    boxes = []
    try:
        first = start_router(nodes)
        url = f"http://{first[0]}:{first[1]}"
        for key, value in (("E2B_API_URL", url), ("E2B_SANDBOX_URL", url), ("E2B_API_KEY", "fleet-token"),
                           ("E2B_DOMAIN", "lockbox.test")):
            monkeypatch.setenv(key, value)
        ctx = tmp_path / "ctx"
        (ctx / "app").mkdir(parents=True)
        (ctx / "app" / "main.sh").write_text("echo from-copy\n")
        template = (e2b.Template(file_context_path=str(ctx)).from_image(layout).copy("app", "/opt/app")
                    .run_cmd("sh /opt/app/main.sh > /work/built.txt")
                    .set_start_cmd("sh -c 'echo up > /work/started; exec busybox sleep 600'",
                                   e2b.wait_for_file("/work/started")))
        info = e2b.Template.build(template, "fleet-demo:v1")
        assert info.template_id == "fleet-demo"
        assert e2b.Template.exists("fleet-demo") and not e2b.Template.exists("fleet-never-built")
        built = [n for n in nodes if call(n, "GET", "/templates/aliases/fleet-demo")[0] == 200]
        assert len(built) == 1, [call(n, "GET", "/templates/aliases/fleet-demo")[0] for n in nodes]
        home = built[0]
        other = next(n for n in nodes if n is not home)

        def node_of(box):
            listed = json.loads(raw_get(first, "/v1/sandboxes"))["sandboxes"]
            return {s["id"]: s["node"] for s in listed}[box.sandbox_id]

        def made_here(box):
            r = box.commands.run("cat /work/built.txt /work/started")
            assert (r.exit_code, r.stdout) == (0, "from-copy\nup\n"), r

        # The builder while it has room (two).
        for _ in range(2):
            boxes.append(e2b.Sandbox.create("fleet-demo:v1"))
            assert node_of(boxes[-1]) == home["node_id"]
        assert call(other, "GET", "/templates/fleet-demo/archive?tag=v1")[0] == 404
        # A template built from it goes to the least loaded node, the other one: its base is
        # copied there first.
        derived = e2b.Template().from_template("fleet-demo:v1").run_cmd("echo derived > /work/derived.txt")
        e2b.Template.build(derived, "fleet-derived")
        assert call(other, "GET", "/templates/aliases/fleet-derived")[0] == 200
        assert call(other, "GET", "/templates/fleet-demo/archive?tag=v1")[0] == 200
        with e2b.Sandbox.create("fleet-derived") as box:
            assert box.commands.run("cat /work/built.txt /work/derived.txt").stdout == "from-copy\nderived\n"
        # The builder full: the other node, which has a copy now.
        boxes.append(e2b.Sandbox.create("fleet-demo:v1"))
        assert node_of(boxes[-1]) == other["node_id"]
        for box in boxes:
            made_here(box)
        status, headers, archive = call(other, "GET", "/templates/fleet-demo/archive?tag=v1")
        assert status == 200 and headers["docker-content-digest"].startswith("sha256:")
        # A router that never saw the build (no store) asks the nodes, and finds room on the copy's.
        second = start_router(nodes)
        monkeypatch.setenv("E2B_API_URL", f"http://{second[0]}:{second[1]}")
        monkeypatch.setenv("E2B_SANDBOX_URL", f"http://{second[0]}:{second[1]}")
        boxes.append(e2b.Sandbox.create("fleet-demo:v1"))
        assert node_of(boxes[-1]) == other["node_id"]
        made_here(boxes[-1])

        # The builder gone: the copy's node takes the template's sandboxes as it has room.
        boxes[-1].kill()
        procs[home["node_id"][0]].terminate()
        procs[home["node_id"][0]].wait(30)
        deadline = time.monotonic() + 20  # a bound on the wait, not a measurement
        while True:
            try:
                again = e2b.Sandbox.create("fleet-demo:v1")
                break
            except Exception:  # noqa: BLE001 (503 while the router still routes to the builder)
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert node_of(again) == other["node_id"]
        made_here(again)
        again.kill()

        # A copy whose bytes are not the digest's is refused, and nothing is kept.
        tampered = archive[:-1] + bytes([archive[-1] ^ 1])
        digest = headers["docker-content-digest"]
        conn = http.client.HTTPConnection(*other["url"][len("http://"):].rsplit(":", 1), timeout=60)
        conn.request("PUT", f"/templates/fleet-tampered/archive?tag=v1&digest={digest}", body=tampered,
                     headers={"X-API-Key": other["token"]})
        resp = conn.getresponse()
        assert resp.status == 422 and "tampered or cut" in json.loads(resp.read())["message"]
        conn.close()
        assert call(other, "GET", "/templates/aliases/fleet-tampered")[0] == 404
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(30)


def raw_get(addr, path):
    conn = http.client.HTTPConnection(*addr, timeout=60)
    try:
        conn.request("GET", path, headers=AUTH)
        resp = conn.getresponse()
        assert resp.status == 200
        return resp.read()
    finally:
        conn.close()


def router_call(addr, method, path, body=None):
    conn = http.client.HTTPConnection(*addr, timeout=120)
    try:
        conn.request(method, path, body=json.dumps(body).encode() if body is not None else None,
                     headers={**AUTH, "Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


def test_an_image_committed_on_one_node_runs_where_it_is_or_is_copied_first(tmp_path):
    """`POST .../commit-image` through a router (docs/fleet.md, "Images a node made"): creates
    naming the new image go to that node while it has room, then to another, which the image
    is copied to first (`GET` and `PUT /v1/images/archive`, digest checked); a tampered
    archive is refused there and nothing is kept; a scoped token may not move images."""
    layout, procs, nodes = small_nodes_and_image(tmp_path)
    try:
        router = start_router(nodes)
        status, box = router_call(router, "POST", "/v1/sandboxes", {"image": layout})
        assert status == 201, box
        assert router_call(router, "POST", f"/v1/sandboxes/{box['id']}/exec",
                           {"command": "echo committed > /etc/fleet.txt"})[0] == 200
        status, image = router_call(router, "POST", f"/v1/sandboxes/{box['id']}/commit-image", {"tags": ["fleet-app:1"]})
        assert status == 201 and "docker.io/library/fleet-app:1" in image["references"], image
        listed = {s["id"]: s["node"] for s in router_call(router, "GET", "/v1/sandboxes")[1]["sandboxes"]}
        home = next(n for n in nodes if n["node_id"] == listed[box["id"]])
        other = next(n for n in nodes if n is not home)
        assert call(other, "GET", "/v1/images/archive?reference=fleet-app:1")[0] == 404

        made = []
        for _ in range(2):  # the committing node has room for one more; then the other, copied to
            status, got = router_call(router, "POST", "/v1/sandboxes", {"image": "fleet-app:1"})
            assert status == 201, got
            made.append(got["id"])
        listed = {s["id"]: s["node"] for s in router_call(router, "GET", "/v1/sandboxes")[1]["sandboxes"]}
        assert [listed[i] for i in made] == [home["node_id"], other["node_id"]], listed
        for sid in made:
            status, ran = router_call(router, "POST", f"/v1/sandboxes/{sid}/exec", {"command": "cat /etc/fleet.txt"})
            assert (status, ran["stdout"]) == (200, "committed\n"), ran

        # The archive pair on its own: the digest is the bytes', a tampered body is refused
        # and nothing is kept, the digest is needed, and a scoped token may not move images.
        status, headers, archive = call(other, "GET", "/v1/images/archive?reference=fleet-app:1")
        assert status == 200 and headers["docker-content-digest"].startswith("sha256:")
        import hashlib
        assert headers["docker-content-digest"] == "sha256:" + hashlib.sha256(archive).hexdigest()  # noqa: S324
        host, port = other["url"][len("http://"):].rsplit(":", 1)

        def put(reference, body, digest, token=other["token"]):
            conn = http.client.HTTPConnection(host, int(port), timeout=120)
            try:
                query = f"reference={reference}" + (f"&digest={digest}" if digest else "")
                conn.request("PUT", f"/v1/images/archive?{query}", body=body, headers={"Authorization": f"Bearer {token}"})
                resp = conn.getresponse()
                return resp.status, json.loads(resp.read() or b"null")
            finally:
                conn.close()

        tampered = archive[:-1] + bytes([archive[-1] ^ 1])
        status, err = put("fleet-tampered:1", tampered, headers["docker-content-digest"])
        assert (status, err["code"]) == (502, "DIGEST_MISMATCH"), err
        assert call(other, "GET", "/v1/images/archive?reference=fleet-tampered:1")[0] == 404
        status, err = put("fleet-tampered:1", b"x", None)
        assert (status, err["code"], err["details"].get("field")) == (400, "INVALID_REQUEST", "digest"), err
        status, _, minted = call(other, "POST", "/v1/tokens", {})
        assert status == 201, minted
        scoped = json.loads(minted)["token"]
        status, err = put("fleet-scoped:1", b"x", headers["docker-content-digest"], token=scoped)
        assert (status, err["code"]) == (403, "FORBIDDEN"), err
        status, again = put("fleet-moved:1", archive, headers["docker-content-digest"])
        assert status == 201 and again["id"] == image["id"], again
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(30)


def test_an_image_built_on_a_nodes_machine_outside_any_server_is_found_and_copied(tmp_path):
    """`lockbox image build` into a node's store, with no server involved (docs/fleet.md,
    "Images a node made"): no router knows the image, so a create naming it asks the nodes
    (`HEAD /v1/images/archive`), goes to the one that has it while it has room, then to the
    other, which it is copied to first; a name no node has is answered by a node as before."""
    layout, procs, nodes = small_nodes_and_image(tmp_path)
    try:
        context = tmp_path / "context"
        context.mkdir()
        (context / "Dockerfile").write_text(f"FROM {layout}\nRUN echo built here > /etc/fleet.txt\n")
        built = subprocess.run([sys.executable, "-m", "lockbox._cli", "image", "build", "--state-dir",
                                str(tmp_path / "b"), "--tag", "local-app:1", str(context)],
                               capture_output=True, text=True, timeout=300)
        assert built.returncode == 0, built.stderr
        holder, other = nodes[1], nodes[0]
        status, head, _ = call(holder, "HEAD", "/v1/images/archive?reference=local-app:1")
        assert (status, head.get("lockbox-image-source")) == (200, "build"), head
        assert call(other, "HEAD", "/v1/images/archive?reference=local-app:1")[0] == 404
        assert call(other, "HEAD", "/v1/images/archive?reference=Not%20An%20Image")[0] == 400

        router = start_router(nodes)
        made = []
        for _ in range(3):  # the holder has room for two; then the other, copied to
            status, got = router_call(router, "POST", "/v1/sandboxes", {"image": "local-app:1"})
            assert status == 201, got
            made.append(got["id"])
        listed = {s["id"]: s["node"] for s in router_call(router, "GET", "/v1/sandboxes")[1]["sandboxes"]}
        assert [listed[i] for i in made] == [holder["node_id"]] * 2 + [other["node_id"]], listed
        for sid in made:
            status, ran = router_call(router, "POST", f"/v1/sandboxes/{sid}/exec", {"command": "cat /etc/fleet.txt"})
            assert (status, ran["stdout"]) == (200, "built here\n"), ran
        for sid in made:
            assert router_call(router, "DELETE", f"/v1/sandboxes/{sid}")[0] == 200

        # A name no node has: placed as any create, and the node's own answer comes back.
        status, err = router_call(router, "POST", "/v1/sandboxes", {"image": "oci:/nonexistent/layout"})
        assert status >= 400 and status != 503, err
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(30)


def test_image_names_are_normalised_as_the_store_records_them():
    from lockbox._router.image_copies import normalized_reference

    assert normalized_reference("app:2") == "docker.io/library/app:2"
    assert normalized_reference("app") == "docker.io/library/app:latest"
    assert normalized_reference("team/app") == "docker.io/team/app:latest"
    assert normalized_reference("registry.example:5000/team/app:3") == "registry.example:5000/team/app:3"
    assert normalized_reference("localhost/app") == "localhost/app:latest"
    assert normalized_reference("app@sha256:" + "0" * 64) == "docker.io/library/app@sha256:" + "0" * 64
    assert normalized_reference("oci:/srv/layout:v1") is None
    assert normalized_reference("") is None
