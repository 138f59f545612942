"""The console's login through the router: ``/ui/login`` with the fleet's token, sessions of
the router's own (kept in the store, so every router knows them), and the checks a request
with the console's cookie passes, as ``lockbox serve``'s (origin, WebSocket origin, CSRF)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Sequence

from .forwarding import ForwardingRouter
from .wire import Head, Request, json_or_none, lockbox_error

SESSION_SECONDS = 12 * 3600


class ConsoleLogin(ForwardingRouter):
    """Console sessions standing for the fleet's token."""

    async def _session(self, head: Head) -> tuple[str, str] | None:
        """The console session a request's cookie names (``(session, csrf)``), if valid."""
        session = cookies(head).get("lockbox_session")
        if not session:
            return None
        key = hashlib.sha256(session.encode()).hexdigest()
        got = self.sessions.get(key)
        if got is None and self.store is not None:
            stored = await self._kv(self.store.get, f"s/{key}")
            got = (stored["csrf"], stored["at"]) if stored else None
        if got is None or time.time() - got[1] > SESSION_SECONDS:
            return None
        self.sessions[key] = got
        return session, got[0]

    def _cookie_refusal(self, req: Request, csrf: str) -> str | None:
        """Why a request with the console's cookie is refused (as ``lockbox serve`` refuses
        it: another origin, a WebSocket without this origin, a write without the CSRF
        header), or ``None``."""
        origin = req.head.get("origin")
        host = req.head.get("host") or ""
        if origin is not None and origin not in (f"http://{host}", f"https://{host}"):
            return f"the origin {origin} is not this server's"
        if origin is None and req.head.get("upgrade") is not None:
            return "a WebSocket upgrade must carry this server's Origin"
        if (req.head.get("sec-fetch-site") or "none") not in ("same-origin", "none"):
            return "a cross-site request"
        if req.method not in ("GET", "HEAD") and not hmac.compare_digest(
                (req.head.get("x-csrf-token") or "").encode(), csrf.encode()):
            return "X-CSRF-Token is missing or wrong"
        return None

    async def _console(self, req: Request) -> None:
        """``/ui/login``, ``/ui/logout``, ``/ui/session``, answered by the router itself: the
        console logs in with the fleet's token and then sees every node."""
        if req.path == "/ui/session":
            await req.drain_body()
            if await self._session(req.head):
                await req.send(200, {"authenticated": True})
            else:
                await req.send(*lockbox_error(401, "UNAUTHORIZED", "no console session"))
            return
        origin = req.head.get("origin")
        host = req.head.get("host") or ""
        if origin is not None and origin not in (f"http://{host}", f"https://{host}"):
            await req.drain_body()
            await req.send(*lockbox_error(403, "FORBIDDEN", f"the origin {origin} is not this server's"))
            return
        raw = await req.read_body_or_refuse(64 * 1024)
        if raw is None:
            return
        body = json_or_none(raw)
        clear = [("Set-Cookie", "lockbox_session=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
                 ("Set-Cookie", "lockbox_csrf=; SameSite=Strict; Path=/; Max-Age=0")]
        if req.path == "/ui/logout":
            got = await self._session(req.head)
            if got:
                key = hashlib.sha256(got[0].encode()).hexdigest()
                self.sessions.pop(key, None)
                if self.store is not None:
                    await self._kv(self.store.delete, f"s/{key}")
            await req.send(204, b"", headers=clear)
            return
        token = body.get("token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not hmac.compare_digest(token.encode(), self.token):
            await req.send(*lockbox_error(401, "UNAUTHORIZED", "wrong token: the console of a fleet logs in with "
                                           "the fleet's token"))
            return
        session, csrf = secrets.token_hex(32), secrets.token_hex(32)
        key = hashlib.sha256(session.encode()).hexdigest()
        self.sessions[key] = (csrf, time.time())
        if self.store is not None:
            await self._kv(self.store.put, f"s/{key}", {"csrf": csrf, "at": time.time()})
        await req.send(204, b"", headers=[
            ("Set-Cookie", f"lockbox_session={session}; HttpOnly; SameSite=Strict; Path=/"),
            ("Set-Cookie", f"lockbox_csrf={csrf}; SameSite=Strict; Path=/")])


def cookies(head: Head) -> dict[str, str]:
    jar: dict[str, str] = {}
    for k, v in head.headers:
        if k.lower() == "cookie":
            for part in v.split(";"):
                name, sep, value = part.strip().partition("=")
                if sep:
                    jar.setdefault(name, value)
    return jar


def drop_cookies(head: Head, names: Sequence[str]) -> None:
    kept = [f"{k}={v}" for k, v in cookies(head).items() if k not in names]
    head.remove("cookie")
    if kept:
        head.put("Cookie", "; ".join(kept))
