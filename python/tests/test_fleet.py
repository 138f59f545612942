"""The fleet's node daemons on a real multi-node Ray cluster on this machine
(`ray.cluster_utils.Cluster`, issue 31 item 1): one `lockbox serve` per node, each with its
own state directory and port; a server that dies is restarted by Ray; a node that joins gets
a daemon; a node that leaves is listed lost; `down` leaves no server behind."""

import functools
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import need

try:
    import ray
    from ray.cluster_utils import Cluster
except ImportError:
    ray = None


def wait_for(what, check, timeout=120.0):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


def settled(router):
    """Waits until the router sees every node empty: placement weighs its view of each node's
    load, which an earlier test's sandboxes (deleted through another router, say) leave only
    once its probes see them gone. Tests that check how creates spread start from there."""
    wait_for("the router to see every node empty", lambda: all(
        load == 0 for load in http_call(router["url"] + "/healthz")[2]["load"].values()), timeout=30)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ", 1)[1][0] != "Z"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    need(ray is not None, "ray (pip install ray)")
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.add_node(num_cpus=1)
    c.add_node(num_cpus=1)
    ray.init(address=c.address, namespace="lockbox-test", log_to_driver=False)
    try:
        yield c, str(tmp_path_factory.mktemp("fleet"))
    finally:
        import lockbox.fleet

        lockbox.fleet.down("lockbox-test")
        ray.shutdown()
        c.shutdown()


def test_one_server_per_node_restarted_joined_and_lost_with_its_node(cluster):
    import lockbox.fleet

    c, root = cluster
    fleet = lockbox.fleet.up(namespace="lockbox-test", state_root=root)
    nodes = fleet.wait(3)
    assert len({n["node_id"] for n in nodes}) == 3 and len({n["url"] for n in nodes}) == 3
    assert {n["state_dir"] for n in nodes} == {os.path.join(root, n["node_id"]) for n in nodes}
    for n in nodes:
        with fleet.client(n["node_id"]).create() as box:
            r = box.exec("echo hi from $(hostname)")
            assert r.exit_code == 0 and r.stdout.startswith("hi from"), r

    # A server that dies comes back (Ray restarts its daemon) on the same state directory.
    victim = nodes[0]
    os.kill(victim["pid"], signal.SIGKILL)
    back = wait_for("the killed node's server to come back", lambda: [
        n for n in fleet.nodes() if n["node_id"] == victim["node_id"] and n["state"] == "up"
        and n["pid"] != victim["pid"]])
    assert back[0]["state_dir"] == victim["state_dir"]
    with fleet.client(victim["node_id"]).create() as box:
        assert box.exec("true").exit_code == 0

    # A node that joins the cluster joins the fleet, its `lockbox` Ray resource its capacity.
    extra = c.add_node(num_cpus=1, resources={"lockbox": 5})
    nodes = fleet.wait(4)
    joined = [n for n in nodes if n["node_id"] == extra.node_id]
    assert joined, nodes
    assert joined[0]["max_sandboxes"] == 5, joined
    with open(f"/proc/{joined[0]['pid']}/cmdline", "rb") as f:
        assert b"--max-sandboxes\x005\x00" in f.read()
    assert all(n["max_sandboxes"] == 64 for n in nodes if n["node_id"] != extra.node_id), nodes

    # A node that leaves is listed lost with a reason; the others keep working.
    c.remove_node(extra)
    lost = wait_for("the removed node to be listed lost", lambda: [
        n for n in fleet.nodes() if n["node_id"] == extra.node_id and n["state"] == "lost"])
    assert lost[0]["reason"]
    assert not alive(joined[0]["pid"])
    others = [n for n in fleet.nodes() if n["state"] == "up"]
    assert len(others) == 3
    with fleet.client(others[-1]["node_id"]).create() as box:
        assert box.exec("true").exit_code == 0

    # down stops every server.
    pids = [n["pid"] for n in others]
    lockbox.fleet.down("lockbox-test")
    wait_for("every server to stop", lambda: not any(alive(p) for p in pids), timeout=60)


# -- The router: one address for the whole fleet (issue 31 items 2, 3, 5) ---------------------


@pytest.fixture(scope="module")
def routed(cluster):
    """The fleet up again on the three nodes, with a router pinned to the head node (the
    node-loss test removes a worker node: the router and the controller must not be on it)."""
    import lockbox.fleet

    c, root = cluster
    fleet = lockbox.fleet.up(namespace="lockbox-test", state_root=root)
    nodes = fleet.wait(3)
    r = fleet.router("127.0.0.1:0", node_id=c.head_node.node_id)
    return fleet, nodes, r


def node_of(listing, sid):
    return next(s["node"] for s in listing if s["id"] == sid)


def test_the_router_serves_the_api_of_every_node_with_the_fleets_token(routed):
    import lockbox
    from lockbox.errors import ServerError

    fleet, nodes, r = routed
    client = lockbox.Client(r["url"], r["token"], timeout=60)
    settled(r)
    boxes = [client.create(labels={"n": str(i)}) for i in range(6)]
    try:
        listing = client.list()
        placed = {b.id: node_of(listing, b.id) for b in boxes}
        # Power of K choices over three nodes spreads six creates two by two.
        assert sorted(list(placed.values()).count(n["node_id"]) for n in nodes) == [2, 2, 2], placed
        for b in boxes:
            # Each call reaches the node that holds the sandbox: its own server lists it.
            direct = fleet.client(placed[b.id]).list()
            assert b.id in {s["id"] for s in direct}
            r1 = b.exec("echo $((6 * 7))")
            assert (r1.exit_code, r1.stdout) == (0, "42\n")
            b.files.write("/tmp/f.txt", b"routed")
            assert b.files.read("/tmp/f.txt") == b"routed"
        # An SSE stream comes through event by event.
        events = list(boxes[0].exec_stream("for i in 1 2 3; do echo $i; done"))
        assert events[0].event == "start" and events[-1].event == "exit"
        assert b"".join(e.bytes for e in events if e.event == "stdout") == b"1\n2\n3\n"
        # A node's own token is not the fleet's: the router refuses it.
        with pytest.raises(ServerError) as e:
            lockbox.Client(r["url"], nodes[0]["token"]).list()
        assert (e.value.status, e.value.code) == (401, "UNAUTHORIZED")
    finally:
        for b in boxes:
            b.delete()
    gone = {s["id"]: s["state"] for s in client.list()}
    assert all(gone.get(b.id) in (None, "stopped") for b in boxes), gone


def test_a_websocket_passes_through_the_router(routed):
    import websocket

    import lockbox

    _, _, r = routed
    client = lockbox.Client(r["url"], r["token"], timeout=60)
    with client.create() as box:
        p = box.start_process(argv=["cat"], stdin=True)
        ws = websocket.create_connection(p.pty_url.replace("/pty", "/ws"), timeout=30,
                                         header=[f"Authorization: Bearer {r['token']}"])
        try:
            ws.send_binary(b"through the router\n")
            got = b""
            while b"through the router" not in got:
                data = ws.recv()
                got += data if isinstance(data, bytes) else data.encode()
        finally:
            ws.close()


def test_placement_honours_a_node_hint_and_refuses_a_bad_one(routed):
    import lockbox
    from lockbox.errors import ServerError

    _, nodes, r = routed
    client = lockbox.Client(r["url"], r["token"], timeout=60)
    target = nodes[1]["node_id"]
    boxes = [client.create(placement={"node": target[:12]}) for _ in range(3)]
    try:
        listing = client.list()
        assert {node_of(listing, b.id) for b in boxes} == {target}
    finally:
        for b in boxes:
            b.delete()
    with pytest.raises(ServerError) as e:
        client.create(placement={"rack": "a"})
    assert (e.value.status, e.value.code, e.value.details["field"]) == (400, "INVALID_REQUEST", "placement.rack")
    with pytest.raises(ServerError) as e:
        client.create(placement={"node": "no-such-node"})
    assert (e.value.status, e.value.code) == (503, "NO_NODE")


def test_the_e2b_sdk_works_through_the_router(routed, monkeypatch):
    try:
        from e2b import Sandbox
    except ImportError:
        need(False, "the e2b SDK (pip install e2b==2.63.0)")
    import lockbox

    _, _, r = routed
    for k in ("E2B_DOMAIN", "E2B_ACCESS_TOKEN", "E2B_DEBUG"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("E2B_API_URL", r["url"])
    monkeypatch.setenv("E2B_SANDBOX_URL", r["url"])
    monkeypatch.setenv("E2B_API_KEY", r["token"])
    settled(r)
    sbxs = [Sandbox.create(metadata={"via": "router"}) for _ in range(3)]
    try:
        for s in sbxs:
            out = s.commands.run("echo hi from e2b")
            assert (out.exit_code, out.stdout) == (0, "hi from e2b\n")
            s.files.write("note.txt", "routed")
            assert s.files.read("note.txt") == "routed"
        listed = {s.sandbox_id for s in Sandbox.list().next_items()}
        assert {s.sandbox_id for s in sbxs} <= listed
        listing = lockbox.Client(r["url"], r["token"]).list()
        assert len({node_of(listing, s.sandbox_id) for s in sbxs}) == 3
        # A snapshot on each node: E2B's listing through the router names each once, page
        # by page, and each is deleted on its node.
        snaps = [s.create_snapshot().snapshot_id for s in sbxs]
        paginator, walked = Sandbox.list_snapshots(limit=2), []
        while paginator.has_next:
            walked += [s.snapshot_id for s in paginator.next_items()]
        assert sorted(i for i in walked if i in snaps) == sorted(snaps), walked
        assert len(walked) == len(set(walked)), walked
        for i in snaps:
            assert Sandbox.delete_snapshot(i), i
        assert not set(snaps) & {s.snapshot_id for s in Sandbox.list_snapshots().next_items()}
    finally:
        for s in sbxs:
            assert s.kill()
    assert not sbxs[0].is_running()


def test_a_second_router_and_a_restarted_one_see_the_same_placements(routed, cluster):
    import ray
    from ray.experimental import internal_kv

    import lockbox

    c, _ = cluster
    fleet, _, r = routed
    client = lockbox.Client(r["url"], r["token"], timeout=60)
    boxes = [client.create() for _ in range(3)]
    try:
        listing = client.list()
        for b in boxes:  # recorded in Ray's GCS before anyone asks
            got = internal_kv._internal_kv_get(f"p/{b.id}".encode(), namespace=b"lockbox-fleet:lockbox-test")
            assert got and json_loads(got)["node"] == node_of(listing, b.id)
        # A second router, in a process of its own (python -m lockbox.fleet router).
        second = subprocess.Popen([sys.executable, "-m", "lockbox.fleet", "router", "--ray", c.address,
                                   "--namespace", "lockbox-test", "--listen", "127.0.0.1:0", "--print-token"],
                                  stdout=subprocess.PIPE, text=True)
        try:
            line = json_loads(second.stdout.readline())
            other = lockbox.Client(f"http://{line['listen']}", line["token"], timeout=60)
            assert line["token"] == r["token"]
            for b in boxes:
                assert other.sandbox(b.id).exec("true").exit_code == 0
            assert {s["id"] for s in other.list()} >= {b.id for b in boxes}
        finally:
            second.terminate()
            second.wait(30)
        # The first router killed: Ray restarts it (on a new port) and it knows every sandbox.
        old = r["url"]
        ray.kill(ray.get_actor("lockbox-fleet-router", namespace="lockbox-test"), no_restart=False)
        again = wait_for("the router to come back", lambda: try_router(fleet, c, old))
        restarted = lockbox.Client(again["url"], again["token"], timeout=60)
        for b in boxes:
            assert restarted.sandbox(b.id).exec("true").exit_code == 0
        routed[2].update(again)
    finally:
        for b in boxes:
            client_for(routed).sandbox(b.id).delete()


def json_loads(raw):
    import json

    return json.loads(raw)


def try_router(fleet, c, old_url):
    try:
        info = fleet.router("127.0.0.1:0", node_id=c.head_node.node_id)
    except Exception:
        return None
    return info if info["url"] != old_url else None


def client_for(routed):
    import lockbox

    return lockbox.Client(routed[2]["url"], routed[2]["token"], timeout=60)


def http_call(url, method="GET", body=None, headers=None):
    """One request; (status, headers, parsed JSON body or raw bytes)."""
    import json
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={  # noqa: S310 - http only
        **({"Content-Type": "application/json"} if data is not None else {}), **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 - http only
            raw, status, hs = resp.read(), resp.status, resp.headers
    except urllib.error.HTTPError as e:
        raw, status, hs = e.read(), e.code, e.headers
    try:
        return status, hs, json.loads(raw)
    except ValueError:
        return status, hs, raw


def test_mcp_through_the_router_reaches_the_node_of_each_sandbox(routed):
    import lockbox

    _, _, r = routed
    auth = {"Authorization": f"Bearer {r['token']}", "Accept": "application/json, text/event-stream"}

    def tool(name, **arguments):
        status, _, reply = http_call(r["url"] + "/mcp", "POST", {
            "jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": name, "arguments": arguments}},
            auth)
        assert status == 200 and reply["id"] == 7, reply
        return reply["result"]

    status, _, init = http_call(r["url"] + "/mcp", "POST", {
        "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}, auth)
    assert status == 200 and init["result"]["serverInfo"], init
    settled(r)
    made = [tool("create_sandbox")["structuredContent"]["id"] for _ in range(3)]
    try:
        nodes = {node_of(lockbox.Client(r["url"], r["token"]).list(), i) for i in made}
        assert len(nodes) == 3
        for i in made:
            out = tool("exec", sandbox_id=i, command="echo mcp")
            assert not out["isError"] and out["structuredContent"]["stdout"] == "mcp\n", out
        listed = tool("list_sandboxes")["structuredContent"]["sandboxes"]
        assert {s["id"] for s in listed} >= set(made) and all(s["node"] for s in listed)
        missing = tool("exec", sandbox_id="sb-nowhere", command="true")
        assert missing["isError"] and missing["structuredContent"]["code"] == "SANDBOX_NOT_FOUND"
    finally:
        for i in made:
            assert not tool("delete_sandbox", sandbox_id=i)["isError"]


def test_the_console_logs_in_with_the_fleets_token_and_sees_every_node(routed):
    import lockbox

    _, nodes, r = routed
    client = lockbox.Client(r["url"], r["token"], timeout=60)
    boxes = [client.create(placement={"node": n["node_id"]}) for n in nodes]
    try:
        status, _, page = http_call(r["url"] + "/ui")
        assert status == 200 and b"<html" in page.lower()
        status, _, _ = http_call(r["url"] + "/ui/login", "POST", {"token": nodes[0]["token"]})
        assert status == 401  # a node's token is not the fleet's
        status, hs, _ = http_call(r["url"] + "/ui/login", "POST", {"token": r["token"]})
        assert status == 204
        jar = {c.split(";")[0].split("=")[0]: c.split(";")[0].split("=", 1)[1] for c in hs.get_all("Set-Cookie")}
        cookie = {"Cookie": f"lockbox_session={jar['lockbox_session']}; lockbox_csrf={jar['lockbox_csrf']}"}
        assert http_call(r["url"] + "/ui/session", headers=cookie)[0] == 200
        status, _, listing = http_call(r["url"] + "/v1/sandboxes", headers=cookie)
        assert status == 200
        assert {s["node"] for s in listing["sandboxes"] if s["id"] in {b.id for b in boxes}} == {
            n["node_id"] for n in nodes}
        # Writes with the cookie need the CSRF header, as on one server.
        target = f"{r['url']}/v1/sandboxes/{boxes[0].id}/exec"
        assert http_call(target, "POST", {"command": "true"}, cookie)[0] == 403
        status, _, out = http_call(target, "POST", {"command": "echo console"},
                                   {**cookie, "X-CSRF-Token": jar["lockbox_csrf"]})
        assert status == 200 and out["stdout"] == "console\n", out
    finally:
        for b in boxes:
            b.delete()


def fetch(addr, path, host, headers=None):
    """GET ``path`` from ``addr`` with ``Host: host`` (Python does not resolve *.localhost):
    (status, headers, body)."""
    import http.client

    conn = http.client.HTTPConnection(*addr, timeout=30)
    try:
        conn.request("GET", path, headers={"Host": host, **(headers or {})})
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()
    finally:
        conn.close()


def answered(*args):
    """:func:`fetch`, or ``None`` while the sandboxed server is not listening yet (502)."""
    got = fetch(*args)
    return got if got[0] != 502 else None


def test_exposed_ports_origins_reach_the_port_through_the_router(routed):
    import urllib.parse

    import lockbox

    _, nodes, r = routed
    client = lockbox.Client(r["url"], r["token"], timeout=60)
    ports_host, ports_port = r["ports_listen"].rsplit(":", 1)
    boxes = [client.create(placement={"node": n["node_id"]}) for n in nodes]
    try:
        for box in boxes:
            box.files.write("/tmp/site/hello.txt", f"hello from {box.id}\n".encode())
            box.start_process(argv=["python3", "-m", "http.server", "8731", "--bind", "127.0.0.1",
                                    "--directory", "/tmp/site"])
            port = box.expose_port(8731)
            # The origin names the router's ports listener, not the node's.
            origin = urllib.parse.urlsplit(port["origin"])
            assert (origin.hostname, origin.port) == (f"8731-{box.id}.localhost", int(ports_port)), port
            assert port["open_url"].startswith(port["origin"] + "/__lockbox/open?key=")
            assert [(p["origin"], p["open_url"]) for p in box.ports()] == [(port["origin"], port["open_url"])]
            addr = (ports_host, int(ports_port))
            # The fleet's token opens it (the router sends the node's own).
            bearer = {"Authorization": f"Bearer {r['token']}"}
            got = wait_for("the sandbox's server to answer through the router",
                           functools.partial(answered, addr, "/hello.txt", origin.netloc, bearer), timeout=30)
            assert (got[0], got[2]) == (200, f"hello from {box.id}\n".encode()), got
            # A browser: no token, the open_url sets the port's cookie on the router's origin.
            assert fetch(addr, "/hello.txt", origin.netloc)[0] == 401
            opened = urllib.parse.urlsplit(port["open_url"])
            status, hs, _ = fetch(addr, f"{opened.path}?{opened.query}", origin.netloc)
            assert status == 303 and hs["Location"] == "/", (status, dict(hs))
            cookie = hs["Set-Cookie"].split(";")[0]
            assert cookie.startswith("lockbox_port=") and "Domain" not in hs["Set-Cookie"]
            status, _, body = fetch(addr, "/hello.txt", origin.netloc, {"Cookie": cookie})
            assert (status, body) == (200, f"hello from {box.id}\n".encode())
        # A node's own token is not the fleet's; a host that names no port is not found.
        node_bearer = {"Authorization": f"Bearer {nodes[0]['token']}"}
        assert fetch(addr, "/hello.txt", origin.netloc, node_bearer)[0] == 401
        status, _, body = fetch(addr, "/", f"{ports_host}:{ports_port}", bearer)
        assert status == 404 and b"names no port" in body, body
    finally:
        for box in boxes:
            box.delete()


# -- The executor in the fleet (issue 31 item 6) -----------------------------------------------


def pool_sandboxes(fleet, pool, state="running"):
    """{sandbox id: (node id, its client)} of the pool's sandboxes on every daemon."""
    out = {}
    for n in fleet.nodes():
        if n["state"] != "up":
            continue
        client = fleet.client(n["node_id"])
        for s in client.list(state=state):
            if (s.get("labels") or {}).get("lockbox-pool") == pool._pool_id:
                out[s["id"]] = (n["node_id"], client)
    return out


def file_in(client, sid, path):
    from lockbox.errors import ServerError

    try:
        return client.sandbox(sid).files.read(path)
    except ServerError:
        return None


def wait_for_go(tag):
    """In the sandbox: says where it runs, then waits for the test to let it go."""
    import os
    import time

    with open(f"/tmp/started-{tag}", "w") as f:
        f.write(os.environ.get("LOCKBOX_IN_SANDBOX", ""))
    deadline = time.monotonic() + 60
    while not os.path.exists(f"/tmp/go-{tag}"):
        assert time.monotonic() < deadline, "never let go"
        time.sleep(0.05)
    return {"tag": tag, "sum": sum(range(10)), "cwd": os.getcwd()}


def test_a_fleet_pools_calls_run_in_the_node_daemons_sandboxes(routed):
    from lockbox.ray import RaySandboxPool

    fleet, nodes, _ = routed
    with RaySandboxPool(3, fleet="lockbox-test", timeout=60) as pool:
        pool.wait_ready()
        # Each actor keeps a sandbox of its node's server ready: one on every node.
        warm = pool_sandboxes(fleet, pool)
        assert sorted(node for node, _ in warm.values()) == sorted(n["node_id"] for n in nodes), warm
        assert pool.secure_execute(sum, [1, 2, 3]).unwrap() == 6

        results = {}
        calls = [threading.Thread(target=lambda t=t: results.__setitem__(t, pool.secure_execute(wait_for_go, t)))
                 for t in ("a", "b", "c")]
        for c in calls:
            c.start()
        # While the calls wait, each is a sandbox its node's server lists: let it go from there.
        ran_on = {}

        def find_and_release():
            for sid, (node, client) in pool_sandboxes(fleet, pool).items():
                for tag in ("a", "b", "c"):
                    if tag not in ran_on and file_in(client, sid, f"/tmp/started-{tag}") == b"1":
                        ran_on[tag] = node
                        client.sandbox(sid).files.write(f"/tmp/go-{tag}", b"")
            return len(ran_on) == 3

        wait_for("every call to be seen on a daemon", find_and_release, timeout=60)
        for c in calls:
            c.join(60)
        assert {t: (r.status, r.result) for t, r in results.items()} == {
            t: ("ok", {"tag": t, "sum": 45, "cwd": "/tmp"}) for t in ("a", "b", "c")}, results
        # Three actors pinned round robin: the three calls ran on the three nodes.
        assert sorted(ran_on.values()) == sorted(n["node_id"] for n in nodes), ran_on


class NotPlainData:
    pass


def raise_value_error():
    raise ValueError("bad input")


def crash():
    import os

    os._exit(7)


def not_plain():
    return NotPlainData()


def killed():
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def environment(name):
    import os

    return os.environ.get(name)


def spawn_and_hang(token):
    import subprocess
    import time

    subprocess.Popen(["sleep", token], start_new_session=True)
    with open(f"/tmp/started-{token}", "w") as f:
        f.write("1")
    time.sleep(600)


def sleeping(token):
    """Host processes whose command line holds ``token``."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if token.encode() in f.read() and alive(int(pid)):
                    found.append(int(pid))
        except OSError:
            continue
    return found


def dead(actor):
    try:
        ray.get(actor.wait_ready.remote(), timeout=10)
    except ray.exceptions.RayActorError:
        return True
    return False


def test_a_fleet_pool_returns_errors_crashes_and_timeouts_and_leaves_nothing_behind(routed):
    import random

    from lockbox.ray import RaySandboxPool

    fleet, _, _ = routed
    pool = RaySandboxPool(2, fleet="lockbox-test", timeout=3)
    try:
        err = pool.secure_execute(raise_value_error)
        assert err.status == "error" and err.error.endswith("ValueError: bad input"), err
        assert "raise_value_error" in err.traceback
        crashed = pool.secure_execute(crash)
        assert (crashed.status, crashed.exit_code) == ("crashed", 7), crashed
        signalled = pool.secure_execute(killed)
        assert (signalled.status, signalled.signal) == ("crashed", 9), signalled
        # A result is untrusted data: a class of its own is refused, as with the local pool.
        refused = pool.secure_execute(not_plain)
        assert refused.status == "error" and "not plain data" in refused.error, refused

        # A call past its timeout: its sandbox is deleted before the answer comes, so the
        # process it started in the background is gone too.
        token = f"{600 + random.random():.6f}"
        got = {}
        t0 = time.monotonic()
        call = threading.Thread(target=lambda: got.setdefault("r", pool.secure_execute(spawn_and_hang, token)))
        call.start()
        ran_in = wait_for("the hanging call's sandbox", lambda: [
            (sid, client) for sid, (_, client) in pool_sandboxes(fleet, pool).items()
            if file_in(client, sid, f"/tmp/started-{token}") == b"1"], timeout=30)
        assert sleeping(token)
        call.join(60)
        assert got["r"].status == "timeout" and time.monotonic() - t0 < 30, got
        sid, client = ran_in[0]
        assert sid not in {s["id"] for s in client.list(state="running")}
        assert not sleeping(token)
        assert pool.secure_execute(sum, [2, 3]).unwrap() == 5  # the actor goes on
        pool.wait_ready()
        assert len(pool_sandboxes(fleet, pool)) == 2  # a warm sandbox per actor
        # An actor that dies cannot delete its sandbox: close finds it on its daemon.
        victim = pool._idle.get()
        ray.kill(victim, no_restart=True)
        wait_for("the killed actor to be dead", lambda: dead(victim), timeout=30)
        pool._idle.put(victim)
    finally:
        pool.close()
    # Closed: no sandbox of the pool left on any daemon.
    assert not pool_sandboxes(fleet, pool)


def test_a_fleet_pools_policy_becomes_the_servers_sandbox(routed):
    import lockbox
    from lockbox.ray import RaySandboxPool

    fleet, _, _ = routed
    policy = lockbox.Sandbox(env={"TASK": "t-7"}, max_memory="512M")
    with RaySandboxPool(1, fleet=fleet, policy=policy, timeout=30) as pool:
        assert pool.secure_execute(environment, "TASK").unwrap() == "t-7"
        pool.wait_ready()
        boxes = pool_sandboxes(fleet, pool)
        assert boxes and all(client.sandbox(sid).info["policy"]["max_memory_bytes"] == 512 << 20
                             for sid, (_, client) in boxes.items())
    with pytest.raises(lockbox.errors.UsageError):
        RaySandboxPool(1, fleet=fleet, policy=lockbox.Sandbox(max_cpu_time=5))


def test_a_fleet_pool_goes_on_in_a_restarted_daemon(routed):
    from lockbox.errors import ServerError
    from lockbox.ray import RaySandboxPool

    fleet, _, _ = routed
    with RaySandboxPool(1, fleet=fleet, timeout=30) as pool:
        pool.wait_ready()  # a warm sandbox on the first node's server
        before = next(n for n in fleet.nodes() if n["node_id"] == pool._nodes[0])
        os.kill(before["pid"], signal.SIGKILL)
        wait_for("the node's server to come back", lambda: [
            n for n in fleet.nodes() if n["node_id"] == before["node_id"] and n["state"] == "up"
            and n["pid"] != before["pid"]])
        # The warm sandbox went with the old server; the call runs in the new one.
        assert pool.secure_execute(sum, [4, 5]).unwrap() == 9
        assert pool_sandboxes(fleet, pool)
    assert not pool_sandboxes(fleet, pool)
    # The router learns the new server's address from the fleet's listing and its probes:
    # the next tests start once it places creates on that node again.
    client = client_for(routed)

    def placed():
        try:
            box = client.create(placement={"node": before["node_id"]})
        except ServerError:
            return None
        box.delete()
        return True

    wait_for("the router to reach the restarted server", placed, timeout=60)


def test_a_fleet_pools_actors_move_to_a_node_that_joins_and_off_a_node_that_leaves(routed, cluster):
    from lockbox.ray import RaySandboxPool

    c, _ = cluster
    fleet, nodes, _ = routed
    with RaySandboxPool(4, fleet=fleet, timeout=60) as pool:
        pool.wait_ready()
        held = sorted(pool._node_of.values())
        assert sorted(set(held)) == sorted(n["node_id"] for n in nodes), held  # 2, 1, 1
        extra = c.add_node(num_cpus=1)
        try:
            wait_for("the joined node to be up in the fleet", lambda: [
                n for n in fleet.nodes() if n["node_id"] == extra.node_id and n["state"] == "up"])

            def spread_to(node):
                assert pool.secure_execute(sum, [1, 2]).unwrap() == 3
                return node in pool._node_of.values()

            # Calls go on while the pool looks at the fleet (every 2 s at most).
            wait_for("an actor to move to the joined node", lambda: spread_to(extra.node_id), timeout=60)
            assert sorted(set(pool._node_of.values())) == sorted([*(n["node_id"] for n in nodes), extra.node_id])
            on_extra = [sid for sid, (node, _) in pool_sandboxes(fleet, pool).items() if node == extra.node_id]
            assert on_extra, "the moved actor's warm sandbox is on the joined node's server"
        finally:
            c.remove_node(extra)
        wait_for("the removed node to be listed lost", lambda: [
            n for n in fleet.nodes() if n["node_id"] == extra.node_id and n["state"] == "lost"])

        def moved_off():
            # A call may land on the actor of the lost node (crashed, or a timeout): the pool
            # replaces it on an up node; the calls after it run.
            pool.secure_execute(sum, [1, 2])
            return extra.node_id not in pool._node_of.values()

        wait_for("the lost node's actor to move", moved_off, timeout=120)
        results = [pool.secure_execute(sum, [i, 1]).unwrap() for i in range(8)]
        assert results == [i + 1 for i in range(8)]
        assert sorted(set(pool._node_of.values())) == sorted(n["node_id"] for n in nodes)
    assert not pool_sandboxes(fleet, pool)


def test_a_fleet_pool_needs_an_up_fleet(routed):
    from lockbox.errors import UsageError
    from lockbox.ray import RaySandboxPool

    with pytest.raises(UsageError):
        RaySandboxPool(1, fleet=42)
    with pytest.raises(ValueError):  # no controller in that namespace
        RaySandboxPool(1, fleet="no-such-fleet")


def e2b_through(monkeypatch, r):
    """The E2B SDK pointed at the router ``r``."""
    try:
        from e2b import Sandbox
    except ImportError:
        need(False, "the e2b SDK (pip install e2b==2.63.0)")
    for k in ("E2B_DOMAIN", "E2B_ACCESS_TOKEN", "E2B_DEBUG"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("E2B_API_URL", r["url"])
    monkeypatch.setenv("E2B_SANDBOX_URL", r["url"])
    monkeypatch.setenv("E2B_API_KEY", r["token"])
    return Sandbox


def answer_of(box):
    """``None`` if a call to ``box`` works, else its ``ServerError``."""
    from lockbox.errors import ServerError

    try:
        box.exec("true")
    except ServerError as e:
        return e
    return None


def test_a_node_that_comes_back_routes_what_it_holds_and_answers_what_it_lost(routed, monkeypatch, tmp_path):
    """Issue 31: a node's server that stops answering, then answers again, is routed to as
    before; one that restarted (on the same state directory) keeps its snapshots and paused
    E2B sandboxes, and the sandboxes it came back without are answered and listed lost, with
    why, until deleted."""
    fleet, _, r = routed
    client = client_for(routed)
    Sandbox = e2b_through(monkeypatch, r)
    paused = Sandbox.create(metadata={"via": "comeback"}, timeout=600)
    made = []
    try:
        paused.files.write("/tmp/kept.txt", "kept across the restart")
        target = node_of(client.list(), paused.sandbox_id)
        assert paused.pause()
        work = tmp_path / "work"
        work.mkdir()
        box = client.create(placement={"node": target}, workdir=str(work))
        made.append(box)
        box.files.write("/tmp/f.txt", b"before")
        snap = box.snapshot(include_tmp=True)
        node = next(n for n in fleet.nodes() if n["node_id"] == target)

        # The node's server stops answering (SIGSTOP), then answers again.
        os.kill(node["pid"], signal.SIGSTOP)
        try:
            err = wait_for("calls to the frozen node to be refused", lambda: answer_of(box), timeout=30)
            assert (err.status, err.code, err.details["node"]) == (503, "NODE_UNREACHABLE", target), err
        finally:
            os.kill(node["pid"], signal.SIGCONT)
        wait_for("the node's sandbox to be routed to again", lambda: answer_of(box) is None, timeout=30)
        assert box.files.read("/tmp/f.txt") == b"before"
        assert {s["id"]: s["state"] for s in client.list()}[box.id] == "running"

        # Its server killed: Ray starts another on the same state directory, which holds the
        # snapshot and the paused E2B sandbox, not the sandbox that ran.
        os.kill(node["pid"], signal.SIGKILL)
        err = wait_for("the sandbox the node came back without to be answered lost", lambda: (
            lambda e: e if e is not None and "came back without it" in e.details.get("reason", "") else None)(
                answer_of(box)), timeout=90)
        back = time.monotonic()
        assert (err.status, err.code, err.details["node"]) == (410, "SANDBOX_LOST", target), err
        assert "its server restarted" in err.details["reason"]
        listed = {s["id"]: s for s in client.list()}
        assert (listed[box.id]["state"], listed[box.id]["node"]) == ("lost", target), listed[box.id]
        assert listed[box.id]["reason"] == err.details["reason"]
        forked = client.fork(snap)
        made.extend(forked)
        assert forked[0].files.read("/tmp/f.txt") == b"before"
        assert node_of(client.list(), forked[0].id) == target
        # Deleting it forgets the router's record: what remains is the node's own (its new
        # server lists its predecessor's sandboxes lost, as without a router).
        assert box.delete()["state"] == "lost"
        made.remove(box)
        assert not [s for s in client.list() if s["id"] == box.id and "came back" in (s.get("reason") or "")]
        # The paused E2B sandbox outlived the server and resumes under its id (a lockbox
        # sandbox of another id serves it), and stays routed to after the router's sweeps of
        # what the node runs (two, 10 s apart: not a measurement).
        resumed = Sandbox.connect(paused.sandbox_id)
        assert resumed.files.read("/tmp/kept.txt") == "kept across the restart"
        time.sleep(max(0.0, 22 - (time.monotonic() - back)))
        assert resumed.commands.run("echo resumed").stdout == "resumed\n"
    finally:
        for b in made:
            b.delete()
        paused.kill()


def test_a_fork_of_a_snapshot_taken_on_one_node_runs_on_another(routed, tmp_path):
    """Issue 31 item 4: a snapshot taken on node A forks on node B (a placement hint): the
    router copies it there first, as an OCI artifact B checks against its digest, and B
    forks from its own copy, which the next forks there use again. A create from the
    snapshot and a restore to it on other nodes copy it the same way."""
    fleet, nodes, r = routed
    client = client_for(routed)
    a, b, c = (n["node_id"] for n in nodes)
    auth = {"Authorization": f"Bearer {r['token']}"}
    wd = tmp_path / "work"
    wd.mkdir()
    (wd / "base.txt").write_text("from the workdir\n")
    (wd / "gone.txt").write_text("deleted in the sandbox\n")
    # Their branches go when they are deleted: a kept branch would keep using the snapshot.
    box = client.create(workdir=str(wd), placement={"node": a}, on_exit="abort")
    made = []
    try:
        done = box.exec("echo made on A > made.txt && mkdir -p deep/er && echo y > deep/er/y && rm gone.txt"
                        " && echo kept > /tmp/kept && cd deep && export FROM=A")
        assert done.exit_code == 0, done
        snap = box.snapshot("portable", include_tmp=True)
        sid = snap["id"]
        assert {s["node"] for s in client.snapshots() if s["id"] == sid} == {a}
        check = (f"cat {wd}/made.txt {wd}/deep/er/y {wd}/base.txt; test -e {wd}/gone.txt || echo no gone.txt;"
                 " cat /tmp/kept; pwd; echo $FROM")
        expected = f"made on A\ny\nfrom the workdir\nno gone.txt\nkept\n{wd}/deep\nA\n"

        def fork_on(node):
            status, hs, reply = http_call(r["url"] + f"/v1/snapshots/{sid}/fork", "POST",
                                          {"count": 1, "placement": {"node": node[:12]}}, auth)
            assert status == 201, reply
            made.extend(client.sandbox(s["id"]) for s in reply["sandboxes"])
            return made[-1], hs.get("Lockbox-Snapshot-Copy")

        # The first fork on B copies the snapshot there; B then has it under the same id.
        fork, copy = fork_on(b)
        assert copy == "copied"
        assert node_of(client.list(), fork.id) == b
        out = fork.exec(check)
        assert (out.exit_code, out.stdout) == (0, expected), out
        on_b = fleet.client(b).snapshot(sid)
        assert (on_b["id"], on_b["name"], on_b["workdir"]) == (sid, "portable", str(wd))
        # The next ones use B's copy: nothing moves again.
        fork, copy = fork_on(b)
        assert copy == "cached" and fork.exec(check).stdout == expected
        forks = client.fork(snap, placement={"node": b[:12]})
        made.extend(forks)
        assert node_of(client.list(), forks[0].id) == b
        # Without a hint a fork stays on the snapshot's own node.
        status, hs, reply = http_call(r["url"] + f"/v1/snapshots/{sid}/fork", "POST", {"count": 1}, auth)
        assert status == 201 and hs.get("Lockbox-Snapshot-Copy") == "home", reply
        made.append(client.sandbox(reply["sandboxes"][0]["id"]))
        assert node_of(client.list(), made[-1].id) == a

        # A create from the snapshot on C, and a restore of a sandbox of C to it.
        on_c = client.create(from_snapshot=snap, placement={"node": c[:12]}, on_exit="abort")
        made.append(on_c)
        assert node_of(client.list(), on_c.id) == c and on_c.exec(check).stdout == expected
        other = client.create(workdir=str(wd), placement={"node": c}, on_exit="abort")
        made.append(other)
        assert other.exec("echo changed > made.txt").exit_code == 0
        other.restore(snap)
        assert other.exec(f"cat {wd}/made.txt").stdout == "made on A\n"
        assert {s["node"] for s in client.snapshots() if s["id"] == sid} == {a, b, c}

        # A bad hint is refused, and an unknown snapshot is not found.
        status, _, reply = http_call(r["url"] + f"/v1/snapshots/{sid}/fork", "POST",
                                     {"placement": {"rack": "a"}}, auth)
        assert (status, reply["code"], reply["details"]["field"]) == (400, "INVALID_REQUEST", "placement.rack")
        status, _, reply = http_call(r["url"] + "/v1/snapshots/s-none/fork", "POST",
                                     {"placement": {"node": b}}, auth)
        assert (status, reply["code"]) == (404, "SNAPSHOT_NOT_FOUND"), reply
    finally:
        for m in made:
            m.delete()
        box.delete()
    # Deleted through the router: its copies go too.
    client.delete_snapshot(sid)
    for n in (a, b, c):
        assert sid not in {s["id"] for s in fleet.client(n).snapshots()}, n


# Last: it removes a node of the cluster.
def test_a_lost_nodes_sandboxes_answer_a_clear_error_and_are_listed_lost(routed, cluster, tmp_path):
    import ray

    from lockbox.errors import ServerError

    c, _ = cluster
    fleet, nodes, _ = routed
    client = client_for(routed)
    controller_node = ray.get(fleet._controller.where.remote(), timeout=30)
    victim = next(n for n in c.worker_nodes if n.node_id != controller_node)
    boxes = [client.create(placement={"node": victim.node_id}) for _ in range(2)]
    # Two snapshots taken on the node about to go; one of them copied to another node.
    wd = tmp_path / "work"
    wd.mkdir()
    source = client.create(workdir=str(wd), placement={"node": victim.node_id})
    assert source.exec("echo survives > kept.txt").exit_code == 0
    copied, alone = source.snapshot("copied"), source.snapshot("alone")
    keeper = next(n["node_id"] for n in nodes if n["node_id"] not in (victim.node_id, controller_node))
    client.fork(copied, placement={"node": keeper})[0].delete()
    survivors = [client.create() for _ in range(2)]
    survivors = [b for b in survivors if node_of(client.list(), b.id) != victim.node_id]
    # A call in flight when the node goes: it ends with an error, it does not hang.
    in_flight = {}

    def long_call():
        try:
            in_flight["result"] = boxes[1].exec("sleep 600")
        except ServerError as e:
            in_flight["error"] = e

    caller = threading.Thread(target=long_call, daemon=True)
    caller.start()
    time.sleep(1)  # let the call reach the node (not a measurement)
    c.remove_node(victim, allow_graceful=False)

    def refused():
        try:
            boxes[0].exec("true")
        except ServerError as e:
            return e
        return None

    # A bound on how soon, not a timing measurement: every call answers, none hangs.
    err = wait_for("calls to the lost node's sandbox to be refused", refused, timeout=10)
    assert err.status in (410, 503) and err.code in ("SANDBOX_LOST", "NODE_UNREACHABLE"), err
    assert err.details["node"] == victim.node_id and err.details["reason"]
    caller.join(10)
    assert not caller.is_alive() and "error" in in_flight, in_flight
    assert in_flight["error"].status in (503, 410, 0), in_flight
    lost = wait_for("the lost node's sandboxes to be listed lost", lambda: [
        s for s in client.list() if s["id"] in {b.id for b in boxes} and s["state"] == "lost"], timeout=10)
    assert len(lost) == 2 and all(s["node"] == victim.node_id and s["reason"] for s in lost), lost
    # Once Ray lists the node lost (until then it might come back with it: 503, or 410
    # while its daemon looks to be restarting), deleting one of its sandboxes forgets it.
    def delete_lost():
        try:
            return boxes[0].delete()
        except ServerError as e:
            assert (e.status, e.code) in ((503, "NODE_UNREACHABLE"), (410, "SANDBOX_LOST")), e
            return None

    assert wait_for("a lost node's sandbox to be deleted", delete_lost, timeout=90)["state"] == "lost"
    listed = {s["id"]: s["state"] for s in client.list()}
    assert boxes[0].id not in listed and listed[boxes[1].id] == "lost", listed
    with pytest.raises(ServerError) as e:
        boxes[0].exec("true")
    assert (e.value.status, e.value.code) == (404, "SANDBOX_NOT_FOUND")
    # The others keep working, and creates go elsewhere.
    for b in survivors:
        assert b.exec("true").exit_code == 0
    fresh = [client.create() for _ in range(3)]
    try:
        listing = client.list()
        assert victim.node_id not in {node_of(listing, b.id) for b in fresh}
        # A snapshot of the lost node forks from its copy; one without a copy is lost with it.
        fresh += client.fork(copied)
        assert node_of(client.list(), fresh[-1].id) == keeper
        assert fresh[-1].exec(f"cat {wd}/kept.txt").stdout == "survives\n"
        with pytest.raises(ServerError) as e:
            client.fork(alone)
        assert (e.value.status, e.value.code) in ((410, "SNAPSHOT_LOST"), (503, "NODE_UNREACHABLE")), e.value
        assert e.value.details["node"] == victim.node_id and e.value.details["reason"], e.value.details
    finally:
        for b in fresh + survivors:
            b.delete()
