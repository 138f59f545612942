"""Under an IPv4-only --net-allow, reach the host over IPv6 (its loopback and its own
address)."""
import errno
import socket
from lib import must_fail, must_work, connect, finish, env

allow, tcp6, tcp_any = int(env("ALLOW_TCP")), int(env("TCP6")), int(env("TCP_ANY"))
hostip6 = env("HOSTIP6")
V4, V6 = socket.AF_INET, socket.AF_INET6

must_work("127.0.0.2:ALLOW_TCP (the allowed pair)", lambda: connect(V4, ("127.0.0.2", allow)))
refused = (errno.ECONNREFUSED, errno.EADDRNOTAVAIL, errno.ENETUNREACH)
must_fail("[::1]", lambda: connect(V6, ("::1", tcp6)), *refused)
must_fail("[::1] on the allowed port", lambda: connect(V6, ("::1", allow)), *refused)
must_fail("[::] on the allowed port", lambda: connect(V6, ("::", allow)), *refused)
if hostip6:
    must_fail("the host's IPv6 address", lambda: connect(V6, (hostip6, tcp_any)), errno.EACCES)
must_fail("a public IPv6 address", lambda: connect(V6, ("2606:4700:4700::1111", 443)), errno.EACCES)
must_fail("link-local with a scope", lambda: connect(V6, ("fe80::1", allow, 0, 1)), errno.EACCES)
finish()
