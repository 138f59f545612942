"""The sandboxes' exposed ports through the router: the ``origin`` and ``open_url`` of a node's
``.../ports`` replies rewritten to name the router's ports listener, and that listener, which
sends each request (``Host: {port}-{sandbox}.{domain}``) to the node's own ports listener,
which checks the port's access as without a router."""

from __future__ import annotations

import json
import urllib.parse

from .forwarding import ForwardingRouter
from .wire import Request, json_or_none, lockbox_error


class ExposedPorts(ForwardingRouter):
    """Serves the sandboxes' ports on their own origins."""

    def _ports_reply(self, sid: str, data: bytes) -> bytes | None:
        """A node's ``.../ports`` reply (one port, or ``{"ports": [...]}``) with each port's
        ``origin`` and ``open_url`` on the router's ports listener, which a client that
        reaches only the router can use (none without one: the node's own would name a
        listener such a client may not reach)."""
        got = json_or_none(data)
        ports = got.get("ports") if isinstance(got, dict) and "ports" in got else [got]
        if not isinstance(ports, list):
            return None
        for p in ports:
            if not isinstance(p, dict) or not isinstance(p.get("port"), int):
                continue
            if self.ports_address is None:
                p.pop("origin", None)
                p.pop("open_url", None)
                continue
            if "origin" not in p:
                continue  # the node has no ports listener: nothing to reach
            origin = f"http://{p['port']}-{sid}.{self.ports_domain}:{self.ports_address[1]}"
            p["origin"] = origin
            if isinstance(p.get("open_url"), str):
                node_url = urllib.parse.urlsplit(p["open_url"])
                p["open_url"] = origin + node_url.path + (f"?{node_url.query}" if node_url.query else "")
        return json.dumps(got).encode()

    async def _ports(self, req: Request) -> None:
        """A request to the router's ports listener: ``Host`` names the port and the sandbox
        (``{port}-{sandbox}.{ports_domain}``); it goes to the node's ports listener, which
        checks the port's access (its cookie, its ``open_url`` key, or a bearer token: the
        fleet's, which becomes the node's) as it does without a router."""
        host = req.head.get("host") or ""
        target = port_target(host, self.ports_domain)
        if target is None:
            await req.drain_body()
            where = f"{{port}}-{{sandbox}}.{self.ports_domain}:{self.ports_address[1] if self.ports_address else ''}"
            await req.send(*lockbox_error(404, "NOT_FOUND", f"host {host!r} names no port: each exposed port is "
                                           f"served at {where}", host=host))
            return
        port, sid = target
        auth = req.head.get("authorization")
        fleet = auth is not None and self._authorized(req.head, False)
        if auth is not None and not fleet:
            req.keep = False
            await req.send(*lockbox_error(401, "UNAUTHORIZED", "the bearer token is wrong: send the fleet's token, "
                                           "or open the port's open_url"))
            return
        # Without the fleet's token, an id the router does not know is not looked up on
        # every node (as for E2B's sandbox plane).
        view = await self._node_of(sid, "sandboxes", ask=fleet)
        if view is None:
            await req.drain_body()
            await req.send(*lockbox_error(404, "SANDBOX_NOT_FOUND", f"no fleet node has sandbox {sid}", id=sid))
            return
        buried = self.gone.get(sid)
        why = buried[1] if buried else view.lost_reason()
        if why is not None or not view.ports_port:
            await req.drain_body()
            if why is None:
                await req.send(*lockbox_error(404, "NOT_FOUND", f"sandbox {sid}'s node {view.node_id[:12]} serves "
                                               "no ports on their own origins (lockbox serve --ports-listen off)",
                                               id=sid, node=view.node_id))
            elif buried or view.state != "up":
                await req.send(*lockbox_error(410, "SANDBOX_LOST", f"sandbox {sid} was on node {view.node_id[:12]}: "
                                               f"{why}", id=sid, node=view.node_id, reason=why))
            else:
                await req.send(*lockbox_error(503, "NODE_UNREACHABLE", f"sandbox {sid} is on node "
                                               f"{view.node_id[:12]}: {why}", id=sid, node=view.node_id, reason=why))
            return
        req.head.put("Host", f"{port}-{sid}.{view.ports_domain}:{view.ports_port}")
        await self._forward(req, view, upstream_auth=fleet, ports=True)


def port_target(host: str, domain: str) -> tuple[int, str] | None:
    """The port and sandbox a ``Host`` of the router's ports listener names
    (``{port}-{sandbox}.{domain}[:PORT]``), as ``lockbox serve``'s ports listener reads it."""
    name, sep, tail = host.rpartition(":")
    name = (name if sep and tail.isdigit() else host).lower()
    label, dot, rest = name.partition(".")
    port, dash, sid = label.partition("-")
    if not dot or rest != domain or not dash or not sid or not port.isdigit() or not 1 <= int(port) <= 65535:
        return None
    return int(port), sid
