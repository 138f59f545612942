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
"""

from __future__ import annotations

import importlib
import queue
import threading
from typing import Any, Self

from .errors import UnsupportedError, UsageError
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


class RaySandboxPool:
    """``size`` Ray actors, each running calls in lockbox sandboxes on its node.

    Args:
        size: number of actors (reused across calls; a call waits for a free one).
        per_actor: warm sandboxed interpreters each actor keeps.
        actor_options: passed to ``ray.remote(...).options`` (``num_cpus``, ``resources``...).
        actor_grace: extra seconds the driver waits beyond ``timeout`` before killing an
            unresponsive actor.
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
        self._remote = ray.remote(**({"num_cpus": 0.5} | (actor_options or {})))(_Worker)
        self._idle: queue.Queue[Any] = queue.Queue()
        self._lock = threading.Lock()
        for _ in range(size):
            self._idle.put(self._new_actor())

    def _new_actor(self) -> Any:
        return self._remote.remote(self._kw, self._per_actor)

    def secure_execute(self, fn: Any, *args: Any, **kwargs: Any) -> ExecutionResult:
        """Runs ``fn(*args, **kwargs)`` on a free actor, in a lockbox sandbox there."""
        ray = _require_ray()
        payload = self._local.payload(fn, *args, **kwargs)
        actor = self._idle.get()
        wait = None if self.timeout is None else self.timeout + self.actor_grace
        try:
            result = ray.get(actor.run.remote(payload), timeout=wait)
        except ray.exceptions.GetTimeoutError:
            # The actor itself did not come back: kill it (its sandboxes die with it).
            ray.kill(actor, no_restart=True)
            actor = self._new_actor()
            return ExecutionResult("timeout", duration=wait or 0.0)
        except ray.exceptions.RayActorError as e:
            actor = self._new_actor()
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
        """Kills every actor (and so every sandbox they hold)."""
        ray = _require_ray()
        while True:
            try:
                ray.kill(self._idle.get_nowait(), no_restart=True)
            except queue.Empty:
                break

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
