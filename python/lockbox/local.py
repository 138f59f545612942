"""Long-lived sandboxes embedded in this process: ``lockbox.Sandbox.open()``.

::

    from lockbox import Sandbox

    with Sandbox.open(workdir="/home/me/repo", max_memory="1G") as box:   # killed at the end
        sh = box.session("build")
        sh.exec("cd src && export A=1")
        print(sh.exec("pwd; echo $A").stdout)        # the session keeps its cwd and variables
        p = box.start_process(command="make test")
        for ev in p.follow():                        # streamed output, then eof
            print(ev.event, ev.bytes)
        box.files.write("notes.txt", b"hi")
        print(box.changes())                         # the copy-on-write branch
        box.commit()                                 # or box.abort()

The object is a :class:`~lockbox.client.RemoteSandbox` whose transport is not HTTP: the API
of ``lockbox serve`` runs in this process (the native module hosts ``lockbox-runtime`` and the
server's router) and requests are calls into it. So code written against
``lockbox.Client(url, token).create(...)`` works unchanged on ``Sandbox.open(...)``: the same
methods, return types, streaming iterators and errors
(:class:`~lockbox.errors.ServerError` with the same ``code`` and ``status``).

State directory: one runtime per directory (it takes a ``flock`` on ``runtime.lock``). By default
each Python process takes the first free one of ``<default_state_dir()>/sdk/0``, ``/1``, ...,
so processes never collide and a directory is reused after its process ends (whatever it
left, e.g. a branch kept by ``on_exit="keep"``, is recovered there and reviewable with
``lockbox branch --state-dir``). An explicit ``state_dir=`` is used as is, and one that
another runtime holds (another process, ``lockbox serve``) raises
:class:`~lockbox.errors.SetupError` saying so.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Iterator
from typing import Any, Self

from . import _lockbox
from .client import Client, RemoteSandbox, _error

__all__ = ["LocalClient", "LocalSandbox"]

_apis: dict[tuple[str, bool, str | None], Any] = {}
_apis_lock = threading.Lock()


def _api(state_dir: str | None, agent_exe: str | None) -> Any:
    """The process's runtime for ``state_dir`` (opened once, shut down at exit)."""
    from ._sdk import default_state_dir

    slots = state_dir is None
    base = os.path.join(default_state_dir(), "sdk") if state_dir is None else os.path.abspath(state_dir)
    agent = agent_exe or os.environ.get("LOCKBOX_AGENT") or None
    key = (base, slots, agent)
    with _apis_lock:
        api = _apis.get(key)
        if api is None:
            api = _lockbox.open_local(base, slots, agent)
            _apis[key] = api
        return api


@atexit.register
def _shutdown() -> None:
    # Sandboxes left open are deleted (their processes killed) before the interpreter goes.
    with _apis_lock:
        apis = list(_apis.values())
    for api in apis:
        api.shutdown()


class _Response:
    """A native response body as the client's transport returns it: a context manager with
    ``read()`` that iterates lines (for server-sent events)."""

    def __init__(self, body: Any) -> None:
        self._body = body

    def read(self) -> bytes:
        return self._body.read_all()

    def __iter__(self) -> Iterator[bytes]:
        pending = b""
        while True:
            chunk = self._body.next_chunk()
            if chunk is None:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line + b"\n"
        if pending:
            yield pending

    def close(self) -> None:
        self._body.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalClient(Client):
    """:class:`~lockbox.Client` served in this process instead of by ``lockbox serve``.

    Args:
        state_dir: the runtime's state directory (default: a free one of
            ``<default_state_dir()>/sdk/N``; see the module's documentation).
        agent_exe: the executable run as each sandbox's agent (default: ``$LOCKBOX_AGENT``,
            else the agent embedded in this package, written to ``STATE/agent/``).
    """

    def __init__(self, state_dir: str | os.PathLike[str] | None = None, *, agent_exe: str | None = None) -> None:
        self._api = _api(os.fspath(state_dir) if state_dir is not None else None, agent_exe)
        super().__init__("local:" + os.fspath(self._api.state_dir), self._api.token)

    @property
    def state_dir(self) -> str:
        """The state directory this process's runtime holds."""
        return os.fspath(self._api.state_dir)

    def create(self, **kw: Any) -> LocalSandbox:
        """See :meth:`lockbox.Client.create`."""
        return LocalSandbox(self, super().create(**kw).info)

    def _sandbox_of(self, info: dict[str, Any]) -> LocalSandbox:
        return LocalSandbox(self, info)

    def sandbox(self, id: str) -> LocalSandbox:  # noqa: A002 - the server's name
        """A handle on an existing sandbox of this runtime."""
        return LocalSandbox(self, super().sandbox(id).info)

    def _send(self, method: str, path: str, headers: dict[str, str], data: bytes | None) -> tuple[Any, str]:
        status, ctype, body = self._api.request(method, path, list(headers.items()), data)
        if status >= 400:
            raise _error(status, body.read_all())
        return _Response(body), ctype


class LocalSandbox(RemoteSandbox):
    """A long-lived sandbox of this process (:meth:`lockbox.Sandbox.open`): every method of
    :class:`~lockbox.client.RemoteSandbox`. Leaving ``with`` (or :meth:`close`) kills every
    process in it and applies its ``on_exit`` to its branch; sandboxes still open when the
    interpreter exits are deleted then."""

    def __repr__(self) -> str:
        return f"LocalSandbox({self.id!r})"
