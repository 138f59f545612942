"""A lockbox fleet on Ray: one ``lockbox serve`` per Ray node, started, watched and restarted
by Ray, and routers that serve one API for all of them (issue 31: the node daemons, the
router, placement, and the routing part of failures).

::

    import ray
    import lockbox, lockbox.fleet

    ray.init(address="auto")
    fleet = lockbox.fleet.up()                 # a daemon on every node, now and later
    for node in fleet.nodes():                 # {"node_id", "state", "url", "token", ...}
        print(node["node_id"][:8], node["state"], node["url"])
    r = fleet.router()                         # {"name", "url", "ports_listen", "token", "pid"}: a router actor
    client = lockbox.Client(r["url"], r["token"])   # the unchanged client, for every node
    box = client.create()                      # placed by power of K choices
    print([(s["id"], s["node"]) for s in client.list()])
    lockbox.fleet.down()                       # stops the routers, every daemon and the controller

or from a shell: ``python -m lockbox.fleet up --ray ADDRESS`` (``status``, ``down``, and
``router --listen HOST:PORT`` to serve the fleet's API from this process).

How it works:

- A **controller** (a detached Ray actor named ``lockbox-fleet`` in the fleet's namespace)
  looks at ``ray.nodes()`` every second. Each live node without a daemon gets one: a detached
  actor pinned to that node (``NodeAffinitySchedulingStrategy``, not soft) that starts
  ``lockbox serve`` there with its own state directory (``STATE_ROOT/NODE_ID``, default under
  lockbox's state directory on that node) and a token of its own, on the node's address and a
  free port. Nodes that join the cluster later join the fleet the same way.
- A daemon whose ``lockbox serve`` exits ends its actor's process, and Ray restarts the actor
  (``max_restarts=-1``), which starts a new ``lockbox serve`` on the same state directory (its
  sandboxes are gone: lockbox's runtime stops every sandbox when it stops; snapshots and
  branches stay). ``lockbox serve`` gets SIGTERM when its actor's process dies, so no server
  outlives its daemon.
- A node that leaves the cluster (its raylet gone) is listed ``lost`` with Ray's reason; its
  sandboxes went with it.
- A **router** (:func:`router`, ``lockbox/_router/``) serves lockbox's HTTP API, E2B's, MCP
  and the console for the whole fleet with the fleet's own token (:meth:`Fleet.token`):
  each call goes to the node that holds its sandbox, listings merge every node's (each item
  with its ``node``), creates go to a node chosen by power of K choices over the nodes' load,
  and placements are kept in Ray's GCS key-value store, so routers can run side by side and
  restart without losing any. Calls to a lost node's sandboxes are answered at once (503
  ``NODE_UNREACHABLE`` / 410 ``SANDBOX_LOST``), and listings show them ``lost``.

Each node's daemon is listed with its URL and token (secrets: the fleet's namespace is only as
private as the Ray cluster). Moving snapshots between nodes is the next part of issue 31
(docs/fleet.md).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from .client import Client

__all__ = ["Fleet", "down", "router", "up"]

CONTROLLER = "lockbox-fleet"
DEFAULT_NAMESPACE = "lockbox"

_ray: Any
try:
    _ray = importlib.import_module("ray")
except ImportError:
    _ray = None


def _need_ray() -> Any:
    if _ray is None:
        from .errors import UnsupportedError

        raise UnsupportedError("lockbox.fleet needs Ray (pip install ray)", code="UNSUPPORTED")
    return _ray


def _max_sandboxes(serve_args: list[str]) -> int:
    """The ``--max-sandboxes`` among ``lockbox serve``'s flags (its default, 64, if absent)."""
    for i, arg in enumerate(serve_args):
        value = arg.split("=", 1)[1] if arg.startswith("--max-sandboxes=") else (
            serve_args[i + 1] if arg == "--max-sandboxes" and i + 1 < len(serve_args) else None)
        if value is not None and value.isdigit():
            return int(value)
    return 64


def _kv_namespace(namespace: str) -> bytes:
    return f"lockbox-fleet:{namespace}".encode()


def _fleet_token(namespace: str) -> str:
    """The fleet's own token (what clients of its routers send), made once and kept in Ray's
    GCS key-value store."""
    from ray.experimental import internal_kv

    _need_ray()
    ns = _kv_namespace(namespace)
    internal_kv._internal_kv_put(b"token", secrets.token_hex(32).encode(), False, namespace=ns)
    return str(internal_kv._internal_kv_get(b"token", namespace=ns).decode())


def _die_with_parent() -> None:
    # In the child before exec: SIGTERM when the daemon's thread that started it goes, which
    # lives as long as the daemon's process (prctl(PR_SET_PDEATHSIG)).
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM, 0, 0, 0)


def _node_serve_args(serve_args: list[str], resources: dict[str, Any]) -> list[str]:
    """A node's ``lockbox serve`` flags: ``serve_args``, plus ``--max-sandboxes N`` when the
    node has a ``lockbox`` Ray resource of N and the flags set none. Ray takes a node's custom
    resources only when the node starts (``ray start --resources '{"lockbox": 200}'``), so
    lockbox cannot advertise its capacity to Ray; it takes Ray's instead, and the number a
    Ray job schedules against (``resources={"lockbox": 1}``) is the node's capacity in the
    fleet."""
    if any(a == "--max-sandboxes" or a.startswith("--max-sandboxes=") for a in serve_args):
        return serve_args
    try:
        capacity = int(resources.get("lockbox", 0))
    except (TypeError, ValueError):
        return serve_args
    return [*serve_args, "--max-sandboxes", str(capacity)] if capacity >= 1 else serve_args


class _NodeDaemon:
    """One node's ``lockbox serve`` (a Ray actor pinned to the node)."""

    def __init__(self, node_id: str, state_root: str | None, serve_args: list[str]) -> None:
        ray = _need_ray()
        from ._sdk import default_state_dir

        self.node_id = node_id
        root = state_root or os.path.join(default_state_dir(), "fleet")
        self.state_dir = os.path.join(root, node_id)
        os.makedirs(self.state_dir, exist_ok=True)
        self.address = ray.util.get_node_ip_address()
        self.started = time.time()
        self._ready = threading.Event()
        self._error: str | None = None
        self.info_: dict[str, Any] = {}
        self._serve_args = serve_args
        threading.Thread(target=self._run, name="lockbox-serve", daemon=True).start()
        if not self._ready.wait(120) or self._error:
            raise RuntimeError(f"lockbox serve on node {node_id} did not start: {self._error or 'no answer in 120 s'}")

    def _run(self) -> None:
        cmd = [sys.executable, "-m", "lockbox._cli", "serve", "--listen", f"{self.address}:0",
               "--state-dir", self.state_dir, "--print-token", *self._serve_args]
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                    preexec_fn=_die_with_parent)
            assert proc.stdout is not None
            line = json.loads(proc.stdout.readline() or "{}")
            self.info_ = {"node_id": self.node_id, "url": f"http://{line['listen']}", "token": line["token"],
                          "pid": proc.pid, "state_dir": self.state_dir, "started": self.started,
                          "max_sandboxes": _max_sandboxes(self._serve_args)}
            if line.get("ports_listen"):  # absent with --ports-listen off
                self.info_.update(ports_url=f"http://{line['ports_listen']}", ports_domain=line.get("ports_domain"))
        except (OSError, ValueError, KeyError) as e:
            self._error = f"{type(e).__name__}: {e}"
            self._ready.set()
            return
        self._ready.set()
        proc.wait()
        # The server is gone: end this process, and Ray restarts the actor (a new server).
        os._exit(1)

    def info(self) -> dict[str, Any]:
        return self.info_

    def stop(self) -> None:
        pid = self.info_.get("pid")
        if pid:
            os.kill(pid, signal.SIGTERM)


class _Controller:
    """Starts a daemon on every live node and lists the fleet (a detached Ray actor)."""

    def __init__(self, namespace: str, state_root: str | None, serve_args: list[str]) -> None:
        self.namespace = namespace
        self.state_root = state_root
        self.serve_args = serve_args
        self.daemons: dict[str, Any] = {}
        self.listed: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.stopping = False
        threading.Thread(target=self._loop, name="lockbox-fleet", daemon=True).start()

    def _loop(self) -> None:
        ray = _need_ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        daemon_cls = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(_NodeDaemon)
        while not self.stopping:
            for node in ray.nodes():
                node_id = node["NodeID"]
                if not node["Alive"]:
                    if node_id in self.daemons or node_id in self.listed:
                        with self.lock:
                            entry = self.listed.setdefault(node_id, {"node_id": node_id})
                            entry.update(state="lost", reason=node.get("DeathReasonMessage") or "the node left the cluster")
                            self.daemons.pop(node_id, None)
                    continue
                if node_id not in self.daemons:
                    self.daemons[node_id] = daemon_cls.options(
                        name=f"lockbox-node-{node_id}", namespace=self.namespace, lifetime="detached",
                        get_if_exists=True,
                        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
                    ).remote(node_id, self.state_root,
                             _node_serve_args(self.serve_args, node.get("Resources") or {}))
                labels = {k: str(v) for k, v in (node.get("Labels") or {}).items() if not k.startswith("ray.io/")}
                try:
                    info = ray.get(self.daemons[node_id].info.remote(), timeout=5)
                    entry = {**info, "state": "up", "labels": labels}
                except Exception as e:  # a starting or restarting daemon
                    entry = {"node_id": node_id, "state": "starting", "reason": f"{type(e).__name__}",
                             "labels": labels}
                with self.lock:
                    self.listed[node_id] = entry
            time.sleep(1.0)

    def where(self) -> str:
        """The Ray node this controller runs on."""
        return str(_need_ray().get_runtime_context().get_node_id())

    def nodes(self) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(v) for v in self.listed.values()]

    def stop(self) -> None:
        ray = _need_ray()
        self.stopping = True
        for daemon in list(self.daemons.values()):
            try:
                ray.get(daemon.stop.remote(), timeout=10)
            except Exception:  # it is going anyway
                pass
            ray.kill(daemon, no_restart=True)
        self.daemons.clear()


ROUTER = "lockbox-fleet-router"


def _run_router(namespace: str, host: str, port: int, started: Any, ports: tuple[str, int] | None = None,
                ports_domain: str = "localhost", e2b_domain: str | None = None) -> None:
    """Runs a router (in this thread, until the process ends); ``started(host, port,
    ports_address)`` is called once it listens. ``ports``: where it serves the sandboxes'
    exposed ports on their own origins (``None``: nowhere). ``e2b_domain``: E2B's sandbox
    host form (``{port}-{sandboxID}.{e2b_domain}``)."""
    from ._router import RayStore

    ray = _need_ray()
    controller = ray.get_actor(CONTROLLER, namespace=namespace)

    def nodes() -> list[dict[str, Any]]:
        return list(ray.get(controller.nodes.remote(), timeout=10))

    _serve_router(nodes, _fleet_token(namespace), RayStore(namespace), host, port, started, ports, ports_domain,
                  e2b_domain)


def _serve_router(nodes: Any, token: str, store: Any, host: str, port: int, started: Any,
                  ports: tuple[str, int] | None, ports_domain: str, e2b_domain: str | None) -> None:
    """Serves a router over ``nodes`` (a listing function) until the process ends."""
    import asyncio

    from ._router import Router

    async def main() -> None:
        router = Router(nodes, token, store, ports_domain=ports_domain, e2b_domain=e2b_domain)
        started(*(await router.start(host, port, ports=ports)), router.ports_address)
        await asyncio.Event().wait()

    asyncio.run(main())


class _RouterActor:
    """A router in a detached Ray actor (restarted by Ray, on a new port when it was 0)."""

    def __init__(self, namespace: str, host: str | None, port: int, ports_listen: str | None,
                 ports_domain: str, e2b_domain: str | None = None) -> None:
        ray = _need_ray()
        self.address: tuple[str, int] | None = None
        self.ports_address: tuple[str, int] | None = None
        ready = threading.Event()

        def started(h: str, p: int, ports_address: tuple[str, int] | None) -> None:
            self.address, self.ports_address = (h, p), ports_address
            ready.set()

        bind = host or ray.util.get_node_ip_address()
        ports = _ports_listen(ports_listen, bind)
        threading.Thread(target=_run_router, args=(namespace, bind, port, started, ports, ports_domain, e2b_domain),
                         name="lockbox-fleet-router", daemon=True).start()
        if not ready.wait(60):
            raise RuntimeError(f"the fleet's router did not start listening on {bind}:{port} in 60 s")

    def info(self) -> dict[str, Any]:
        assert self.address is not None
        info: dict[str, Any] = {"url": f"http://{self.address[0]}:{self.address[1]}", "pid": os.getpid()}
        if self.ports_address is not None:
            info["ports_listen"] = f"{self.ports_address[0]}:{self.ports_address[1]}"
        return info


def _host_port(text: str, what: str) -> tuple[str | None, int]:
    h, sep, p = text.rpartition(":")
    if not sep or not p.isdigit():
        raise ValueError(f"{what}: HOST:PORT, not {text!r}")
    return h.strip("[]") or None, int(p)


def _ports_listen(ports_listen: str | None, host: str) -> tuple[str, int] | None:
    """Where a router serves exposed ports: ``None`` (the router's host, a free port),
    ``"off"`` (nowhere) or ``HOST:PORT``."""
    if ports_listen == "off":
        return None
    if ports_listen is None:
        return host, 0
    h, p = _host_port(ports_listen, "ports_listen")
    return h or host, p


def router(listen: str | None = None, *, namespace: str = DEFAULT_NAMESPACE, name: str = ROUTER,
           node_id: str | None = None, ports_listen: str | None = None, ports_domain: str = "localhost",
           e2b_domain: str | None = None) -> dict[str, Any]:
    """Starts a router named ``name`` (if none runs) as a detached Ray actor serving the
    fleet's API on ``listen`` (``HOST:PORT``; default: its node's address and a free port).
    Returns ``{"name", "url", "token", "pid"}``: clients use ``url`` with the fleet's
    ``token`` as :class:`lockbox.Client` or E2B's SDK would use one ``lockbox serve``.
    Several routers (other names) may run side by side; they share the placements.
    ``node_id``: the Ray node it runs on (default: any). ``ports_listen`` (``HOST:PORT``,
    ``"off"``; default: the router's host, a free port) is where it serves the sandboxes'
    exposed ports on their own origins, ``{port}-{sandbox}.{ports_domain}:PORT`` (the
    ``origin`` and ``open_url`` of ``.../ports`` replies through it; ``ports_listen`` in
    the result). ``e2b_domain``: E2B's sandbox plane is also routed by its host form,
    ``{port}-{sandboxID}.{e2b_domain}`` (what the E2B SDK uses with ``E2B_DOMAIN`` and no
    ``E2B_SANDBOX_URL``), as ``lockbox serve --e2b-domain`` does. A router of this name that
    runs already is returned as it is (the other arguments then change nothing)."""
    ray = _need_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    host, port = _host_port(listen, "listen") if listen else (None, 0)
    if ports_listen not in (None, "off"):
        _host_port(ports_listen, "ports_listen")
    strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False) if node_id else "DEFAULT"
    actor = ray.remote(num_cpus=0, max_restarts=-1, max_concurrency=4)(_RouterActor).options(
        name=name, namespace=namespace, lifetime="detached", get_if_exists=True,
        scheduling_strategy=strategy).remote(namespace, host, port, ports_listen, ports_domain, e2b_domain)
    info = dict(ray.get(actor.info.remote(), timeout=90))
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(f"r/{name}".encode(), b"1", True, namespace=_kv_namespace(namespace))
    return {"name": name, **info, "token": _fleet_token(namespace)}


def _stop_routers(namespace: str) -> None:
    from ray.experimental import internal_kv

    ray = _need_ray()
    ns = _kv_namespace(namespace)
    for key in internal_kv._internal_kv_list(b"r/", namespace=ns):
        try:
            ray.kill(ray.get_actor(key.decode()[2:], namespace=namespace), no_restart=True)
        except ValueError:  # gone already
            pass
        internal_kv._internal_kv_del(key, namespace=ns)



class Fleet:
    """A handle on the fleet of a namespace (its controller)."""

    def __init__(self, namespace: str = DEFAULT_NAMESPACE) -> None:
        ray = _need_ray()
        self.namespace = namespace
        self._controller = ray.get_actor(CONTROLLER, namespace=namespace)

    def nodes(self) -> list[dict[str, Any]]:
        """Every node the fleet has seen: ``node_id``, ``state`` (``up``, ``starting``,
        ``lost``), and for an ``up`` one its ``url``, ``token``, ``pid``, ``state_dir``
        (and ``ports_url``, ``ports_domain``: its ports listener, unless
        ``--ports-listen off``); ``reason`` for the others."""
        return list(_need_ray().get(self._controller.nodes.remote(), timeout=30))

    def wait(self, count: int, timeout: float = 120.0) -> list[dict[str, Any]]:
        """Waits until ``count`` nodes are ``up``; returns them (``TimeoutError`` after
        ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while True:
            up_nodes = [n for n in self.nodes() if n["state"] == "up"]
            if len(up_nodes) >= count:
                return up_nodes
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(up_nodes)} of {count} fleet nodes up after {timeout} s: {self.nodes()}")
            time.sleep(0.2)

    def token(self) -> str:
        """The fleet's token: what clients of its routers send (``Authorization: Bearer``,
        E2B's ``E2B_API_KEY``)."""
        return _fleet_token(self.namespace)

    def router(self, listen: str | None = None, *, name: str = ROUTER, node_id: str | None = None,
               ports_listen: str | None = None, ports_domain: str = "localhost",
               e2b_domain: str | None = None) -> dict[str, Any]:
        """See :func:`lockbox.fleet.router`."""
        return router(listen, namespace=self.namespace, name=name, node_id=node_id, ports_listen=ports_listen,
                      ports_domain=ports_domain, e2b_domain=e2b_domain)

    def client(self, node_id: str) -> Client:
        """A :class:`lockbox.Client` of the node's ``lockbox serve``."""
        for n in self.nodes():
            if n["node_id"] == node_id and n["state"] == "up":
                return Client(n["url"], n["token"])
        raise KeyError(f"no fleet node {node_id} is up")


def up(address: str | None = None, *, namespace: str = DEFAULT_NAMESPACE, state_root: str | None = None,
       serve_args: list[str] | None = None) -> Fleet:
    """Starts the fleet's controller (if it is not running) in ``namespace`` of the Ray cluster
    at ``address`` (default: the connected one, else ``ray.init()``); it starts a daemon on
    every node. ``serve_args`` are more ``lockbox serve`` flags (e.g. ``["--max-sandboxes",
    "200"]``)."""
    ray = _need_ray()
    if not ray.is_initialized():
        ray.init(address=address, namespace=namespace, log_to_driver=False)
    controller = ray.remote(num_cpus=0, max_restarts=-1, max_concurrency=8)(_Controller)
    controller.options(name=CONTROLLER, namespace=namespace, lifetime="detached", get_if_exists=True).remote(
        namespace, state_root, list(serve_args or []))
    return Fleet(namespace)


def down(namespace: str = DEFAULT_NAMESPACE) -> None:
    """Stops every daemon of the fleet (their ``lockbox serve`` deletes its sandboxes) and the
    controller, and forgets where the sandboxes were."""
    ray = _need_ray()
    _stop_routers(namespace)
    try:
        controller = ray.get_actor(CONTROLLER, namespace=namespace)
    except ValueError:
        return
    ray.get(controller.stop.remote(), timeout=60)
    ray.kill(controller, no_restart=True)
    _forget_placements(namespace)


def _forget_placements(namespace: str) -> None:
    """Removes the routers' records of where each sandbox and snapshot is (``p/``, ``n/``,
    ``g/``, ``c/``): the sandboxes went with their servers, and a router of the next ``up``
    finds a snapshot again by asking every node. The scoped tokens minted through the routers
    (``t/``, ``k/``) go too: they lived in the servers' memory. The fleet's token and the
    console's sessions stay."""
    from ray.experimental import internal_kv

    ns = _kv_namespace(namespace)
    for prefix in (b"p/", b"n/", b"g/", b"c/", b"t/", b"k/"):
        for key in internal_kv._internal_kv_list(prefix, namespace=ns):
            internal_kv._internal_kv_del(key, namespace=ns)


def main(argv: list[str] | None = None) -> int:
    """``python -m lockbox.fleet up|status|down|router [--ray ADDRESS] [--namespace NS]``, or
    ``router --nodes-dns NAME:PORT --token-file FILE`` (no Ray: Kubernetes)."""
    p = argparse.ArgumentParser(prog="python -m lockbox.fleet", description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=["up", "status", "down", "router"],
                   help="router: serve the fleet's API on --listen, in this process, until stopped")
    p.add_argument("--ray", default="auto", help="the Ray cluster's address (default: auto)")
    p.add_argument("--namespace", default=DEFAULT_NAMESPACE)
    p.add_argument("--state-root", default=None, help="each node's state directories' parent")
    p.add_argument("--listen", default="127.0.0.1:7080", help="router: HOST:PORT (port 0: a free one)")
    p.add_argument("--print-token", action="store_true", help="router: also print the fleet's token")
    p.add_argument("--ports-listen", default=None,
                   help="router: HOST:PORT or off, where exposed ports are served on their own origins "
                        "(default: the --listen host, a free port)")
    p.add_argument("--ports-domain", default="localhost",
                   help="router: the exposed ports' host names are {port}-{sandbox}.DOMAIN (default: localhost)")
    p.add_argument("--e2b-domain", default=None,
                   help="router: also route E2B's sandbox plane by its host form {port}-{sandboxID}.DOMAIN "
                        "(E2B_DOMAIN without E2B_SANDBOX_URL), as lockbox serve --e2b-domain")
    k = p.add_argument_group("a router without Ray (Kubernetes: docs/fleet.md)")
    k.add_argument("--nodes-dns", metavar="NAME:PORT", default=None,
                   help="router: the nodes are every address NAME resolves to, each serving on PORT "
                        "(a headless Service: lockbox.lockbox.svc.cluster.local:7070); no Ray")
    k.add_argument("--token-file", default=None,
                   help="with --nodes-dns: the token clients of the router send (required)")
    k.add_argument("--node-token-file", default=None,
                   help="with --nodes-dns: the nodes' token (default: the --token-file's)")
    k.add_argument("--node-capacity", type=int, default=64,
                   help="with --nodes-dns: each node's --max-sandboxes (default: 64)")
    k.add_argument("--node-ports-port", type=int, default=None,
                   help="with --nodes-dns: the port of the nodes' --ports-listen (default: none; exposed ports "
                        "then go through the API's .../ports/{port}/ only)")
    k.add_argument("--node-ports-domain", default="localhost",
                   help="with --nodes-dns: the nodes' --ports-domain (default: localhost)")
    k.add_argument("--store", default=os.environ.get("LOCKBOX_FLEET_STORE"),
                   help="with --nodes-dns: postgres://USER[:PASSWORD]@HOST:PORT/DB, where routers keep the "
                        "placements they share (default: $LOCKBOX_FLEET_STORE, else this router's memory: "
                        "one router only)")
    a = p.parse_args(argv)
    if a.command == "router":
        host, sep, port = a.listen.rpartition(":")
        if not sep or not port.isdigit():
            p.error(f"--listen: HOST:PORT, not {a.listen!r}")
        try:
            ports = _ports_listen(a.ports_listen, host.strip("[]"))
        except ValueError as e:
            p.error(f"--{e}".replace("_", "-", 1))
        if a.nodes_dns is not None:
            return _dns_router(p, a, host.strip("[]"), int(port), ports)
    elif a.nodes_dns is not None:
        p.error("--nodes-dns: only with the router command")
    ray = _need_ray()
    ray.init(address=a.ray, namespace=a.namespace, log_to_driver=False)
    if a.command == "up":
        fleet = up(namespace=a.namespace, state_root=a.state_root)
        alive = sum(1 for n in ray.nodes() if n["Alive"])
        print(json.dumps(fleet.wait(alive), indent=1))
    elif a.command == "status":
        print(json.dumps(Fleet(a.namespace).nodes(), indent=1))
    elif a.command == "router":
        def started(h: str, port_: int, ports_address: tuple[str, int] | None) -> None:
            _print_listening(h, port_, ports_address, _fleet_token(a.namespace) if a.print_token else None)

        try:
            _run_router(a.namespace, host.strip("[]"), int(port), started, ports, a.ports_domain, a.e2b_domain)
        except KeyboardInterrupt:
            pass
    else:
        down(a.namespace)
    return 0


def _print_listening(host: str, port: int, ports_address: tuple[str, int] | None, token: str | None) -> None:
    line = {"listen": f"{host}:{port}"}
    if ports_address is not None:
        line["ports_listen"] = f"{ports_address[0]}:{ports_address[1]}"
    if token is not None:
        line["token"] = token
    print(json.dumps(line), flush=True)


def _read_token(p: argparse.ArgumentParser, option: str, path: str) -> str:
    try:
        with open(path) as f:
            token = f.read().strip()
    except OSError as e:
        p.error(f"{option} {path}: {e.strerror or e}")
    if len(token) < 16:
        p.error(f"{option} {path}: a token of at least 16 characters, not {len(token)}")
    return token


def _dns_router(p: argparse.ArgumentParser, a: argparse.Namespace, host: str, port: int,
                ports: tuple[str, int] | None) -> int:
    """``router --nodes-dns NAME:PORT``: a router whose nodes are what NAME resolves to."""
    from ._router import DnsNodes, PgStore, StoreUnavailable

    name, sep, node_port = a.nodes_dns.rpartition(":")
    if not sep or not name or not node_port.isdigit():
        p.error(f"--nodes-dns: NAME:PORT, not {a.nodes_dns!r}")
    if a.token_file is None:
        p.error("--nodes-dns needs --token-file (the token clients of the router send)")
    token = _read_token(p, "--token-file", a.token_file)
    node_token = _read_token(p, "--node-token-file", a.node_token_file) if a.node_token_file else token
    try:
        nodes = DnsNodes(name.strip("[]"), int(node_port), node_token, capacity=a.node_capacity,
                         ports_port=a.node_ports_port, ports_domain=a.node_ports_domain)
    except ValueError as e:
        p.error(f"--{e}".replace("_", "-", 1))
    store = None
    if a.store:
        if not a.store.startswith(("postgres://", "postgresql://")):
            p.error(f"--store: a postgres:// URL, not {a.store.split(':', 1)[0]}:...")
        try:
            store = PgStore(a.store, a.namespace)
        except (RuntimeError, StoreUnavailable) as e:
            print(f"lockbox fleet router: --store: {e}", file=sys.stderr, flush=True)
            return 1
    else:
        print("lockbox fleet router: placements kept in this router's memory (no --store): run one router only",
              file=sys.stderr, flush=True)

    def started(h: str, port_: int, ports_address: tuple[str, int] | None) -> None:
        _print_listening(h, port_, ports_address, token if a.print_token else None)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a pod's stop: exit at once, nothing to flush
    try:
        _serve_router(nodes, token, store, host, port, started, ports, a.ports_domain, a.e2b_domain)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
