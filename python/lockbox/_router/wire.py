"""HTTP/1.1 as the router speaks it, both to clients and to nodes: request and status heads
(:class:`Head`), body framing (lengths, chunks; never both), copying and reading bodies, the
router's own replies, a client's :class:`Request`, and the byte pipe of an upgraded connection.
Nothing here knows of nodes or sandboxes."""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

HEAD_LIMIT = 64 * 1024
BODY_LIMIT = 16 * 1024 * 1024
CHUNK = 64 * 1024
HEADER_TIMEOUT = 10.0
# Hop-by-hop headers (RFC 9110 7.6.1): each connection's own, never forwarded.
HOP_HEADERS = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade"}


class HttpError(Exception):
    """A malformed request or reply."""


@dataclass
class Head:
    """An HTTP/1.1 request or status line and its headers, in order."""

    line: str
    headers: list[tuple[str, str]]

    @classmethod
    def parse(cls, raw: bytes) -> Head:
        lines = raw.decode("latin-1").split("\r\n")
        headers = []
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip() or "\n" in line or "\r" in line:
                raise HttpError(f"bad header line {line[:60]!r}")
            headers.append((name, value.strip()))
        return cls(lines[0], headers)

    def get(self, name: str) -> str | None:
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None

    def remove(self, *names: str) -> None:
        drop = {n.lower() for n in names}
        self.headers = [(k, v) for k, v in self.headers if k.lower() not in drop]

    def put(self, name: str, value: str) -> None:
        self.remove(name)
        self.headers.append((name, value))

    def encode(self) -> bytes:
        return ("\r\n".join([self.line, *(f"{k}: {v}" for k, v in self.headers)]) + "\r\n\r\n").encode("latin-1")

    def tokens(self, name: str) -> set[str]:
        name = name.lower()
        return {t.strip().lower() for k, v in self.headers if k.lower() == name for t in v.split(",")}


def body_framing(head: Head, *, request: bool, method: str = "GET", status: int = 200) -> int | None:
    """The body's length: ``-1`` chunked, ``None`` until the connection closes, else a
    byte count."""
    if not request and (method == "HEAD" or 100 <= status < 200 or status in (204, 304)):
        return 0
    codings = [c for c in head.tokens("transfer-encoding") if c]
    lengths = {v.strip() for k, v in head.headers if k.lower() == "content-length"}
    if codings:
        # Only plain chunked framing, and never beside a length (no request smuggling).
        if codings != ["chunked"] or (request and lengths):
            raise HttpError(f"unsupported framing: Transfer-Encoding {', '.join(codings)}"
                            + (" with Content-Length" if lengths else ""))
        return -1
    if lengths:
        if len(lengths) > 1 or not next(iter(lengths)).isdigit():
            raise HttpError(f"bad Content-Length {', '.join(sorted(lengths))}")
        return int(next(iter(lengths)))
    return 0 if request else None


async def copy_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, framing: int | None) -> None:
    """Copies one body as it arrives, framing included (chunk by chunk, flushed)."""
    if framing is None:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        return
    if framing >= 0:
        left = framing
        while left:
            data = await reader.read(min(CHUNK, left))
            if not data:
                raise asyncio.IncompleteReadError(b"", left)
            writer.write(data)
            await writer.drain()
            left -= len(data)
        return
    while True:
        line = await reader.readuntil(b"\r\n")
        writer.write(line)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise HttpError("bad chunk size") from None
        if size == 0:
            while (trailer := await reader.readuntil(b"\r\n")) != b"\r\n":
                writer.write(trailer)
            writer.write(b"\r\n")
            await writer.drain()
            return
        left = size + 2
        while left:
            data = await reader.read(min(CHUNK, left))
            if not data:
                raise asyncio.IncompleteReadError(b"", left)
            writer.write(data)
            left -= len(data)
        await writer.drain()


async def read_body(reader: asyncio.StreamReader, framing: int | None, limit: int = BODY_LIMIT) -> bytes:
    """A whole body, de-chunked; ``HttpError`` beyond ``limit`` bytes."""
    if framing is None:
        data = await reader.read(limit + 1)
        while len(data) <= limit and (more := await reader.read(limit + 1 - len(data))):
            data += more
    elif framing >= 0:
        if framing > limit:
            raise HttpError(f"a body of {framing} bytes, more than {limit}")
        return await reader.readexactly(framing)
    else:
        parts = []
        total = 0
        while True:
            line = await reader.readuntil(b"\r\n")
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise HttpError("bad chunk size") from None
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass
                break
            total += size
            if total > limit:
                raise HttpError(f"a body of more than {limit} bytes")
            parts.append((await reader.readexactly(size + 2))[:-2])
        data = b"".join(parts)
    if len(data) > limit:
        raise HttpError(f"a body of more than {limit} bytes")
    return data


async def read_response_head(reader: asyncio.StreamReader) -> tuple[Head, int]:
    head = Head.parse(await reader.readuntil(b"\r\n\r\n"))
    try:
        return head, int(head.line.split(" ", 2)[1])
    except (IndexError, ValueError):
        raise HttpError(f"bad status line {head.line[:60]!r}") from None


async def pipe_both_ways(cr: asyncio.StreamReader, cw: asyncio.StreamWriter, ur: asyncio.StreamReader,
                uw: asyncio.StreamWriter) -> None:
    """Bytes both ways until either side closes (an upgraded connection)."""
    async def one(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(CHUNK):
                w.write(data)
                await w.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                w.close()

    tasks = [asyncio.create_task(one(cr, uw)), asyncio.create_task(one(ur, cw))]
    _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for t in pending:
        t.cancel()


def encode_reply(status: int, body: Any, *, close: bool = False, headers: Sequence[tuple[str, str]] = ()) -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        reason = http.HTTPStatus(status).phrase
    except ValueError:
        reason = "Status"
    hs = [*headers] if status == 204 else [("Content-Type", "application/json"), *headers,
                                           ("Content-Length", str(len(data)))]
    if close:
        hs.append(("Connection", "close"))
    return Head(f"HTTP/1.1 {status} {reason}", hs).encode() + (b"" if status == 204 else data)


def lockbox_error(status: int, code: str, message: str, **details: Any) -> tuple[int, dict[str, Any]]:
    return status, {"code": code, "message": message, "details": details}


def e2b_error(status: int, error: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """A lockbox error in E2B's shape (``{"code": status, "message"}``), which the E2B SDKs
    raise by status."""
    return status, {"code": status, "message": str(error.get("message", ""))}


def json_or_none(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


def describe_error(e: BaseException) -> str:
    if isinstance(e, TimeoutError):
        return "no answer in time"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


class Request:
    """One request of a client connection: its head, and the connection to read its body
    from and answer on."""

    def __init__(self, method: str, target: str, head: Head, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.method, self.target, self.head = method, target, head
        self.path = urllib.parse.urlsplit(target).path or "/"
        self.parts = [p for p in self.path.split("/") if p]
        self.reader, self.writer = reader, writer
        self.framing = body_framing(head, request=True)
        self.keep = True
        self.answered = False
        self.body_read = False
        self.error_shape: Callable[[int, dict[str, Any]], tuple[int, Any]] | None = None
        """How the router's own errors (lockbox's ``{code, message, details}``, ``code`` a
        string) are answered on this request, when its protocol has another shape (E2B's,
        MCP's); ``None``: as they are. Nodes' replies pass unchanged."""

    @property
    def expects_continue(self) -> bool:
        return "100-continue" in self.head.tokens("expect")

    async def drain_body(self) -> None:
        """Reads (and drops) the request's body, so the connection can take the next one;
        a client waiting for ``100 Continue`` is not asked for it (the connection closes
        after the answer instead)."""
        if self.body_read:
            return
        self.body_read = True
        if self.expects_continue and self.framing != 0:
            self.keep = False
            return
        try:
            await read_body(self.reader, self.framing, limit=BODY_LIMIT)
        except (HttpError, asyncio.IncompleteReadError):
            self.keep = False

    async def read_body(self, limit: int = BODY_LIMIT) -> bytes:
        """The request's whole body (``HttpError`` beyond ``limit``), after telling a client
        that waits for it to go on."""
        self.body_read = True
        if self.expects_continue and self.framing != 0:
            self.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await self.writer.drain()
        return await read_body(self.reader, self.framing, limit)

    async def read_body_or_refuse(self, limit: int = BODY_LIMIT) -> bytes | None:
        """:meth:`read_body`, or ``None`` once a body beyond ``limit`` has been answered with
        413 (the connection then closes: the rest of the body is unread)."""
        try:
            return await self.read_body(limit)
        except HttpError as e:
            self.keep = False
            await self.send(*lockbox_error(413, "PAYLOAD_TOO_LARGE", str(e)))
            return None

    async def send(self, status: int, body: Any, *, headers: Sequence[tuple[str, str]] = ()) -> None:
        self.answered = True
        if (self.error_shape is not None and status >= 400 and isinstance(body, dict)
                and isinstance(body.get("code"), str)):
            status, body = self.error_shape(status, body)
        self.writer.write(encode_reply(status, body, close=not self.keep, headers=headers))
        await self.writer.drain()
