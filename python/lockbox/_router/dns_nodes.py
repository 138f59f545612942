"""The fleet's nodes from DNS, for a router without Ray: every address a name resolves to is
one node's ``lockbox serve`` (a Kubernetes headless Service resolves to each ready pod of its
DaemonSet: deploy/kubernetes, docs/fleet.md "Kubernetes")."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

from .placement import DEFAULT_MAX_SANDBOXES


class DnsNodes:
    """A listing of the fleet's nodes for :class:`Router` (called in a thread every half
    second): each address ``name`` resolves to is a node ``ADDRESS:PORT``, up, reached at
    ``http://ADDRESS:PORT`` with ``token`` (every node's: a DaemonSet's pods share one
    Secret), holding at most ``capacity`` sandboxes, and serving exposed ports on
    ``ADDRESS:ports_port`` when given (``lockbox serve --ports-listen``).

    An address that no longer resolves is a node that left: the router lists its sandboxes
    ``lost`` (a pod that is not ready leaves a headless Service's answer; when it is ready
    again, the router checks what it still holds). A name that does not exist (a headless
    Service without a ready pod) lists no node; a lookup that fails for now (no DNS server
    answered) raises, and the router keeps what it knew."""

    def __init__(self, name: str, port: int, token: str, *, capacity: int = DEFAULT_MAX_SANDBOXES,
                 ports_port: int | None = None, ports_domain: str = "localhost") -> None:
        if not name:
            raise ValueError("nodes_dns: a DNS name, not an empty one")
        if not 0 < port < 65536:
            raise ValueError(f"nodes_dns: port {port} is not 1-65535")
        if capacity < 1:
            raise ValueError(f"node_capacity: {capacity} is not a positive number of sandboxes")
        if not token:
            raise ValueError("the nodes' token is empty")
        self.name, self.port, self.token = name, port, token
        self.capacity, self.ports_port, self.ports_domain = capacity, ports_port, ports_domain

    def addresses(self) -> list[str]:
        """The addresses ``name`` resolves to now, sorted."""
        try:
            infos = socket.getaddrinfo(self.name, self.port, type=socket.SOCK_STREAM)
        except socket.gaierror as e:
            if e.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
                return []
            raise
        return sorted({str(info[4][0]) for info in infos}, key=lambda a: (ipaddress.ip_address(a).version,
                                                                         ipaddress.ip_address(a)))

    def __call__(self) -> list[dict[str, Any]]:
        nodes = []
        for address in self.addresses():
            host = f"[{address}]" if ":" in address else address
            node: dict[str, Any] = {"node_id": f"{host}:{self.port}", "state": "up", "url": f"http://{host}:{self.port}",
                                    "token": self.token, "labels": {},
                                    "max_sandboxes": self.capacity}
            if self.ports_port is not None:
                node["ports_url"] = f"http://{host}:{self.ports_port}"
                node["ports_domain"] = self.ports_domain
            nodes.append(node)
        return nodes
