"""The Ray backend of the function executor: each call runs on a Ray worker (an actor)
that runs it in a lockbox sandbox on its own node, so isolation does not depend on Ray.

::

    import ray
    from lockbox.ray import RaySandboxPool

    ray.init()
    pool = RaySandboxPool(4, timeout=10)          # 4 actors, reused across calls
    res = pool.secure_execute(score, program)     # an ExecutionResult, as with SandboxPool

    @sandbox_run(timeout=10, sandbox_type="ray")  # the decorator's Ray mode
    def score(program): ...

Each actor keeps a warm :class:`~lockbox.executor.SandboxPool` of ``per_actor`` sandboxed
interpreters. The timeout is enforced *inside* the actor, which kills the sandbox (every
process in it) and stays usable; the driver also waits at most ``timeout`` plus
``actor_grace`` seconds, and if an actor does not answer by then it is killed — and its
sandboxes die with it (they are tied to the actor's process) — and replaced. The call is
pickled in the driver (cloudpickle), so the actor never unpickles user code outside the
sandbox.

With a fleet (:mod:`lockbox.fleet`) up in the cluster, ``RaySandboxPool(..., fleet=True)``
(or ``fleet="NAMESPACE"``, or a :class:`~lockbox.fleet.Fleet`) pins each actor to a node
of the fleet, round robin, and runs its calls in *that node's* ``lockbox serve`` instead of
spawning sandboxes in the actor's process: the server's limits (``--max-sandboxes``...),
its token's ceiling and its listings apply to them, so one fleet holds a job's function
calls and its long-lived sandboxes. Each call gets a fresh sandbox of the server (the
actor keeps ``per_actor`` created ahead, labelled ``lockbox-pool``, each with the runner of
the local pool, ``lockbox._bootstrap``, already started as a process of the sandbox: the
payload goes to its stdin, the framed result to a file of the sandbox read once it ends)
and is deleted after the call; a call that times
out ends with its sandbox deleted, so nothing of it keeps running. ``close`` deletes every
sandbox of the pool on the daemons.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import os
import queue
import secrets
import shlex
import struct
import sys
import threading
import time
from typing import Any, Self

from .errors import ServerError, UnsupportedError, UsageError
from .executor import ExecutionResult, SandboxExecutor

__all__ = ["RaySandboxPool"]

# Imported by name: typed the same whether or not Ray is installed (it is optional).
_ray: Any
try:
    _ray = importlib.import_module("ray")
except ImportError:  # pragma: no cover - depends on the environment
    _ray = None


def _require_ray() -> Any:
    if _ray is None:
        raise UnsupportedError("the Ray backend needs Ray: pip install 'lockbox[ray]' (or ray)",
                               code="RAY_MISSING")
    return _ray


class _Worker:
    """The actor: a warm sandbox pool on the actor's node."""

    def __init__(self, kw: dict[str, Any], per_actor: int) -> None:
        from .executor import SandboxPool

        self.pool = SandboxPool(per_actor, **kw)

    def run(self, payload: bytes) -> ExecutionResult:
        return self.pool.execute_payload(payload)

    def wait_ready(self) -> bool:
        """Blocks until every interpreter of the actor's pool is started and ready."""
        self.pool.wait_ready()
        return True


def _create_fields(spec: Any) -> dict[str, Any]:
    """The ``POST /v1/sandboxes`` fields of an executor's sandbox policy (its JSON form, with
    the interpreter's directories added): what the server's sandbox needs to run the call."""
    import json

    policy = json.loads(spec.policy)
    fs, limits, env = policy["fs"], policy.get("limits", {}), policy.get("env", {})
    unsupported = [name for name, value in (("max_cpu_time", limits.get("cpu_time")), ("env_pass", env.get("pass")))
                   if value]
    if unsupported:
        raise UsageError(f"a fleet pool cannot pass {', '.join(unsupported)} to lockbox serve "
                         "(lockbox serve has no such field; set env instead of env_pass)", code="INVALID_POLICY")
    fields: dict[str, Any] = {
        "fs_readable": fs["read"], "fs_writable": fs["write"], "default_reads": fs.get("default_reads", True),
        "net": policy.get("net", "none"), "env": env.get("set") or None, "clean_env": env.get("clean") or None,
        "cwd": policy.get("cwd"), "hostname": policy.get("hostname"), "image": policy.get("image"),
        "max_memory": limits.get("memory"), "max_processes": limits.get("processes"),
        "max_open_files": limits.get("open_files"), "max_file_size": limits.get("file_size"),
        "max_inodes": limits.get("inodes"),
    }
    return {k: v for k, v in fields.items() if v is not None}


# How often (seconds) a fleet pool looks at most at the fleet's nodes, when it takes an actor
# for a call (RaySandboxPool._placed).
_LOOK_EVERY = 2.0

# Where the warm interpreter of a fleet sandbox writes its framed result (its descriptor 3):
# a file the actor reads once the interpreter has exited, so a result's size is bounded by
# max_result_bytes, not by a process log the server would have to reserve.
_RESULT = "/dev/shm/.lockbox-result"


class _FleetWorker:
    """The actor of a fleet pool, pinned to a node: runs each call in a fresh sandbox of that
    node's ``lockbox serve``, whose interpreter is already running (``per_actor`` sandboxes
    are created ahead, each with the runner started as a process waiting for its payload)."""

    def __init__(self, namespace: str, node_id: str, kw: dict[str, Any], per_actor: int, pool_id: str) -> None:
        from .executor import _Spec

        self.namespace = namespace
        self.node_id = node_id
        self.timeout: float | None = kw.get("timeout")
        self.max_result: int = kw.get("max_result_bytes", 64 << 20)
        self.trusted: bool = kw.get("trusted_results", False)
        spec = _Spec(sandbox=kw.get("policy"), python=kw.get("python"), pickler=kw.get("pickler"),
                     output=kw.get("output", "devnull"),
                     extra_reads=[os.path.abspath(p) for p in kw.get("extra_reads") or []])
        self.fields = _create_fields(spec) | {"labels": {"lockbox-pool": pool_id}}
        # The runner of the local pool; its result descriptor (3) is a file read after it ends.
        from ._bootstrap import SOURCE

        self.command = (f"exec {shlex.quote(spec.python)} -I -c {shlex.quote(SOURCE)} 3 {spec.pickler} "
                        f"{spec.output} 3>{_RESULT}")
        self.output = spec.output
        self.per_actor = max(1, per_actor)
        self._client: Any = None
        self._ready: queue.Queue[Any] = queue.Queue()
        self._closed = False
        # Creates and deletes happen off the call's path, one at a time.
        self._creator = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lockbox-fleet-create")
        self._reaper = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lockbox-fleet-delete")
        self._pending: list[concurrent.futures.Future[None]] = []
        for _ in range(self.per_actor):
            self._refill()

    def client(self, fresh: bool = False) -> Any:
        """The node's daemon (looked up again when asked: a restarted one has a new URL)."""
        if self._client is None or fresh:
            from .fleet import Fleet

            client = Fleet(self.namespace).client(self.node_id)
            # The call's own timeout is the actor's (it deletes the sandbox); the connection
            # waits a little longer.
            client.timeout = 7 * 86400.0 if self.timeout is None else self.timeout + 60.0
            self._client = client
        return self._client

    def _create(self) -> tuple[Any, Any]:
        """A new sandbox, and its interpreter started, waiting for a payload on stdin."""
        try:
            box = self.client().create(**self.fields)
        except ServerError as e:
            if e.code != "UNREACHABLE":
                raise
            box = self.client(fresh=True).create(**self.fields)
        try:
            # Its log holds what the interpreter prints outside the call (and, with
            # output="inherit", what the call prints: the last MiB of it).
            proc = box.start_process(command=self.command, stdin=True, log_bytes=1 << 20)
        except BaseException:
            self._delete(box)
            raise
        return box, proc

    def _refill(self) -> None:
        def one() -> None:
            if self._closed:
                return
            try:
                self._ready.put(self._create())
            except Exception as e:  # the next call creates its own and reports it
                self._ready.put(e)

        self._pending = [f for f in self._pending if not f.done()] + [self._creator.submit(one)]

    def _take(self) -> tuple[Any, Any]:
        got = self._ready.get()
        if isinstance(got, Exception):
            got = self._create()
        return got

    def _delete(self, box: Any) -> None:
        try:
            box.close()
        except Exception:  # its server is gone, and its sandboxes with it (or close sweeps)
            pass

    def run(self, payload: bytes) -> ExecutionResult:
        started = time.monotonic()
        box = proc = None
        for attempt in range(2):
            try:
                box, proc = self._take() if attempt == 0 else self._create()
            except Exception as e:
                # Refused (e.g. beyond the server's ceiling or --max-sandboxes: an error), or
                # no server (the node's daemon restarting): nothing ran.
                refused = isinstance(e, ServerError) and 400 <= e.status < 500
                return ExecutionResult("error" if refused else "crashed",
                                       error=f"{type(e).__name__}: no sandbox from the node's lockbox serve: {e}",
                                       duration=time.monotonic() - started)
            if attempt == 0:
                self._refill()
            try:
                proc.write(payload, close=True)
                break
            except ServerError as e:
                if e.code == "PROCESS_NOT_RUNNING":
                    break  # the interpreter ended before the call: its end says why
                self._delete(box)
                if attempt == 0 and _stale(e):
                    # A warm sandbox that is gone (its daemon restarted, or the server's
                    # --idle-timeout deleted it) ran nothing: once more, in a new one.
                    self._client = None
                    continue
                # Refused (e.g. a payload over the server's --max-body): nothing ran; else the
                # server or its sandbox went away mid-call.
                return ExecutionResult("error" if 400 <= e.status < 500 else "crashed", error=f"ServerError: {e}",
                                       duration=time.monotonic() - started)
            except Exception as e:  # the connection broke mid-call
                self._delete(box)
                return ExecutionResult("crashed", error=f"{type(e).__name__}: {e}", duration=time.monotonic() - started)
        if box is None or proc is None:  # not reached: the loop answers or breaks with both
            return ExecutionResult("crashed", error="no sandbox from the node's lockbox serve")
        # Past the timeout the sandbox is deleted, which ends the interpreter and the stream
        # below: nothing of the call keeps running once it has timed out.
        expired = threading.Event()
        timer = None
        if self.timeout is not None:
            def expire() -> None:
                expired.set()
                self._delete(box)

            timer = threading.Timer(max(0.0, self.timeout - (time.monotonic() - started)), expire)
            timer.daemon = True
            timer.start()
        said = bytearray()
        try:
            for event in proc.follow(since=0):
                if event.event in ("stdout", "stderr"):
                    if self.output == "inherit":
                        sys.stderr.buffer.write(event.bytes)
                        sys.stderr.flush()
                    else:
                        said += event.bytes
                        del said[:-4096]
                elif event.event == "eof":
                    break
            end = proc.info() if not expired.is_set() else None
            frame = b""
            if end is not None and end.get("exit_code") == 0:
                # "R", a status byte and the length come before the result: a file larger
                # than that and max_result_bytes is not read at all.
                if box.files.stat(_RESULT).get("size", 0) > 10 + self.max_result:
                    self._reaper.submit(self._delete, box)
                    return ExecutionResult("error", duration=time.monotonic() - started,
                                           error=f"ResultTooLarge: the result exceeds max_result_bytes={self.max_result}")
                frame = box.files.read(_RESULT)
        except Exception as e:
            if not expired.is_set():
                self._delete(box)
                return ExecutionResult("crashed", error=f"{type(e).__name__}: {e}",
                                       duration=time.monotonic() - started)
            end = None
        finally:
            if timer is not None:
                timer.cancel()
                if expired.is_set():
                    timer.join()  # the sandbox is deleted before the answer
        elapsed = time.monotonic() - started
        if expired.is_set() or end is None:
            return ExecutionResult("timeout", duration=elapsed)
        self._reaper.submit(self._delete, box)
        return self._result(frame, end.get("exit_code"), end.get("signal"), bytes(said), elapsed)

    def _result(self, frame: bytes, exit_code: int | None, signal: int | None, said: bytes,
                elapsed: float) -> ExecutionResult:
        from .executor import _decode_result

        buf = frame[1:] if frame[:1] == b"R" else b""
        if len(buf) >= 9:
            (n,) = struct.unpack(">Q", buf[1:9])
            if n > self.max_result:
                return ExecutionResult("error", duration=elapsed,
                                       error=f"ResultTooLarge: the result exceeds max_result_bytes={self.max_result}")
            if len(buf) >= 9 + n:
                return _decode_result(buf[:1], buf[9:9 + n], self.trusted, elapsed)
        # Died without a result. What the interpreter said on stderr before it (e.g. it could
        # not start) is kept in ``error``.
        text = said.decode("utf-8", "replace").strip()[-2000:]
        return ExecutionResult("crashed", exit_code=None if signal else exit_code, signal=signal,
                               error=text or None, duration=elapsed)

    def wait_ready(self) -> bool:
        """Blocks until the actor's sandboxes are created and its used ones deleted."""
        concurrent.futures.wait([*self._pending, self._reaper.submit(lambda: None)])
        return True

    def close(self) -> bool:
        """Deletes every sandbox of the actor."""
        self._closed = True
        concurrent.futures.wait(list(self._pending))
        while True:
            try:
                got = self._ready.get_nowait()
            except queue.Empty:
                break
            if not isinstance(got, Exception):
                self._reaper.submit(self._delete, got[0])
        self._reaper.shutdown(wait=True)
        return True


def _stale(e: ServerError) -> bool:
    """The call never reached a sandbox: its server did not take the connection, or the
    sandbox is gone."""
    refused = e.code == "UNREACHABLE" and "refused" in str(e).lower()
    return refused or e.code in ("SANDBOX_NOT_FOUND", "SANDBOX_NOT_RUNNING", "SANDBOX_LOST") or e.status == 404


def _fleet_namespace(fleet: Any) -> str | None:
    """The namespace of ``RaySandboxPool(fleet=...)``: ``True`` the default fleet's, a string
    that namespace, a :class:`~lockbox.fleet.Fleet` its own; ``None``/``False``: no fleet."""
    if fleet is None or fleet is False:
        return None
    if fleet is True:
        from .fleet import DEFAULT_NAMESPACE

        return DEFAULT_NAMESPACE
    if isinstance(fleet, str):
        return fleet
    namespace = getattr(fleet, "namespace", None)
    if not isinstance(namespace, str):
        raise UsageError(f"fleet: True, a namespace or a lockbox.fleet.Fleet, not {fleet!r}")
    return namespace


class RaySandboxPool:
    """``size`` Ray actors, each running calls in lockbox sandboxes on its node.

    Args:
        size: number of actors (reused across calls; a call waits for a free one).
        per_actor: warm sandboxed interpreters each actor keeps (with ``fleet``: sandboxes
            of its node's server created ahead).
        actor_options: passed to ``ray.remote(...).options`` (``num_cpus``, ``resources``...;
            ``num_cpus`` defaults to 0.5, and to 0 with ``fleet``, whose calls use the daemon's).
        actor_grace: extra seconds the driver waits beyond ``timeout`` before killing an
            unresponsive actor.
        fleet: run the calls in the node daemons of a fleet (:mod:`lockbox.fleet`): ``True``
            for the fleet of the default namespace (``"lockbox"``), a namespace, or a
            :class:`~lockbox.fleet.Fleet`. Actors are pinned to the fleet's ``up`` nodes,
            round robin; one whose node leaves the fleet moves to the node holding the
            fewest of the pool's actors, and so does one whose node holds two more than
            that one (a node that joined), checked when an actor is taken for a call. Default: sandboxes spawned by the actor itself.
        Other keyword arguments (``timeout``, ``policy``, ``max_result_bytes``, ...) are
        those of :class:`~lockbox.executor.SandboxExecutor`; ``python`` defaults to the
        actor's interpreter.
    """

    def __init__(
        self,
        size: int = 1,
        *,
        per_actor: int = 1,
        actor_options: dict[str, Any] | None = None,
        actor_grace: float = 30.0,
        fleet: Any = None,
        **executor_kw: Any,
    ) -> None:
        ray = _require_ray()
        if size < 1:
            raise UsageError("a Ray pool needs at least one actor")
        if not ray.is_initialized():
            ray.init()
        self.timeout = executor_kw.get("timeout")
        self.actor_grace = actor_grace
        self._local = SandboxExecutor(**{k: v for k, v in executor_kw.items() if k != "python"})
        self._kw = executor_kw
        self._per_actor = per_actor
        self._namespace = _fleet_namespace(fleet)
        self._pool_id = f"rp-{secrets.token_hex(6)}"
        self._nodes: list[str] = []
        # The node each fleet actor is pinned to (its replacement goes to the same one).
        self._node_of: dict[Any, str] = {}
        self._next_look = time.monotonic() + _LOOK_EVERY
        # A fleet actor only waits on its node's server, whose own limits bound the calls.
        options = {"num_cpus": 0.5 if self._namespace is None else 0} | (actor_options or {})
        if self._namespace is not None:
            from .executor import _Spec
            from .fleet import Fleet

            # What the server cannot take is refused here, not in every actor.
            _create_fields(_Spec(sandbox=executor_kw.get("policy"), python=None, pickler=None, output="devnull",
                                 extra_reads=[]))
            self._fleet = Fleet(self._namespace)
            self._nodes = [n["node_id"] for n in self._fleet.nodes() if n["state"] == "up"]
            if not self._nodes:
                raise UsageError(f"no node of the fleet in namespace {self._namespace!r} is up "
                                 "(lockbox.fleet.up() starts it)")
            self._remote = ray.remote(**options)(_FleetWorker)
        else:
            self._remote = ray.remote(**options)(_Worker)
        self._idle: queue.Queue[Any] = queue.Queue()
        self._lock = threading.Lock()
        for i in range(size):
            self._idle.put(self._new_actor(self._nodes[i % len(self._nodes)] if self._nodes else None))

    def _new_actor(self, node_id: str | None = None) -> Any:
        if self._namespace is None or node_id is None:
            return self._remote.remote(self._kw, self._per_actor)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        actor = self._remote.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        ).remote(self._namespace, node_id, self._kw, self._per_actor, self._pool_id)
        with self._lock:
            self._node_of[actor] = node_id
        return actor

    def _up_nodes(self) -> list[str] | None:
        """The fleet's nodes that are up now (``None``: the fleet could not say)."""
        try:
            up = [n["node_id"] for n in self._fleet.nodes() if n["state"] == "up"]
        except Exception:  # the controller is restarting: keep things as they are
            return None
        self._nodes += [n for n in up if n not in self._nodes]  # swept at close too
        return up

    def _held(self) -> list[str]:
        """The node of each of the pool's actors."""
        with self._lock:
            return list(self._node_of.values())

    def _replace(self, actor: Any) -> Any:
        """A new actor for one that died or hung: on its node if that is still up, else on
        the up node with the fewest of the pool's actors."""
        with self._lock:
            node = self._node_of.pop(actor, None)
        if self._namespace is not None:
            up = self._up_nodes()
            if up and node not in up:
                node = min(up, key=self._held().count)
        return self._new_actor(node)

    def _placed(self, actor: Any) -> Any:
        """The actor to run the next call: ``actor``, or, once the fleet's nodes changed, one
        made in its place on a better node. Looked at every ``_LOOK_EVERY`` seconds at most:
        an actor whose node is no longer up moves to the up node holding the fewest of the
        pool's actors, and so does one whose node holds two more than that node (a node
        that joined the fleet after the pool was made)."""
        if self._namespace is None or time.monotonic() < self._next_look:
            return actor
        self._next_look = time.monotonic() + _LOOK_EVERY
        up = self._up_nodes()
        if not up:
            return actor
        node = self._node_of.get(actor)
        held = self._held()
        target = min(up, key=held.count)
        if node in up and held.count(node) < held.count(target) + 2:
            return actor
        ray = _require_ray()
        if node in up:
            # Its warm sandboxes are deleted before it goes; a lost node's went with it.
            ray.wait([actor.close.remote()], timeout=30)
        ray.kill(actor, no_restart=True)
        with self._lock:
            self._node_of.pop(actor, None)
        return self._new_actor(target)

    def secure_execute(self, fn: Any, *args: Any, **kwargs: Any) -> ExecutionResult:
        """Runs ``fn(*args, **kwargs)`` on a free actor, in a lockbox sandbox there (with
        ``fleet``: in its node's ``lockbox serve``)."""
        ray = _require_ray()
        payload = self._local.payload(fn, *args, **kwargs)
        actor = self._placed(self._idle.get())
        wait = None if self.timeout is None else self.timeout + self.actor_grace
        try:
            result = ray.get(actor.run.remote(payload), timeout=wait)
        except ray.exceptions.GetTimeoutError:
            # The actor itself did not come back: kill it (its sandboxes die with it; a fleet
            # actor's are deleted on the server by close).
            ray.kill(actor, no_restart=True)
            actor = self._replace(actor)
            return ExecutionResult("timeout", duration=wait or 0.0)
        except ray.exceptions.RayActorError as e:
            actor = self._replace(actor)
            return ExecutionResult("crashed", error=f"Ray actor died: {e}")
        finally:
            self._idle.put(actor)
        return result

    def wait_ready(self) -> None:
        """Blocks until every idle actor's interpreters are started (after a burst of calls,
        refills take a sandbox start each)."""
        ray = _require_ray()
        actors = list(self._idle.queue)
        ray.get([a.wait_ready.remote() for a in actors])

    def close(self) -> None:
        """Kills every actor (and so every sandbox they hold; with ``fleet``, deletes every
        sandbox of the pool on the node daemons)."""
        ray = _require_ray()
        actors = []
        while True:
            try:
                actors.append(self._idle.get_nowait())
            except queue.Empty:
                break
        if self._namespace is not None and actors:
            # Each deletes its sandboxes; one that died or does not answer is left to the sweep.
            ray.wait([a.close.remote() for a in actors], num_returns=len(actors), timeout=60)
        for actor in actors:
            ray.kill(actor, no_restart=True)
        if self._namespace is not None:
            self._sweep()

    def _sweep(self) -> None:
        """Deletes what is left of the pool's sandboxes on its nodes' daemons (those of an
        actor that was killed)."""
        for node_id in self._nodes:
            try:
                client = self._fleet.client(node_id)
                for s in client.list(state="running"):
                    if (s.get("labels") or {}).get("lockbox-pool") == self._pool_id:
                        client.sandbox(s["id"]).close()
            except (KeyError, ServerError):
                pass  # the node or its server is gone, and its sandboxes with it

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
