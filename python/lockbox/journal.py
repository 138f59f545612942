"""A durable step journal: record/replay of an agent run's steps (``lockbox-journal``).

An agent wraps each step with side effects or cost (an LLM call, a tool call, a sandbox
run) in :meth:`Run.record`. The first time, the step runs and its JSON result is journaled
under a deterministic step id (``llm``, ``llm#2``, ..., prefixed ``key:`` inside
:meth:`Run.parallel` branches). After a crash, starting the same run again replays the
journaled results *without running the steps* and continues live from the first step the
journal does not have::

    from lockbox import journal

    j = journal.open("sqlite:/tmp/agent.db")       # or "file:DIR", "postgres://..."
    run = j.start("ticket-42", version="v1")
    plan = run.record("llm", lambda: call_llm(prompt))
    results = run.parallel({"web": lambda r: r.record("tool", fix_web),
                            "api": lambda r: r.record("tool", fix_api)})
    run.complete({"plan": plan, "results": results})

Async functions work the same way (``await run.record("llm", async_fn)``; branches of
``await run.parallel({...})`` given async functions run concurrently, as in Rust).

Rules: step values round-trip through JSON (a tuple comes back as a list; a value that is
not JSON-serialisable raises :class:`~lockbox.errors.NotSerializable` and nothing is
journaled). A replay must make the same calls in the same order per branch, else
:class:`~lockbox.errors.ReplayMismatch`. Each ``start`` fences older sessions of the run
(:class:`~lockbox.errors.Fenced`). An exception raised by a step is not journaled by
default (the step runs again on replay, right for transient failures); with
``journal_errors=True`` it is, and raises :class:`~lockbox.errors.StepFailed` now and on
every replay.
"""

from __future__ import annotations

import builtins
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from . import _lockbox

__all__ = ["Journal", "Run", "Suspension", "open"]

T = TypeVar("T")


def open(url: str) -> Journal:  # noqa: A001 - the natural name: journal.open(url)
    """Opens the journal at ``url``: ``sqlite:PATH`` (created if missing), ``file:DIR``
    (JSONL files) or ``postgres://user@host/db`` (shared by many machines)."""
    return Journal(_lockbox.open_journal(url))


def _dumps(value: Any, what: str) -> str:
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as e:
        from .errors import NotSerializable

        raise NotSerializable(f"{what}: not JSON-serialisable ({e})", code="NOT_SERIALIZABLE") from e


@dataclass(frozen=True)
class Suspension:
    """What :meth:`Run.suspend` found: ``suspended`` (stop driving the run; a later
    :meth:`Journal.resume` delivers a value) or the delivered ``value``."""

    suspended: bool
    value: Any = None


class Journal:
    """A journal over one storage. Cheap to share between threads."""

    def __init__(self, native: _lockbox.Journal) -> None:
        self._native = native

    def start(self, run_id: str, *, version: str | None = None, metadata: Any = None) -> Run:
        """Starts a new session of ``run_id`` (creating the run the first time) and returns
        it. The first start fixes ``version`` and ``metadata``; a later start with others
        raises :class:`~lockbox.errors.VersionMismatch` /
        :class:`~lockbox.errors.MetadataMismatch`. Older sessions are fenced."""
        meta = None if metadata is None else _dumps(metadata, "metadata")
        return Run(self._native.start(run_id, version, meta))

    def resume(self, run_id: str, value: Any) -> None:
        """Delivers ``value`` to the run's pending suspension."""
        self._native.resume(run_id, _dumps(value, "resume value"))

    def cancel(self, run_id: str, reason: str) -> None:
        """Cancels the run from outside (fences any live session)."""
        self._native.cancel(run_id, reason)

    def fork(
        self,
        run_id: str,
        *,
        step: str | None = None,
        offset: int | None = None,
        new_run_id: str | None = None,
    ) -> str:
        """Copies the run's entries before ``step`` (a step id such as ``"llm#2"``) or
        ``offset`` into a new run (``new_run_id``, default ``RUN.fork-<ms>``) and returns its
        id; starting it replays up to the cut and runs the rest live."""
        return self._native.fork(run_id, step, offset, new_run_id)

    def list(self) -> builtins.list[str]:
        """Every run id, sorted."""
        return self._native.list()

    def status(self, run_id: str) -> dict[str, Any]:
        """Where the run stands: ``state`` (``running``, ``suspended``, ``finished``),
        ``entries``, ``steps``, ``last_session``, ``version``, ``metadata``."""
        return json.loads(self._native.status(run_id))

    def entries(self, run_id: str, offset: int = 0) -> builtins.list[dict[str, Any]]:
        """The run's journal entries from ``offset``, decoded."""
        return json.loads(self._native.entries(run_id, offset))


class Run:
    """One session of a run: records steps, runs branches, finishes the run."""

    def __init__(self, native: _lockbox.Run) -> None:
        self._native = native

    def __repr__(self) -> str:
        return f"Run(id={self.id!r}, session={self.session}, prefix={self.prefix!r})"

    @property
    def id(self) -> str:
        """The run id."""
        return self._native.id

    @property
    def session(self) -> int:
        """This session's number (its fencing token)."""
        return self._native.session

    @property
    def prefix(self) -> str:
        """The branch prefix of this handle (``""`` at the root, ``"web:"`` in a branch)."""
        return self._native.prefix

    def record(self, name: str, fn: Callable[[], Any], *, journal_errors: bool = False) -> Any:
        """Runs ``fn()`` once across replays and returns its (JSON round-tripped) value.

        On replay the journaled value is returned without calling ``fn``. ``fn`` may be an
        ``async def`` function: then this returns an awaitable (see :meth:`record_async`).
        The GIL is released while the journal writes.
        """
        if inspect.iscoroutinefunction(fn):
            return self.record_async(name, fn, journal_errors=journal_errors)

        def call() -> Any:
            value = fn()
            if inspect.isawaitable(value):
                if inspect.iscoroutine(value):
                    value.close()
                raise TypeError(f"step {name!r} returned an awaitable: use `await run.record_async(...)`")
            return value

        return self._native.record(name, call, journal_errors)

    def record_async(
        self, name: str, fn: Callable[[], Awaitable[Any]], *, journal_errors: bool = False
    ) -> Awaitable[Any]:
        """Like :meth:`record` for a function returning an awaitable (e.g.
        ``lambda: llm(prompt)`` with an async ``llm``); await the result."""
        return self._native.record_async(name, fn, journal_errors)

    def parallel(self, branches: Mapping[str, Callable[[Run], Any]]) -> Any:
        """Runs ``{key: fn(child_run)}`` branches; each child prefixes its step names with
        ``key:``, so step ids do not depend on scheduling. Returns ``{key: result}`` (an
        awaitable of it when the functions are ``async``, which then run concurrently;
        synchronous branches run one after another in key order)."""
        fns = list(branches.items())
        if fns and all(inspect.iscoroutinefunction(f) for _, f in fns):
            wrapped_async = [(k, _bind_async(f)) for k, f in fns]
            return self._native.parallel_async(wrapped_async)
        if any(inspect.iscoroutinefunction(f) for _, f in fns):
            raise TypeError("parallel: give either only async or only sync branch functions")
        return self._native.parallel([(k, _bind(f)) for k, f in fns])

    def suspend(self, event: str, payload: Any = None) -> Suspension:
        """A suspension point named ``event``: the first time it journals that the run
        waits and returns ``Suspension(suspended=True)`` (stop driving the run); once
        :meth:`Journal.resume` delivered a value, a replay returns it."""
        raw = self._native.suspend(event, _dumps(payload, "suspend payload"))
        if raw is None:
            return Suspension(suspended=True)
        return Suspension(suspended=False, value=json.loads(raw))

    def complete(self, value: Any = None) -> None:
        """Journals the run's result; later starts raise
        :class:`~lockbox.errors.TerminalRun`."""
        self._native.complete(_dumps(value, "complete value"))

    def fail(self, error: Any) -> None:
        """Journals that the run failed for good."""
        self._native.fail(_dumps(error, "fail value"))

    def cancel(self, reason: str) -> None:
        """Journals that the run was cancelled."""
        self._native.cancel(reason)


def _bind(fn: Callable[[Run], Any]) -> Callable[[_lockbox.Run], Any]:
    return lambda native: fn(Run(native))


def _bind_async(fn: Callable[[Run], Awaitable[Any]]) -> Callable[[_lockbox.Run], Awaitable[Any]]:
    return lambda native: fn(Run(native))
